"""Healthy synchronous jobs on the simulated lab, for as long as you like: how often `opsctl job-health` names a
node that nothing is wrong with (docs/job-health.md, "False positives").

    opsctl lab up && opsctl lab reset
    .venv/bin/python bench/job_health_healthy.py --minutes 10 --jobs 2

It submits `--jobs` 8-node jobs of the lab's emulated ranks (`<lab>/bin/train`, lock-step) on gpu033.., lets
them run a window, then runs `opsctl job-health --json` (read-only) every `--every` seconds until the time is
up, and prints one table: evaluations, job answers, verdicts other than "ok" (each a false positive, as no
fault is injected) and the cost of a run. It cancels its jobs at the end. A measurement, never a test.
"""

import argparse
import json
import os
import subprocess
import sys
import time

NODES_PER_JOB = 8
FIRST_NODE = 33  # the lab's health tests' nodes, gpu033..gpu064


def lab_env() -> dict[str, str]:
    out = subprocess.run([sys.executable, "-m", "opsctl", "lab", "env"], capture_output=True, text=True,
                         check=True).stdout
    return {**os.environ, **dict(line.removeprefix("export ").split("=", 1) for line in out.splitlines())}


def run(env: dict[str, str], *argv: str) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, check=True, env=env, timeout=120).stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--every", type=float, default=30.0)
    parser.add_argument("--window", type=float, default=60.0, help="job_health.window of the lab's config")
    args = parser.parse_args()
    env = lab_env()
    train = f"{env['OPSCTL_LAB_DIR']}/bin/train"
    seconds = int(args.minutes * 60 + args.window + 120)
    jobs = []
    for index in range(args.jobs):
        first = FIRST_NODE + index * NODES_PER_JOB
        nodes = f"gpu[{first:03d}-{first + NODES_PER_JOB - 1:03d}]"
        jobs.append(run(env, "sbatch", "--parsable", "-N", str(NODES_PER_JOB), "-w", nodes, "--exclusive", "-o",
                        "/dev/null", "-D", "/tmp", "--wrap", f"srun {train} --seconds {seconds}").strip())
    evaluations = answers = queries = 0
    named: list[str] = []
    spent: list[float] = []
    try:
        time.sleep(args.window + 15)  # a whole window of the jobs' own scrapes
        end = time.monotonic() + args.minutes * 60
        while time.monotonic() < end:
            started = time.monotonic()
            doc = json.loads(run(env, sys.executable, "-m", "opsctl", "job-health", "--json"))
            spent.append(time.monotonic() - started)
            evaluations += 1
            queries = doc["queries"]
            for job in doc["jobs"]:
                if job["job"]["id"] not in jobs:
                    continue
                answers += 1
                if job["verdict"] != "ok":
                    named.append(f"{job['job']['id']} {job['verdict']} {','.join(job['nodes_named'])}")
            time.sleep(max(0.0, args.every - (time.monotonic() - started)))
    finally:
        subprocess.run(["scancel", *jobs], env=env, check=False)
    median = sorted(spent)[len(spent) // 2] if spent else 0.0
    lines = ["| minutes | jobs | nodes | evaluations | job answers | false positives | queries/run | s/run (median) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|",
             f"| {args.minutes:g} | {args.jobs} | {args.jobs * NODES_PER_JOB} | {evaluations} | {answers} | "
             f"{len(named)} | {queries} | {median:.2f} |"]
    lines += [f"false positive: job {line}" for line in named]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
