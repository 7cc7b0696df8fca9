"""How `opsctl job-health` scales: 100 running jobs over 4,096 simulated H200 nodes of 8 GPUs (and a small size).

For each size this backfills a real Prometheus (`promtool tsdb create-blocks-from openmetrics`, with
bench/health_scale.py's Prometheus and its sample grid: a sample a minute from SPAN_S before the time of
writing to AHEAD_S after it, so that every query of the size reads whole windows) with the series the
job-health signals read (opsctl/jobhealth/signals.py): per GPU its utilisation, SM clock, power, graphics
engine activity, clock event reasons and NVLink counter, per HCA its InfiniBand byte counters, `up`, and the
GPU temperature that names a dcgm target (the identity query). The nodes are split into running jobs; in the
first job one GPU is slow (SM clock 1200 MHz, SW_POWER_CAP, its node at full power while its peers wait at
200 W), in the second one rank hangs (its GPUs idle, no traffic on any node of the job), the others compute
alike with the jitter of healthy nodes. The evaluation (opsctl.jobhealth.run.evaluate, over HTTP to that
Prometheus) must name exactly those two nodes, or the bench stops.

Slurm is not part of it: the jobs are handed in, as one `squeue` would list them (one call per run, whatever
the size). Samples are a minute apart here (a scrape is seconds), so the window is 2m: two samples a rate.

Columns: nodes, jobs, series written, queries of one evaluation (the same at every size), seconds of one
evaluation (the median of RUNS; its queries sent prometheus.parallel_queries at a time, then the verdicts),
judge_s the verdicts alone (in opsctl, after the answers), prep_s writing and loading the blocks.

Run: .venv/bin/python bench/job_health_scale.py [--sizes 64,4096] [--jobs 100] [--keep DIR]
"""

import argparse
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# bench/health_scale.py's Prometheus, its waits and its sample grid: this file runs beside it.
from health_scale import AHEAD_S, HCAS, SPAN_S, STEP_S, Prometheus, node_names

from opsctl.config import parse_config
from opsctl.jobhealth.run import evaluate
from opsctl.jobhealth.verdict import HUNG, OK, SLOW, judge
from opsctl.prom.client import PromClientImpl
from opsctl.slurm.base import RunningJob

RUNS = 3
GPUS = 8
RAILS = [hca for hca in HCAS if hca != "mlx5_bond_0"]
SLOW_GPU = 3


def jobs_of(nodes: list[str], count: int, now: float) -> list[RunningJob]:
    """`count` jobs of equal size over the nodes, each started ten minutes ago."""
    size = len(nodes) // count
    return [RunningJob(str(100_000 + j), f"train-{j}", "bench", tuple(nodes[j * size:(j + 1) * size]), now - 600)
            for j in range(count)]


