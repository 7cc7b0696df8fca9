"""How `opsctl health` scales: 64, 4096 and 16384 simulated H200 nodes of 8 GPUs.

For each size this backfills a real Prometheus with 11 minutes of the series the health rules read
(`promtool tsdb create-blocks-from openmetrics`) and with the results of the catalog's recording rules
(opsctl.health.precomputed, as `opsctl rules export` writes them), starts a real slurmctld
that knows the nodes (and a real slurmd for the first RESUMABLE nodes, which opsctl drained for ib-down
and which are healthy again), runs `opsctl health --json --resume --dry-run` end to end on both paths,
and times the same PromQL queries sent directly, one after the other. One node in a hundred carries a
fault, so the verdict path does real work, and the resume candidates make opsctl ask for positive
evidence. Both paths must decide the same, or the bench stops.

Columns: e2e_s is the whole `opsctl health` process (start, Slurm, queries, verdicts, JSON) reading the
recorded rule results, e2e_direct_s the same with `prometheus.recording_rules: off` (every rule
queried, the fallback); in_opsctl_s and direct_q_s their time in queries (sent
`prometheus.parallel_queries` at a time); promql_s the direct path's queries sent one by one; plain_s the
rule queries as a bare `(expr) op threshold`, which hides NaN, one by one: the cost of reading NaN and
infinities as unknown; rules_s the time Prometheus takes to evaluate every recording rule once, one
after the other: the cost that moved into Prometheus, paid once per
recording interval however many runs read the results (each rule is a group of its own, so a head
node's cores share it); queries and
queries_d the number of queries of each path, which does not grow with the node count; resumes the
nodes it would resume.

The recorded results are written as blocks (Prometheus evaluates each recording rule once, the bench
writes the answer as the group would have every minute), so that the timings are opsctl's alone on this
machine's cores, not shared with a Prometheus that evaluates the rules at the same moment.

Run: .venv/bin/python bench/health_scale.py [--sizes 64,4096,16384] [--keep DIR]
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import requests

from opsctl.config import parse_config
from opsctl.health import precomputed
from opsctl.health.catalog import load_catalog
from opsctl.health.evaluate import presence_queries
from opsctl.health.identity import identity_query

GPU_METRICS = ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
               "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
               "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
               "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
               "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
               "DCGM_FI_DEV_XID_ERRORS"]
IB_METRICS = ["node_infiniband_state_id", "node_infiniband_rate_bytes_per_second",
              "node_infiniband_link_error_recovery_total", "node_infiniband_link_downed_total",
              "node_infiniband_port_errors_received_total"]
HCAS = [f"mlx5_{i}" for i in range(8)] + ["mlx5_bond_0"]
SPAN_S, STEP_S = 660, 60
# Samples also run this far past the time of writing, so that every query of a size (the last come
# after the preparation, the recording, both opsctl runs and the query timings: about 11 minutes at
# 16,384 nodes on 2 cores) reads whole windows. With 600 s, the direct run at 16,384 came after the
# end of the samples and decided differently from the recorded one.
AHEAD_S = 1500
# How often the recording groups are evaluated here: as often as the samples come.
RECORDING_INTERVAL_S = STEP_S
RESUMABLE = 4  # nodes drained by opsctl for ib-down whose ports are fine again


# Samples are a minute apart here (a real scrape is seconds): windows must span two of them.
SHORT_HOLDS = ("ib-down", "ib-degraded")


def node_names(n: int) -> list[str]:
    return [f"sim{i:04d}" for i in range(1, n + 1)]


def gpu_value(metric: str, faulty: bool, gpu: int) -> float:
    if metric == "DCGM_FI_DEV_GPU_TEMP":
        return 41.0 + gpu
    if metric == "DCGM_FI_DEV_ROW_REMAP_PENDING" and faulty and gpu == 0:
        return 1.0
    return 0.0


def ib_value(metric: str, faulty: bool, hca: str) -> float:
    if metric == "node_infiniband_state_id":
        return 1.0 if faulty and hca == "mlx5_3" else 4.0
    if metric == "node_infiniband_rate_bytes_per_second":
        return 2.5e10 if hca == "mlx5_bond_0" else 5e10
    return 0.0


def write_openmetrics(path: Path, nodes: list[str], end: int) -> int:
    """Every series with a sample each STEP_S up to `end`. Returns the number of series."""
    stamps = list(range(end - SPAN_S, end + AHEAD_S + 1, STEP_S))
    series = 0
    faulty = set(nodes[50::100])  # one in a hundred, none of them a resume candidate
    with path.open("w") as out:
        def family(name, rows):
            nonlocal series
            out.write(f"# TYPE {name} gauge\n")
            for labels, value in rows:
                series += 1
                out.write("".join(f"{name}{{{labels}}} {value} {t}\n" for t in stamps))
        family("up", [(f'job="{job}",instance="{n}:{port}",node="{n}"', 1)
                      for job, port in (("dcgm", 9400), ("node", 9100)) for n in nodes])
        dcgm = 'job="dcgm",instance="{n}:9400",node="{n}",Hostname="{n}"'
        for metric in GPU_METRICS:
            family(metric, [(dcgm.format(n=n) + f',gpu="{g}"', gpu_value(metric, n in faulty, g))
                            for n in nodes for g in range(8)])
        # dcgm-exporter with the windowed count exports it for every GPU: 0, or one series per XID seen.
        def xid(n: str, g: int) -> bool:
            return n in faulty and g == 2

        family("DCGM_EXP_XID_ERRORS_COUNT",
               [(dcgm.format(n=n) + f',gpu="{g}",window_size_in_ms="300000"' + (',xid="79"' if xid(n, g) else ""),
                 int(xid(n, g))) for n in nodes for g in range(8)])
        for metric in IB_METRICS:
            family(metric, [(f'job="node",instance="{n}:9100",node="{n}",device="{h}",port="1"',
                             ib_value(metric, n in faulty, h)) for n in nodes for h in HCAS])
        out.write("# EOF\n")
    return series


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"bench: timed out waiting for {what}")


class Slurm:
    """A real slurmctld (and munged) that knows the simulated nodes; no slurmd is needed to list them,
    but the RESUMABLE nodes run one each, so that they answer as a drained node that may be resumed."""

    def __init__(self, root: Path, nodes: int):
        self.root = root
        self.slurmds: list[subprocess.Popen] = []
        (root / "state").mkdir(parents=True)
        for index in range(1, RESUMABLE + 1):
            (root / "spool" / f"sim{index:04d}").mkdir(parents=True)
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.ctld = None
        self.munged = subprocess.Popen(["munged", "--foreground", "--force", f"--socket={root}/munge.socket",
                                        f"--key-file={key}", f"--pid-file={root}/munged.pid",
                                        f"--log-file={root}/munged.log", f"--seed-file={root}/munged.seed"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait(lambda: (root / "munge.socket").exists(), 10, "munged")
        self.conf = root / "slurm.conf"
        first = free_port()
        node = "NodeAddr=127.0.0.1 NodeHostname=localhost CPUs=224 RealMemory=2000000 State=UNKNOWN"
        self.conf.write_text(
            f"ClusterName=bench\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort={free_port()}\n"
            f"SlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\nAuthInfo=socket={root}/munge.socket\n"
            f"CredType=cred/munge\nStateSaveLocation={root}/state\nSlurmctldPidFile={root}/slurmctld.pid\n"
            f"SlurmctldLogFile={root}/slurmctld.log\nSlurmdSpoolDir={root}/spool/%n\n"
            f"SlurmdPidFile={root}/slurmd.%n.pid\nSlurmdLogFile={root}/slurmd.%n.log\n"
            f"SlurmdParameters=config_overrides\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            f"ReturnToService=2\nSelectType=select/cons_tres\n"
            f"NodeName=sim[0001-{RESUMABLE:04d}] Port=[{first}-{first + RESUMABLE - 1}] {node}\n"
            f"NodeName=sim[{RESUMABLE + 1:04d}-{nodes:04d}] Port=1 {node}\n"
            f"PartitionName=gpu Nodes=ALL Default=YES State=UP\n")
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.ctld = subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(self.conf)], env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait(lambda: subprocess.run(["sinfo", "-h"], env=self.env, capture_output=True).returncode == 0, 30,
                 "slurmctld")
            for index in range(1, RESUMABLE + 1):
                self.slurmds.append(subprocess.Popen(["slurmd", "-D", "-N", f"sim{index:04d}", "-f", str(self.conf)],
                                                     env=self.env, stdout=subprocess.DEVNULL,
                                                     stderr=subprocess.DEVNULL))
            resumable = f"sim[0001-{RESUMABLE:04d}]"
            wait(lambda: self.states(resumable) == {"idle"}, 60, "the slurmd nodes idle")
            subprocess.run(["scontrol", "update", f"nodename={resumable}", "state=drain",
                            "reason=opsctl:ib-down mlx5_3 state_id=1"], env=self.env, check=True)
        except BaseException:
            self.stop()
            raise

    def states(self, hostlist: str) -> set[str]:
        out = subprocess.run(["sinfo", "-h", "-N", "-n", hostlist, "-o", "%t"], env=self.env, capture_output=True,
                             text=True).stdout
        return set(out.split())

    def stop(self) -> None:
        for proc in (*self.slurmds, self.ctld, self.munged):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(20)


class Prometheus:
    def __init__(self, root: Path, blocks: Path):
        self.root = root
        shutil.copytree(blocks, root / "data")
        (root / "prometheus.yml").write_text("global:\n  scrape_interval: 1m\n")
        self.url = f"http://127.0.0.1:{free_port()}"
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(["prometheus", f"--config.file={self.root / 'prometheus.yml'}",
                                      f"--storage.tsdb.path={self.root / 'data'}",
                                      f"--web.listen-address={self.url[7:]}",
                                      "--storage.tsdb.retention.time=30d", "--log.level=error"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait(lambda: urllib.request.urlopen(f"{self.url}/-/ready", timeout=2).status == 200, 300, "prometheus")

    def record(self, groups: list[dict], at: int) -> float:
        """What the recording groups write, as a Prometheus evaluating them every RECORDING_INTERVAL_S would:
        each rule's expression is evaluated by this Prometheus at `at` (its answer, labelled as the group
        labels it), and the answer is written at every interval until AHEAD_S, with the heartbeat's value
        the time of each (the raw samples do not change, so neither would the answers). They go in as
        blocks, loaded by a restart: live evaluation cannot write here, the raw samples run into the future.
        Returns how long the evaluation of every rule took, one after the other: what Prometheus spends
        per recording interval (the groups run side by side, so a head node's cores share it)."""
        session = requests.Session()
        lines = [f"# TYPE {precomputed.RECORD} gauge\n"]
        took = 0.0
        for group in groups:
            rule = group["rules"][0]
            started = time.monotonic()
            resp = session.post(f"{self.url}/api/v1/query", data={"query": rule["expr"], "time": at}, timeout=600)
            resp.raise_for_status()
            took += time.monotonic() - started
            for item in resp.json()["data"]["result"]:
                labels = {k: v for k, v in item["metric"].items() if k != "__name__"} | rule["labels"]
                text = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
                beat = labels.get(precomputed.HEARTBEAT_LABEL) == "1"
                lines += [f"{precomputed.RECORD}{{{text}}} {t if beat else item['value'][1]} {t}\n"
                          for t in range(at, at + AHEAD_S + 1, RECORDING_INTERVAL_S)]
        (self.root / "recorded.om").write_text("".join(lines) + "# EOF\n")
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(self.root / "recorded.om"),
                        str(self.root / "data")], check=True, capture_output=True)
        self.stop()
        self.start()
        return took

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def raw_promql_seconds(url: str, exprs: list[str]) -> float:
    session = requests.Session()
    started = time.monotonic()
    for expr in exprs:
        resp = session.post(f"{url}/api/v1/query", data={"query": expr}, timeout=120)
        resp.raise_for_status()
    return time.monotonic() - started


