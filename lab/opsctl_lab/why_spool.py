"""The lab's stand-in for the head's opsctl-why.path unit (the opsctl role's systemd `DirectoryNotEmpty=`):
while EpilogSlurmctld's spool holds a job, run `opsctl why --spool` as opsctl-why.service does, one run at
a time, so that each job that did not end cleanly is explained, recorded and, when it opted in, requeued
without its culprit (docs/why.md, docs/recover.md).

    python3 -m opsctl_lab.why_spool --spool DIR [--wait 60] [--poll 1]
"""

import argparse
import os
import subprocess
import sys
import time


def has_entries(spool: str) -> bool:
    try:
        with os.scandir(spool) as entries:
            return any(True for _ in entries)
    except FileNotFoundError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="why_spool")
    parser.add_argument("--spool", required=True)
    parser.add_argument("--wait", type=float, default=60.0)
    parser.add_argument("--poll", type=float, default=1.0)
    args = parser.parse_args(argv)
    while True:
        if has_entries(args.spool):
            # Its lines go to this daemon's log, as the service's go to the journal.
            subprocess.run([sys.executable, "-m", "opsctl", "why", "--spool", args.spool, "--wait", f"{args.wait:g}"],
                           stdin=subprocess.DEVNULL, check=False)
        time.sleep(args.poll)


if __name__ == "__main__":
    sys.exit(main())