def write_openmetrics(path: Path, jobs: list[RunningJob], end: int) -> tuple[int, str, str]:
    """Every series, a sample each STEP_S; returns the number of series and the slow and the hung node."""
    stamps = list(range(end - SPAN_S, end + AHEAD_S + 1, STEP_S))
    slow_job, hung_job = jobs[0], jobs[1]
    slow_node, hung_node = slow_job.nodes[len(slow_job.nodes) // 2], hung_job.nodes[1]
    rng = random.Random(7)
    series = 0
    nodes = [n for job in jobs for n in job.nodes]
    with path.open("w") as out:
        def family(name: str, kind: str, rows) -> None:
            nonlocal series
            out.write(f"# TYPE {name} {kind}\n")
            for labels, value in rows:
                series += 1
                if isinstance(value, tuple):  # a counter: its start and rate per second
                    start, rate = value
                    out.write("".join(f"{name}{{{labels}}} {start + rate * (t - stamps[0]):.1f} {t}\n" for t in stamps))
                else:
                    out.write("".join(f"{name}{{{labels}}} {value} {t}\n" for t in stamps))

        family("up", "gauge", [(f'job="{job}",instance="{n}:{port}",node="{n}"', 1)
                               for job, port in (("dcgm", 9400), ("node", 9100)) for n in nodes])
        dcgm = 'job="dcgm",instance="{n}:9400",node="{n}",Hostname="{n}",gpu="{g}",modelName="NVIDIA H200"'
        hung = set(hung_job.nodes)
        waiting = set(slow_job.nodes) - {slow_node}  # the slow node's peers wait for it at low power

        def gpu(n: str, g: int, metric: str):
            idle = n == hung_node
            slow = n == slow_node and g == SLOW_GPU
            if metric == "DCGM_FI_DEV_GPU_UTIL":
                return 0 if idle else 100 - rng.choice((0, 0, 1, 2))
            if metric == "DCGM_FI_DEV_SM_CLOCK":
                return 1200 if slow else (210 if idle else rng.choice((1980, 1980, 1965)))
            if metric == "DCGM_FI_DEV_POWER_USAGE":
                return 90.0 if idle else (200.0 + rng.random() * 20 if n in waiting or n in hung
                                          else 640.0 + rng.random() * 50)
            if metric == "DCGM_FI_PROF_GR_ENGINE_ACTIVE":
                return 0.0 if idle else round(0.88 + rng.random() * 0.04, 3)
            if metric == "DCGM_FI_DEV_CLOCKS_EVENT_REASONS":
                return 0x4 if slow else (0x1 if idle else 0)
            if metric == "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL":
                return (1e9, 0.0 if n in hung else 3e5)
            return 35 + g  # DCGM_FI_DEV_GPU_TEMP: what names a dcgm target
        for metric, kind in (("DCGM_FI_DEV_GPU_TEMP", "gauge"), ("DCGM_FI_DEV_GPU_UTIL", "gauge"),
                             ("DCGM_FI_DEV_SM_CLOCK", "gauge"), ("DCGM_FI_DEV_POWER_USAGE", "gauge"),
                             ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge"), ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge"),
                             ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter")):
            family(metric, kind, [(dcgm.format(n=n, g=g), gpu(n, g, metric)) for n in nodes for g in range(GPUS)])
        ib = 'job="node",instance="{n}:9100",node="{n}",device="{h}",port="1"'
        for metric in ("node_infiniband_port_data_transmitted_bytes_total",
                       "node_infiniband_port_data_received_bytes_total"):
            family(metric, "counter", [(ib.format(n=n, h=h), (1e12, 0.0 if n in hung else
                                                               (2e9 if h in RAILS else 1e5)))
                                       for n in nodes for h in HCAS])
        out.write("# EOF\n")
    return series, slow_node, hung_node


def bench_size(n: int, count: int, work: Path) -> dict:
    root = work / f"n{n}"
    root.mkdir(parents=True)
    end = int(time.time()) - 5
    jobs = jobs_of(node_names(n), count, end)
    started = time.monotonic()
    series, slow_node, hung_node = write_openmetrics(root / "data.om", jobs, end)
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(root / "data.om"),
                    str(root / "blocks")], check=True, capture_output=True)
    (root / "data.om").unlink()
    prep = time.monotonic() - started
    prom = Prometheus(root, root / "blocks")
    try:
        config = parse_config({"prometheus": {"url": prom.url, "scrape_interval": "1m", "timeout_seconds": 300},
                               "job_health": {"window": "2m"}}, "bench", {})
        took: list[float] = []
        judged, queries = [], 0
        for _ in range(RUNS):
            client = PromClientImpl.from_config(config.prometheus)
            now = time.time()
            begun = time.monotonic()
            judged, queries = evaluate(config, client, jobs, now)
            took.append(time.monotonic() - begun)
        # The verdicts alone, from the values the last run read: what the run spends after its answers.
        begun = time.monotonic()
        values = {n: own for h in judged for n, own in h.values.items()}
        for job in jobs:
            judge(job, values, time.time(), config.job_health)
        judge_s = time.monotonic() - begun
    finally:
        prom.stop()
    named = {(h.verdict, tuple(h.named())) for h in judged if h.verdict != OK}
    if named != {(SLOW, (slow_node,)), (HUNG, (hung_node,))}:
        raise SystemExit(f"bench: expected {slow_node} slow and {hung_node} hung, got {sorted(named)}")
    if any(h.no_data for h in judged):
        raise SystemExit("bench: a node without data: the series do not cover the window")
    return {"nodes": n, "jobs": count, "series": series, "queries": queries, "seconds": statistics.median(took),
            "judge_s": judge_s, "prep_s": prep}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,4096")
    parser.add_argument("--jobs", type=int, default=100, help="Running jobs at the largest size (fewer where "
                        "the nodes would not give each job four).")
    parser.add_argument("--keep", default=None, help="Work directory to keep (default: a temporary one).")
    args = parser.parse_args(argv)
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            raise SystemExit(f"bench: {tool} is not installed (make deps-lab)")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="opsctl-job-health-bench-"))
    rows = []
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            rows.append(bench_size(size, max(2, min(args.jobs, size // 4)), work))
            row = rows[-1]
            sys.stderr.write(f"{row['nodes']:>6} nodes {row['jobs']:>4} jobs {row['series']:>8} series: "
                             f"{row['queries']} queries, {row['seconds']:.2f} s\n")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    sys.stdout.write(f"{'nodes':>6} {'jobs':>5} {'series':>9} {'queries':>8} {'seconds':>8} {'judge_s':>8} "
                     f"{'prep_s':>7}\n")
    for row in rows:
        sys.stdout.write(f"{row['nodes']:>6} {row['jobs']:>5} {row['series']:>9} {row['queries']:>8} "
                         f"{row['seconds']:>8.2f} {row['judge_s']:>8.3f} {row['prep_s']:>7.0f}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