def bench_size(n: int, work: Path) -> dict:
    root = work / f"n{n}"
    root.mkdir(parents=True)
    end = int(time.time()) - 5
    started = time.monotonic()
    series = write_openmetrics(root / "data.om", node_names(n), end)
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(root / "data.om"),
                    str(root / "blocks")],
                   check=True, capture_output=True)
    (root / "data.om").unlink()
    prep = time.monotonic() - started
    prom = Prometheus(root, root / "blocks")
    slurm = None
    try:
        slurm = Slurm(root / "slurm", n)
        # Samples are up to a minute apart here (scrapes would be seconds), so staleness allows more.
        raw_config = {"prometheus": {"url": prom.url, "stale_after": "5m", "timeout_seconds": 300,
                                     "scrape_interval": "1m",
                                     "recording_interval": f"{RECORDING_INTERVAL_S}s"},
                      "slurm": {"backend": "cli", "partitions": ["gpu"]},
                      "catalog": {"overrides": {rule: {"hold": "2m"} for rule in SHORT_HOLDS}},
                      "safety": {"resume_after": "0s", "unknown_max_fraction": 1.0}}
        env = {**slurm.env, "OPSCTL_STATE_DIR": str(root / "state")}
        parsed = parse_config(raw_config, "bench", env)
        rules = load_catalog(parsed)
        exprs = [*presence_queries(parsed), identity_query(parsed), *(rule.alert_expr() for rule in rules),
                 *(rule.expr for rule in rules if rule.id == "ib-down")]  # ib-down: the resume evidence
        rules_s = prom.record(precomputed.recording_groups(rules, parsed), int(time.time()))
        raw_promql_seconds(prom.url, exprs)  # warm the caches once, as a long-running cluster has them
        recorded, e2e = opsctl_health(root / "recorded.yaml", raw_config, env)
        direct_raw = {**raw_config, "prometheus": {**raw_config["prometheus"], "recording_rules": "off"}}
        direct, e2e_direct = opsctl_health(root / "direct.yaml", direct_raw, env)
        summary = recorded["summary"]
        if summary["rule_results"] != "precomputed":
            raise SystemExit(f"bench: the recorded rule results were not used: {summary['rule_results_note']}")
        if recorded["nodes"] != direct["nodes"]:
            differ = [(a, b) for a, b in zip(recorded["nodes"], direct["nodes"], strict=False) if a != b]
            raise SystemExit(f"bench: the recorded and the direct path decided differently "
                             f"({len(recorded['nodes'])} and {len(direct['nodes'])} nodes; first difference: "
                             f"{json.dumps(differ[:1])[:600]})")
        raw = raw_promql_seconds(prom.url, exprs)
        plain = raw_promql_seconds(prom.url, [f"({rule.expr}) {rule.op} {rule.threshold:g}" for rule in rules])
    finally:
        if slurm is not None:
            slurm.stop()
        prom.stop()
    return {"nodes": n, "gpus": 8 * n, "series": series, "e2e_s": e2e, "e2e_direct_s": e2e_direct,
            "opsctl_query_s": summary["query_seconds"], "direct_query_s": direct["summary"]["query_seconds"],
            "promql_s": raw, "plain_s": plain, "rules_s": rules_s,
            "queries": summary["queries"], "queries_direct": direct["summary"]["queries"], "fail": summary["fail"],
            "unknown": summary["unknown"], "resumes": summary["would_resume"], "prep_s": prep}


