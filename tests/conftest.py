"""Shared fixtures. The simulated cluster is started once per test session (`opsctl lab up`) and
is left running for the session; tests that inject faults clear them again."""

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
OPSCTL = [sys.executable, "-m", "opsctl"]


def opsctl(*args, env=None, check=True, timeout=180) -> subprocess.CompletedProcess:
    proc = subprocess.run([*OPSCTL, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"opsctl {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


@dataclass
class Lab:
    env: dict
    lab_dir: Path
    nodes: int
    scrape_interval: int
    prometheus_url: str

    def query(self, promql: str) -> list:
        url = f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def nodes_matching(self, promql: str) -> set:
        return {series["metric"].get("node") for series in self.query(promql)}

    def run(self, *argv, check=True) -> subprocess.CompletedProcess:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, env={**os.environ, **self.env})
        if check and proc.returncode != 0:
            raise AssertionError(f"{argv} exited {proc.returncode}: {proc.stderr}")
        return proc

    def sinfo_states(self) -> dict:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t").stdout
        return dict(line.split() for line in out.splitlines())

    def wait_until(self, check, timeout: float, what: str, interval: float = 0.5):
        deadline = time.monotonic() + timeout
        while True:
            result = check()
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(interval)


def _lab_available() -> str | None:
    if os.geteuid() != 0:
        return "the lab needs root"
    for prog in ("slurmctld", "slurmd", "munged", "prometheus", "prometheus-node-exporter"):
        if shutil.which(prog) is None:
            return f"{prog} is not installed (make deps-lab)"
    return None


@pytest.fixture(scope="session")
def lab() -> Lab:
    reason = _lab_available()
    if reason:
        pytest.skip(reason)
    opsctl("lab", "up", timeout=300)
    env = dict(line.removeprefix("export ").split("=", 1) for line in opsctl("lab", "env").stdout.splitlines())
    state = json.loads((Path(env["OPSCTL_LAB_DIR"]) / "lab.json").read_text())
    return Lab(env=env, lab_dir=Path(env["OPSCTL_LAB_DIR"]), nodes=state["nodes"],
               scrape_interval=state["scrape_interval"], prometheus_url="http://127.0.0.1:19090")
