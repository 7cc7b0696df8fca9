"""Emulated `lctl get_param`, `lctl ping` and `lctl list_nids` (Lustre) for the lab's Lustre client
(opsctl_lab.storage_view).

Output as lctl prints a parameter: `<param>=` on its own line, then the value; the value in the layout of
lprocfs_import_seq_show(), as in a real Lustre 2.12.7 client's read (tests/fixtures/lustre/
osc_import_idle_2.12.7.txt):

    osc.lustre-OST0002-osc-ffff8c8e3a1b5000.import=
    import:
        name: lustre-OST0002-osc-ffff8c8e3a1b5000
        target: lustre-OST0002_UUID
        state: DISCONN
        ...

Only `get_param` of `osc.*.import` and `mdc.*.import` (shell patterns) is emulated; any other parameter
fails as lctl does when no path matches.

`lctl ping <nid> [timeout]` as jt_ptl_ping() prints it (lustre-release lustre/utils/portals.c; real
answers in tests/fixtures/lustre/lctl_ping_success_and_failure.txt): the process ids that answered, the
local `12345-0@lo` first, or `failed to ping <nid>: Input/output error` on stderr and exit 1 (lctl exits
with the command's -1 negated). `lctl list_nids` prints the node's NIDs but the loopback.
"""

import fnmatch
import sys

from opsctl_lab.hwtools.common import load, main_guard
from opsctl_lab.storage_view import imports, lnet_nis, ping, server_nid

IMPORT = """import:
    name: {device}
    target: {target}_UUID
    state: {state}
    connect_flags: [ write_grant, server_lock, version, request_portal, truncate_lock, max_byte_per_rpc, \
early_lock_cancel, adaptive_timeouts, lru_resize, alt_checksum_algorithm, fid_is_enabled, version_recovery, \
grant_shrink, full20, layout_lock, 64bithash, object_max_bytes, jobstats, einprogress, grant_param, lvb_type, \
short_io, lfsck, bulk_mbits, second_flags, lockaheadv2 ]
    connect_data:
       flags: 0xa0425af2e3440478
       instance: 1
       target_version: 2.15.5.0
    import_flags: [ replayable, pingable, connect_tried ]
    connection:
       failover_nids: [ {nid} ]
       current_connection: {current}
       connection_attempts: {attempts}
       generation: 1
       in-progress_invalidations: 0
    rpcs:
       inflight: 0
       unregistering: 0
       timeouts: {timeouts}
       avg_waittime: 655 usec
    service_estimates:
       services: 1 sec
       network: 1 sec
"""


def main(argv: list[str]) -> int:
    if argv[:1] == ["ping"] and len(argv) in (2, 3):
        return _ping(argv[1])
    if argv == ["list_nids"]:
        sys.stdout.write("".join(f"{ni.nid}\n" for ni in lnet_nis(load()) if ni.net_type != "lo"))
        return 0
    if not argv or argv[0] != "get_param" or len(argv) < 2:
        sys.stderr.write("lctl (opsctl lab): only `lctl get_param osc.*.import mdc.*.import`, `lctl ping <nid> "
                         "[timeout]` and `lctl list_nids` are emulated\n")
        return 22
    hw = load()
    patterns = [a for a in argv[1:] if not a.startswith("-")]
    values_only = "-n" in argv[1:]
    rc = 0
    for pattern in patterns:
        found = [i for i in imports(hw) if fnmatch.fnmatchcase(i[0], pattern)]
        if not found:
            sys.stderr.write(f"error: get_param: param_path '{pattern.replace('.', '/')}': No such file or "
                             "directory\n")
            rc = 2
        for param, target, state in found:
            device = param.split(".", 1)[1].rsplit(".", 1)[0]
            nid = server_nid(target)
            down = state != "FULL"
            text = IMPORT.format(device=device, target=target, state=state, nid=nid, current="<none>" if down else nid,
                                 attempts=7 if down else 1, timeouts=3 if down else 0)
            sys.stdout.write(text if values_only else f"{param}=\n{text}")
    return rc


def _ping(nid: str) -> int:
    answered = ping(load(), nid)
    if answered is None:
        sys.stderr.write(f"failed to ping {nid}: Input/output error\n")
        return 1
    sys.stdout.write("".join(f"12345-{n}\n" for n in ["0@lo", *answered]))
    return 0


if __name__ == "__main__":
    sys.exit(main_guard(main))
