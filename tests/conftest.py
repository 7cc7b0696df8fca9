"""Shared fixtures and the test tiers.

Tiers (README, "Tests"): every test is in exactly one of unit, component, lab, machines, provision.
The directory decides for tests/unit and tests/component; tests/integration marks each test. A unit
test that starts a process or opens a socket fails. At the end of a run, each tier's wall time is
printed, so a slow tier is seen.

The simulated cluster is started once per test session (`opsctl lab up`) and is left running for
the session; tests that inject faults clear them again.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
OPSCTL = [sys.executable, "-m", "opsctl"]


def opsctl(*args, env=None, check=True, timeout=180) -> subprocess.CompletedProcess:
    proc = subprocess.run([*OPSCTL, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"opsctl {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


TIERS = ("unit", "component", "lab", "machines", "provision")
_TIER_SECONDS: dict[str, float] = {}


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = Path(str(item.fspath)).relative_to(REPO / "tests").parts
        if parts[0] in ("unit", "component"):
            item.add_marker(getattr(pytest.mark, parts[0]))
        tiers = [m.name for m in item.iter_markers() if m.name in TIERS]
        if len(set(tiers)) != 1:
            raise pytest.UsageError(f"{item.nodeid}: needs exactly one tier marker of {TIERS}, has {tiers}")


def _tier(item) -> str:
    return next(m.name for m in item.iter_markers() if m.name in TIERS)


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise AssertionError(f"a unit test must not {what}: move it to tests/component (README, Tests)")

    return refuse


@pytest.fixture(autouse=True)
def _unit_tests_are_pure(request, monkeypatch):
    """Unit tests run no program and open no socket: the tier's promise, checked on every unit test."""
    if _tier(request.node) != "unit":
        return
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse("start a process"))
    monkeypatch.setattr(os, "posix_spawn", _refuse("start a process"))
    monkeypatch.setattr(os, "fork", _refuse("fork"))
    for method in ("connect", "connect_ex", "bind"):
        monkeypatch.setattr(socket.socket, method, _refuse("open a socket"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    started = time.monotonic()
    try:
        return (yield)
    finally:
        tier = _tier(item)
        _TIER_SECONDS[tier] = _TIER_SECONDS.get(tier, 0.0) + time.monotonic() - started


def pytest_terminal_summary(terminalreporter):
    if _TIER_SECONDS:
        terminalreporter.section("wall time per tier")
        if os.environ.get("OPSCTL_LINT_SECONDS"):  # `make test` runs `make lint` first
            terminalreporter.write_line(f"{'lint':10} {float(os.environ['OPSCTL_LINT_SECONDS']):7.1f} s")
        for tier in TIERS:
            if tier in _TIER_SECONDS:
                terminalreporter.write_line(f"{tier:10} {_TIER_SECONDS[tier]:7.1f} s")


@dataclass
class Lab:
    env: dict
    lab_dir: Path
    nodes: int
    scrape_interval: int
    prometheus_url: str

    def address(self, node: str) -> str:
        """The loopback address of a lab node's exporters (opsctl_lab.paths.node_address)."""
        index = int(node.removeprefix("gpu")) - 1
        slot = int(self.env.get("OPSCTL_LAB_SLOT", 0))
        return f"127.{10 + slot}.{index // 250}.{index % 250 + 1}"

    def query(self, promql: str, database: str | None = None) -> list:
        """An instant query of the lab's Prometheus, or of another database given by its base URL."""
        url = f"{database or self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
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
        return wait_until(check, timeout, what, interval)


def wait_until(check, timeout: float, what: str, interval: float = 0.5):
    """check()'s first true answer, asked every `interval` seconds; AssertionError naming `what` after `timeout`."""
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
    # A lab keeps its faults, drains and opsctl state across `down` and `up` (an earlier session that
    # stopped halfway leaves them): every session starts from a clean one.
    opsctl("lab", "reset", timeout=300)
    env = dict(line.removeprefix("export ").split("=", 1) for line in opsctl("lab", "env").stdout.splitlines())
    state = json.loads((Path(env["OPSCTL_LAB_DIR"]) / "lab.json").read_text())
    config = yaml.safe_load(Path(env["OPSCTL_CONFIG"]).read_text())
    return Lab(env=env, lab_dir=Path(env["OPSCTL_LAB_DIR"]), nodes=state["nodes"],
               scrape_interval=state["scrape_interval"], prometheus_url=config["prometheus"]["url"])
