"""`opsctl-hw`: the lab's hand on a machine's emulated hardware (what `opsctl lab machines inject`
runs over SSH). Changes the state file and rewrites the sysfs tree at once, so every tool (and the
dcgm-exporter service, which re-reads the file) reports the fault.

    opsctl-hw inject FAULT [--gpu G | --hca H]
    opsctl-hw clear
    opsctl-hw sysfs [--link-host]   # write the sysfs tree from the state (boot-time service)
    opsctl-hw show           # the state file
"""

import argparse
import fcntl
import json
import sys
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from opsctl_lab.hwtools.common import fresh_sysfs, load, main_guard, state_path


@contextmanager
def _locked():
    path = state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="opsctl-hw")
    sub = parser.add_subparsers(dest="cmd", required=True)
    inj = sub.add_parser("inject")
    inj.add_argument("fault")
    inj.add_argument("--gpu", type=int)
    inj.add_argument("--hca")
    sub.add_parser("clear")
    sysfs = sub.add_parser("sysfs")
    sysfs.add_argument("--link-host", action="store_true")
    sub.add_parser("show")
    args = parser.parse_args(argv)
    with _locked():
        hw = load()
        if args.cmd == "inject":
            fault = hw.inject(args.fault, gpu=args.gpu, hca=args.hca)
            hw.save(state_path())
            where = f" gpu {fault.gpu}" if fault.gpu is not None else f" {fault.hca}" if fault.hca else ""
            sys.stdout.write(f"{hw.node}: injected {args.fault}{where}\n")
        elif args.cmd == "clear":
            count = len(hw.active)
            hw.clear()
            hw.save(state_path())
            sys.stdout.write(f"{hw.node}: cleared {count} fault(s)\n")
        elif args.cmd == "show":
            sys.stdout.write(json.dumps(asdict(hw), indent=1, sort_keys=True) + "\n")
        root = fresh_sysfs(hw)
        if args.cmd == "sysfs" and args.link_host:
            link_host_sysfs(root)
    return 0


def link_host_sysfs(root: Path, host: Path = Path("/sys")) -> None:
    """Make the emulated tree a whole sysfs for node_exporter --path.sysfs: everything but
    class/infiniband links to the machine's real /sys, so the other collectors still see it."""
    for entry in host.iterdir():
        if entry.name != "class":
            _link(root / entry.name, entry)
    for entry in (host / "class").iterdir():
        if entry.name != "infiniband":
            _link(root / "class" / entry.name, entry)


def _link(path: Path, target: Path) -> None:
    if not path.is_symlink() and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)


if __name__ == "__main__":
    sys.exit(main_guard(main))
