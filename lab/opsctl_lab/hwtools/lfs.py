"""Emulated `lfs check servers|osts|mdts|all` and `lfs df [-v] [path]` (Lustre) for the lab's Lustre
client (opsctl_lab.storage_view).

`lfs check` as lfs_check() and llapi_target_check() print it (lustre-release lustre/utils/lfs.c and
liblustreapi.c; real lines in tests/fixtures/lustre/lfs_check_servers_*.txt):

    lustre-MDT0000-mdc-ffff8c8e3a1b5000 active.                                         (stdout)
    lfs check: error: check 'lustre-OST0002-osc-ffff8c8e3a1b5000': Transport endpoint is not connected (107)
                                                                                          (stderr)

A failed target does not change the exit code (the per-target check returns nothing), so it is 0.

`lfs df` as showdf() and mntdf() of Lustre 2.15 print it (lfs.c at tag v2_15_0; a real capture in
tests/fixtures/lustre/lfs_df_exascaler_cloud_24_osts.txt): printf's "%-20s %11s %11s %11s %4s %s" per
target, with "[OST:<index>]" and, with -v, its state flags; a target the client marked inactive (its
import lost, `lustre-ost-down`) is left out, or with -v printed as "%-20s: inactive device" with the name
lfs makes up for it (OST0002); then a blank line, the summary of the OSTs that answered, a blank line.
Lustre 2.17 prints two spaces before the mount point; opsctl reads both.
"""

import sys

from opsctl_lab.hwtools.common import load, main_guard
from opsctl_lab.storage_view import MOUNTS, df, imports

KINDS = {"servers": ("mdc", "osc"), "all": ("mdc", "osc"), "osts": ("osc",), "mdts": ("mdc",)}


def main(argv: list[str]) -> int:
    if argv[:1] == ["df"] and all(a in ("-v", "--verbose") or a.startswith("/") for a in argv[1:]):
        paths = [a for a in argv[1:] if a.startswith("/")]
        return _df(verbose=any(a in ("-v", "--verbose") for a in argv[1:]), path=paths[0] if paths else None)
    if len(argv) < 2 or argv[0] != "check" or argv[1] not in KINDS:
        sys.stderr.write("lfs (opsctl lab): only `lfs check servers|osts|mdts|all` and `lfs df [-v] [path]` are "
                         "emulated\n")
        return 22
    hw = load()
    listed = sorted(imports(hw), key=lambda i: (i[0].split(".")[0] != "mdc", i[1]))
    for param, _target, state in listed:
        kind, device = param.split(".", 1)[0], param.split(".", 1)[1].rsplit(".", 1)[0]
        if kind not in KINDS[argv[1]]:
            continue
        if state == "FULL":
            sys.stdout.write(f"{device} active.\n")
        else:
            sys.stdout.flush()
            sys.stderr.write(f"lfs check: error: check '{device}': Transport endpoint is not connected (107)\n")
    return 0


def _ratio(used: int, available: int) -> int:
    """obd_statfs_ratio(): the used share in percent, rounded up as df(1) does."""
    return -(-used * 100 // (used + available)) if used + available else 0


def _row(uuid: object, blocks: object, used: object, available: object, percent: str, mount: str) -> str:
    """printf(UUF" "CSF" "CSF" "CSF" "RSF" %-s"): "%-20s %11s %11s %11s %4s %s"."""
    return f"{uuid:<20} {blocks:>11} {used:>11} {available:>11} {percent:>4} {mount}"


def _usage(uuid: str, blocks: int, used: int, available: int, mount: str) -> str:
    return _row(uuid, blocks, used, available, f"{_ratio(used, available):3d}%", mount)


def _df(verbose: bool, path: str | None) -> int:
    # The lab's client mounts one Lustre filesystem. A path given is taken for its mount point (the simulated
    # lab's mount points are directories under the node's own directory).
    mount = path or next(m.point for m in MOUNTS if m.fstype == "lustre")
    lines = [_row("UUID", "1K-blocks", "Used", "Available", "Use%", "Mounted on")]
    total = used = available = 0
    for target in df(load()):
        if not target.active:
            if verbose:
                lines.append(f"{target.kind}{target.index:04x}".ljust(20) + ": inactive device")
            continue
        row = _usage(f"{target.target}_UUID", target.blocks_kb, target.used_kb, target.available_kb, mount)
        lines.append(row + f"[{target.kind}:{target.index}]" + (f" {target.flags}" if verbose and target.flags else ""))
        if target.kind == "OST":  # with OSTs present, the summary leaves the MDTs' blocks out
            total, used, available = total + target.blocks_kb, used + target.used_kb, available + target.available_kb
    lines += ["", _usage("filesystem_summary:", total, used, available, mount), ""]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main_guard(main))