def opsctl_health(config: Path, raw_config: dict, env: dict) -> tuple[dict, float]:
    """One `opsctl health --json --resume --dry-run` process: its JSON and its wall time."""
    config.write_text(json.dumps(raw_config))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "opsctl", "health", "--json", "--resume", "--dry-run"],
                          env={**env, "OPSCTL_CONFIG": str(config)}, capture_output=True, text=True, timeout=900)
    took = time.monotonic() - started
    if proc.returncode not in (0, 1, 4):
        raise SystemExit(f"bench: opsctl health exited {proc.returncode}: {proc.stderr.strip()}")
    return json.loads(proc.stdout), took


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,4096,16384")
    parser.add_argument("--keep", default=None, help="Work directory to keep (default: a temporary one).")
    args = parser.parse_args(argv)
    for tool in ("prometheus", "promtool", "slurmctld", "munged", "sinfo"):
        if shutil.which(tool) is None:
            raise SystemExit(f"bench: {tool} is not installed (make deps-lab)")
    work = Path(args.keep or tempfile.mkdtemp(prefix="opsctl-bench-"))
    columns = [("nodes", "nodes", "d"), ("gpus", "gpus", "d"), ("series", "series", "d"), ("e2e_s", "e2e_s", ".2f"),
               ("e2e_direct_s", "e2e_direct_s", ".2f"), ("in_opsctl_s", "opsctl_query_s", ".2f"),
               ("direct_q_s", "direct_query_s", ".2f"), ("promql_s", "promql_s", ".2f"), ("plain_s", "plain_s", ".2f"),
               ("rules_s", "rules_s", ".2f"), ("queries", "queries", "d"),
               ("queries_d", "queries_direct", "d"), ("fail", "fail", "d"), ("resumes", "resumes", "d"),
               ("prep_s", "prep_s", ".1f")]
    sys.stdout.write(" ".join(f"{title:>{max(len(title), 6)}}" for title, _, _ in columns) + "\n")
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            row = bench_size(n, work)
            sys.stdout.write(" ".join(f"{row[key]:>{max(len(title), 6)}{fmt}}" for title, key, fmt in columns) + "\n")
            sys.stdout.flush()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
