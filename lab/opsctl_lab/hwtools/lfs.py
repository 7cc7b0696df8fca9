"""Emulated `lfs check servers|osts|mdts|all` (Lustre) for the lab's Lustre client
(opsctl_lab.storage_view), as lfs_check() and llapi_target_check() print it (lustre-release
lustre/utils/lfs.c and liblustreapi.c; real lines in tests/fixtures/lustre/lfs_check_servers_*.txt):

    lustre-MDT0000-mdc-ffff8c8e3a1b5000 active.                                         (stdout)
    lfs check: error: check 'lustre-OST0002-osc-ffff8c8e3a1b5000': Transport endpoint is not connected (107)
                                                                                          (stderr)

A failed target does not change the exit code (the per-target check returns nothing), so it is 0.
"""

import sys

from opsctl_lab.hwtools.common import load, main_guard
from opsctl_lab.storage_view import imports

KINDS = {"servers": ("mdc", "osc"), "all": ("mdc", "osc"), "osts": ("osc",), "mdts": ("mdc",)}


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "check" or argv[1] not in KINDS:
        sys.stderr.write("lfs (opsctl lab): only `lfs check servers|osts|mdts|all` is emulated\n")
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


if __name__ == "__main__":
    sys.exit(main_guard(main))
