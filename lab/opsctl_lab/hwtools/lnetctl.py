"""Emulated `lnetctl net show [-v]` and `lnetctl stats show` (Lustre's LNet) for the lab's Lustre client
(opsctl_lab.storage_view), in the YAML that lnetctl prints (lustre-release lnet/utils/lnetctl.c and
lnetconfig/liblnetconfig.c; real output in tests/fixtures/lustre/lnetctl_*.txt):

    net:
        - net type: o2ib
          local NI(s):
            - nid: 10.10.1.44@o2ib
              status: up
              interfaces:
                  0: bond0

`-v` adds each NI's statistics, message counts, health and tunables, laid out as in the real capture
(the loopback has no interfaces and no LND tunables). The `lnet-down` fault sets the o2ib NI's status to
down; LNet keeps the NI configured, so it is still listed.
"""

import sys

from opsctl_lab.hardware import NodeHardware, stable_int
from opsctl_lab.hwtools.common import load, main_guard
from opsctl_lab.storage_view import LabNi, lnet_nis, lnet_stats

KINDS = ("put", "get", "reply", "ack", "hello")


def _ni_details(hw: NodeHardware, ni: LabNi) -> list[str]:
    """The -v part of one NI, indented under its `- nid:` line."""
    sent = 100_000 + stable_int(hw.node, ni.nid, "sent", modulo=400_000)
    drops = stable_int(hw.node, ni.nid, "drops", modulo=5)
    lo = ni.net_type == "lo"
    lines = ["statistics:", f"    send_count: {sent}", f"    recv_count: {sent - drops}", f"    drop_count: {drops}"]
    for title, counts in (("sent_stats", {"put": sent}), ("received_stats", {"put": sent - drops}),
                          ("dropped_stats", {"put": drops})):
        lines += [f"{title}:"] + [f"    {kind}: {counts.get(kind, 0)}" for kind in KINDS]
    lines += ["health stats:", "    fatal_error: 0", "    health value: 1000", "    interrupts: 0",
              "    dropped: 0", "    aborted: 0", "    no route: 0", "    timeouts: 0", "    error: 0",
              "tunables:", f"    peer_timeout: {0 if lo else 180}", f"    peer_credits: {0 if lo else 32}",
              "    peer_buffer_credits: 0", f"    credits: {0 if lo else 256}", "lnd tunables:"]
    if not lo:  # o2iblnd's tunables, in liblnetconfig_lnd.c's order
        lines += ["    peercredits_hiw: 16", "    map_on_demand: 1", "    concurrent_sends: 64",
                  "    fmr_pool_size: 512", "    fmr_flush_trigger: 384", "    fmr_cache: 1", "    ntx: 512",
                  "    conns_per_peer: 1"]
    lines += ["dev cpt: 0", 'CPT: "[0,1]"']
    return lines


def net_show(hw: NodeHardware, verbose: bool) -> str:
    out = ["net:"]
    for ni in lnet_nis(hw):
        out += [f"    - net type: {ni.net_type}", "      local NI(s):", f"        - nid: {ni.nid}",
                f"          status: {ni.status}"]
        if ni.interfaces:
            out += ["          interfaces:"] + [f"              {i}: {name}" for i, name in enumerate(ni.interfaces)]
        if verbose:
            out += [f"          {line}" for line in _ni_details(hw, ni)]
    return "\n".join(out) + "\n"


def stats_show(hw: NodeHardware) -> str:
    return "statistics:\n" + "".join(f"    {key}: {value}\n" for key, value in lnet_stats(hw).items())


def main(argv: list[str]) -> int:
    if argv[:2] == ["net", "show"] and all(a in ("-v", "--verbose") or a.isdigit() for a in argv[2:]):
        sys.stdout.write(net_show(load(), verbose=bool(argv[2:])))
        return 0
    if argv == ["stats", "show"]:
        sys.stdout.write(stats_show(load()))
        return 0
    sys.stderr.write("lnetctl (opsctl lab): only `lnetctl net show [-v]` and `lnetctl stats show` are emulated\n")
    return 22


if __name__ == "__main__":
    sys.exit(main_guard(main))
