"""Helpers for the health tests on the shared lab. These tests touch only gpu033..gpu064, give every
test its own state directory and config, and clear and resume every node they touched."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from opsctl.slurm import parse_sinfo
from tests.component.promlab import free_port

FAST = {"catalog": {"overrides": {
    "ib-down": {"hold": "10s"}, "ib-degraded": {"hold": "10s"}, "gpu-temp-high": {"hold": "15s"},
    "nvlink-errors-rising": {"hold": "20s"}, "pcie-replays": {"hold": "20s"}, "sbe-storm": {"hold": "20s"},
    "ib-errors": {"hold": "20s"}, "fabric-manager-down": {"hold": "10s"}, "fabric-not-ready": {"hold": "10s"},
    "clock-slowdown": {"hold": "15s"}, "pcie-downtrained": {"hold": "10s"}, "firmware-drift": {"hold": "10s"},
    # A rate of what `opsctl node check` writes when it runs (test_health_lab.py runs it every few seconds): its
    # window must hold more than one of those runs on a loaded machine, where one takes several seconds.
    "pcie-aer-rising": {"hold": "30s"}}}}


def node_check(lab, node: str, env: dict | None = None) -> tuple[int, dict]:
    """`opsctl node check --json` of a lab node with its own config (its sysfs, mounts and emulated tools),
    writing the textfile its node_exporter reads (forget_node_check removes it)."""
    node_dir = lab.lab_dir / "nodes" / node
    argv = [sys.executable, "-m", "opsctl", "node", "check", "--json", "--config", str(node_dir / "node-check.yaml"),
            "--textfile", str(node_check_textfile(lab, node))]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env or {**os.environ, **lab.env})
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def node_check_textfile(lab, node: str) -> Path:
    return lab.lab_dir / "nodes" / node / "textfile" / "node-check.prom"


def forget_node_check(lab, node: str) -> None:
    """Remove what node_check wrote for the node: `opsctl lab clear` ends its faults, not the results a node
    check wrote of them (only `lab reset` removes those), and with no timer here to write them again they
    would fail the node (or warn node-check-stale) for every later module, and count toward its breaker."""
    node_check_textfile(lab, node).unlink(missing_ok=True)


class HealthLab:
    def __init__(self, lab, tmp: Path, safety: dict | None = None, prometheus: str | None = None):
        self.lab = lab
        self.tmp = tmp
        self.config = tmp / "opsctl.yaml"
        raw = {"prometheus": {"url": prometheus or lab.prometheus_url, "scrape_interval": f"{lab.scrape_interval}s"},
               "slurm": {"backend": "cli"}, **FAST}
        if safety:
            raw["safety"] = safety
        # The lab's BMC (docs/lab.md), where it has one: the ladder's power cycle goes through it.
        bmc = yaml.safe_load((lab.lab_dir / "opsctl.yaml").read_text()).get("bmc")
        if bmc:
            raw["bmc"] = bmc
        self.state = tmp / "state"
        # The test's own state directory is its config's, as a cluster's is (actions refuse a private one).
        raw.update(state_dir=str(self.state), audit_log=str(self.state / "audit.jsonl"))
        self.config.write_text(yaml.safe_dump(raw))
        self.touched: set[str] = set()

    def env(self) -> dict:
        return {**os.environ, **self.lab.env, "OPSCTL_CONFIG": str(self.config), "OPSCTL_STATE_DIR": str(self.state)}

    def opsctl(self, *args, timeout=120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "opsctl", *args], capture_output=True, text=True,
                              timeout=timeout, env=self.env())

    def popen(self, *args) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "opsctl", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env())

    def node_check(self, node: str) -> tuple[int, dict]:
        """`opsctl node check` of one lab node, as its timer runs it on a real node: its exit code and JSON."""
        return node_check(self.lab, node, self.env())

    def health_json(self, *args) -> tuple[int, dict]:
        proc = self.opsctl("health", "--json", *args)
        assert proc.returncode in (0, 1, 4), proc.stderr
        data = json.loads(proc.stdout)
        return proc.returncode, {n["node"]: n for n in data["nodes"]} | {"_summary": data["summary"]}

    def wait_calm(self, timeout: float = 330.0) -> None:
        """Until a planning run over the whole lab (--drain --dry-run: the breaker counts the nodes that newly
        fail anywhere, not only in a run's --nodes) stops on no safety rail: an earlier module's fault on many
        nodes at once (a windowed XID count lasts the lab's 5 min window) would trip the breaker of a test
        that means to act on one node."""
        # A state directory and audit log of their own: a dry run's refusals are not the test's to read.
        calm = self.tmp / "calm"
        raw = yaml.safe_load(self.config.read_text())
        raw.update(state_dir=str(calm), audit_log=str(calm / "audit.jsonl"))
        config = self.tmp / "calm.yaml"
        config.write_text(yaml.safe_dump(raw))
        env = {**self.env(), "OPSCTL_CONFIG": str(config), "OPSCTL_STATE_DIR": str(calm)}
        deadline = time.monotonic() + timeout
        while True:
            proc = subprocess.run([sys.executable, "-m", "opsctl", "health", "--drain", "--dry-run", "--json"],
                                  capture_output=True, text=True, timeout=120, env=env)
            if proc.returncode in (0, 1) or time.monotonic() > deadline:
                break
            time.sleep(5)
        assert proc.returncode in (0, 1), f"the lab is not calm: exit {proc.returncode}: {proc.stderr[-2000:]}"

    def inject(self, node: str, fault: str, gpu=None, hca=None) -> None:
        self.inject_many([node], fault, gpu, hca)

    def inject_many(self, nodes: list[str], fault: str, gpu=None, hca=None) -> None:
        """The fault on each node, all at once (one `opsctl lab inject` per node, run side by side)."""
        assert all("gpu033" <= node <= "gpu064" for node in nodes), "health tests touch gpu033..gpu064 only"
        self.touched.update(nodes)
        device = (["--gpu", str(gpu)] if gpu is not None else []) + (["--hca", str(hca)] if hca is not None else [])
        self._all_at_once([["lab", "inject", node, fault, *device] for node in nodes])

    def _all_at_once(self, runs: list[list[str]]) -> None:
        procs = [self.popen(*argv) for argv in runs]
        for argv, proc in zip(runs, procs, strict=True):
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"{argv}: {err}"

    def scontrol(self, *args) -> None:
        self.lab.run("scontrol", *args)

    def slurm(self) -> dict:
        return parse_sinfo(self.lab.run("sinfo", "--json").stdout)

    def wait_statuses(self, scope: str, expected: dict, rules: dict | None = None, timeout: float = 120.0) -> dict:
        """Poll read-only runs until every node in `expected` shows its status (and the check in `rules`)."""
        deadline = time.monotonic() + timeout
        rules = rules or {}
        while True:
            try:
                _, nodes = self.health_json("--nodes", scope)
            except AssertionError as err:  # a Prometheus that has just started knows no target yet
                starting = "has no target of job" in str(err) or "has no `up` series at all" in str(err)
                if not starting or time.monotonic() > deadline:
                    raise
                time.sleep(1)
                continue
            got = {n: nodes[n]["status"] for n in expected}
            seen = all(any(c["id"] == rule for c in nodes[n]["checks"]) for n, rule in rules.items())
            if got == expected and seen:
                return nodes
            if time.monotonic() > deadline:
                raise AssertionError(f"verdicts did not settle: want {expected}, got {got}")
            time.sleep(3)

    def audit(self) -> list[dict]:
        path = self.state / "audit.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def cleanup(self) -> None:
        self._all_at_once([["lab", "clear", node] for node in sorted(self.touched)])
        for node in self.touched:
            forget_node_check(self.lab, node)
        nodes = self.slurm()
        out = [n for n in sorted(self.touched) if nodes[n].drained or nodes[n].state == "down"]  # or after a reboot
        if out:
            self.scontrol("update", f"nodename={','.join(out)}", "state=resume")


class LabVictoria:
    """Debian's VictoriaMetrics scraping the lab's own exporters with the lab's own prometheus.yml, beside
    the lab's Prometheus. Newest samples are visible at once and answers are not cached, so both judge
    the same scrapes."""

    def __init__(self, lab, tmp: Path):
        self.url = f"http://127.0.0.1:{free_port()}"
        self.proc = subprocess.Popen(
            ["victoria-metrics", f"-promscrape.config={lab.lab_dir / 'prometheus' / 'prometheus.yml'}",
             # Prometheus' own keys (evaluation_interval, refresh_interval) that VictoriaMetrics does not use.
             "-promscrape.config.strictParse=false", f"-storageDataPath={tmp / 'vm-data'}",
             f"-httpListenAddr={self.url.removeprefix('http://')}", "-search.latencyOffset=0s",
             "-search.disableCache", "-loggerLevel=ERROR"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    @staticmethod
    def available() -> bool:
        return shutil.which("victoria-metrics") is not None

    def wait_scraped(self, lab, node: str, timeout: float = 60) -> None:
        """Until VictoriaMetrics holds two scrapes of the node: a fault injected after it is one it saw
        begin (a counter's step from its old value), as Prometheus did."""
        def scraped() -> bool:
            try:
                result = lab.query(f'count_over_time(up{{node="{node}"}}[1m])', database=self.url)
            except OSError:
                return False
            return bool(result) and min(float(r["value"][1]) for r in result) >= 2

        lab.wait_until(scraped, timeout, f"VictoriaMetrics scraping {node} twice", interval=1)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)
