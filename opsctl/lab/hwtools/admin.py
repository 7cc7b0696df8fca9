"""`opsctl-hw`: the lab's hand on a machine's emulated hardware (what `opsctl lab machines inject`
runs over SSH). Changes the state file and rewrites the sysfs tree at once, so every tool (and the
dcgm-exporter service, which re-reads the file) reports the fault.

    opsctl-hw inject FAULT [--gpu G | --hca H]
    opsctl-hw clear
    opsctl-hw sysfs          # write the sysfs tree from the state (boot-time service)
    opsctl-hw show           # the state file
"""

import argparse
import fcntl
import json
import sys
from contextlib import contextmanager
from dataclasses import asdict

from opsctl.lab.hwtools.common import fresh_sysfs, load, main_guard, state_path


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
    sub.add_parser("sysfs")
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
        fresh_sysfs(hw)
    return 0


if __name__ == "__main__":
    sys.exit(main_guard(main))
