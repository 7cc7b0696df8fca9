"""`opsctl health --drain` on the simulated cluster: the verdict table of every shipped rule, judged
from the lab's Prometheus and from VictoriaMetrics scraping the same exporters (the two must decide
alike), then drained for real.

All faults are injected on gpu033..gpu064 (gpu001..gpu032 belong to other tests of the lab)."""

import subprocess
import threading
import time

import pytest

from opsctl_lab.hardware import VBIOS_DRIFT_VERSION, VBIOS_VERSION
from tests.integration.lab.health_support import HealthLab, LabVictoria

pytestmark = pytest.mark.lab

DRAIN_ROWS = [  # (fault, node, gpu, hca, rule that must own the drain)
    ("xid:79", "gpu033", 3, None, "xid-79"),
    ("xid:48", "gpu034", 1, None, "xid-48"),
    ("xid:95", "gpu035", 2, None, "xid-95"),
    ("dbe", "gpu036", 4, None, "ecc-dbe-new"),
    ("row-remap-failure", "gpu037", 5, None, "row-remap-failure"),
    ("row-remap-pending", "gpu038", 6, None, "row-remap-pending"),
    ("gpu-missing", "gpu039", 7, None, "gpu-count"),
    ("ib-down", "gpu040", None, 3, "ib-down"),
    ("ib-degraded", "gpu041", None, 5, "ib-degraded"),
    ("fabric-stuck", "gpu053", 2, None, "fabric-not-ready"),
    ("fabricmanager-down", "gpu054", None, None, "fabric-manager-down"),
    ("mig-on", "gpu055", 6, None, "mig-enabled"),
    ("ecc-off", "gpu056", 1, None, "ecc-disabled"),
    ("clock-slowdown:power-brake", "gpu057", 2, None, "clock-slowdown"),
    ("pcie-downtrain", "gpu058", 3, None, "pcie-downtrained"),
    ("nvlink-down:3", "gpu060", 1, None, "nvlink-down"),
    ("nvlink-degraded:7", "gpu061", 5, None, "nvlink-degraded"),
]
# What `opsctl node check` reads (nvidia-smi nvlink -s), not DCGM: run on its node as its timer would.
NODE_CHECKED = [row[1] for row in DRAIN_ROWS if row[4].startswith("nvlink-")]
WARN_ROWS = [  # (fault, node, gpu, hca, rule that must warn)
    ("xid:13", "gpu042", 0, None, "xid-13"),
    ("xid:31", "gpu043", 1, None, "xid-31"),
    ("xid:94", "gpu044", 2, None, "xid-94"),
    ("thermal", "gpu045", 3, None, "gpu-temp-high"),
    ("nvlink-errors", "gpu046", 4, None, "nvlink-errors-rising"),
    ("pcie-replays", "gpu047", 5, None, "pcie-replays"),
    ("sbe-storm", "gpu048", 6, None, "sbe-storm"),
    ("ib-counters", "gpu049", None, 1, "ib-errors"),
    ("vbios-drift", "gpu059", 4, None, "firmware-drift"),
    ("nvlink-crc", "gpu062", 2, None, "nvlink-errors-rising"),
    ("pcie-aer", "gpu063", 3, None, "pcie-aer-rising"),
]
# A rate of what `opsctl node check` counts (sysfs AER): run on its node every few seconds while the table waits.
RATE_CHECKED = ["gpu063"]
STORAGE_ROWS = [("ib-down", "gpu051", None, "8"), ("ib-degraded", "gpu052", None, "mlx5_bond_0")]
SCOPE = "gpu[033-063]"


@pytest.fixture(scope="module")
def table(lab, tmp_path_factory):
    """Inject every row at once on its own node, wait for the verdicts, compare the dry-run plans of
    Prometheus and VictoriaMetrics, then run one --drain."""
    tmp = tmp_path_factory.mktemp("table")
    h = HealthLab(lab, tmp, safety={"breaker_min_nodes": 20, "max_drains_per_run": 20, "max_drains_per_hour": 100,
                                    "max_out_of_service_fraction": 0.4})
    victoria = LabVictoria(lab, tmp) if LabVictoria.available() else None
    stop = threading.Event()

    def keep_checking():  # one failed run must not end the rate (the table's own check says what it saw)
        while not stop.wait(3):
            for node in RATE_CHECKED:
                try:
                    h.node_check(node)
                except (AssertionError, subprocess.TimeoutExpired, ValueError):
                    continue
    checking = threading.Thread(target=keep_checking, daemon=True)
    try:
        if victoria is not None:  # it must see a DBE begin, as Prometheus does, or it rightly reads no new DBE
            victoria.wait_scraped(lab, "gpu036")
        for fault, node, gpu, hca, _ in DRAIN_ROWS + WARN_ROWS:
            h.inject(node, fault, gpu=gpu, hca=hca)
        for node in NODE_CHECKED:
            h.node_check(node)
        checking.start()
        h.inject("gpu050", "exporter-down")
        for fault, node, gpu, hca in STORAGE_ROWS:
            h.inject(node, fault, gpu=gpu, hca=hca)
        expected = {row[1]: "fail" for row in DRAIN_ROWS} | {row[1]: "warn" for row in WARN_ROWS}
        expected |= {"gpu050": "unknown"} | {row[1]: "ok" for row in STORAGE_ROWS}
        h.wait_statuses(SCOPE, expected, rules={row[1]: row[4] for row in DRAIN_ROWS + WARN_ROWS})
        plans = _plans(h, victoria)
        before = h.slurm()
        code, nodes = h.health_json("--drain", "--nodes", SCOPE)
        stop.set()
        yield h, code, nodes, before, h.slurm(), plans
    finally:
        stop.set()
        if checking.is_alive():
            checking.join(60)
        if victoria is not None:
            victoria.stop()
        h.cleanup()


def _plans(h, victoria):
    """node -> (status, action, checks) of a dry run against Prometheus and against VictoriaMetrics,
    once VictoriaMetrics has the same scrapes (it started with the faults, so give it their holds)."""
    def plan(*args):
        _, nodes = h.health_json("--drain", "--dry-run", "--nodes", SCOPE, *args)
        return {n: (v["status"], v["action"], sorted(c["id"] for c in v["checks"]))
                for n, v in nodes.items() if n != "_summary"}

    prometheus = plan()
    if victoria is None:
        return prometheus, None
    deadline = time.monotonic() + 60
    while True:
        other = plan("--prometheus", victoria.url)
        if other == prometheus or time.monotonic() > deadline:
            return prometheus, other
        time.sleep(3)
        prometheus = plan()


@pytest.mark.parametrize("fault,node,gpu,hca,rule", DRAIN_ROWS, ids=[r[0] for r in DRAIN_ROWS])
def test_drain_rows_fail_and_are_drained_by_their_rule(table, fault, node, gpu, hca, rule):
    _, code, nodes, before, after, _ = table
    assert code == 1
    entry = nodes[node]
    assert (entry["status"], entry["action"]) == ("fail", "drain")
    assert not before[node].drained and after[node].drained
    assert after[node].reason.startswith(f"opsctl:{rule}")
    check = next(c for c in entry["checks"] if c["id"] == rule)
    assert check["status"] == "fail" and check["value"] is not None and check["threshold"] is not None
    link = fault.partition(":")[2] if rule.startswith("nvlink-") else None
    assert check.get("nvlink") == (f"gpu{gpu} link{link}" if link else None)
    assert check.get("gpu") == (f"gpu{gpu}" if gpu is not None and rule != "gpu-count" and not link else None)
    assert check.get("hca") == (f"mlx5_{hca}" if hca is not None else None)


def test_the_reasons_of_the_new_checks_name_what_they_saw(table):
    """The drain reason names the device and, in words, what the rule saw there."""
    after = table[4]
    assert after["gpu057"].reason.startswith("opsctl:clock-slowdown gpu2 hw-slowdown,power-brake")
    assert after["gpu053"].reason.startswith("opsctl:fabric-not-ready gpu2 fabric In Progress")
    assert after["gpu058"].reason.startswith("opsctl:pcie-downtrained gpu3 PCIe link at 50% of its maximum")
    assert after["gpu060"].reason.startswith("opsctl:nvlink-down gpu1 link3 inactive")
    assert after["gpu061"].reason.startswith("opsctl:nvlink-degraded gpu5 link7 at 50% of its full speed")


@pytest.mark.parametrize("fault,node,gpu,hca,rule", WARN_ROWS, ids=[r[0] for r in WARN_ROWS])
def test_warn_rows_warn_and_are_not_drained(table, fault, node, gpu, hca, rule):
    _, _, nodes, _, after, _ = table
    assert (nodes[node]["status"], nodes[node]["action"]) == ("warn", "none")
    assert any(c["id"] == rule and c["status"] == "warn" for c in nodes[node]["checks"])
    assert not after[node].drained


def test_a_gpu_with_another_vbios_is_a_warning_that_names_both_versions(table):
    """One GPU of the 64 nodes' 512 runs another VBIOS: firmware-drift warns on it alone, naming its version
    and the one the rest run."""
    nodes = table[2]
    drift = [(n, c["firmware"]) for n, v in nodes.items() if n != "_summary" for c in v["checks"]
             if c["id"] == "firmware-drift"]
    assert drift == [("gpu059", f"gpu4 vbios {VBIOS_DRIFT_VERSION} (most run {VBIOS_VERSION})")]


def test_exporter_down_is_unknown_and_not_drained(table):
    _, _, nodes, _, after, _ = table
    assert nodes["gpu050"]["status"] == "unknown" and not after["gpu050"].drained
    assert {c["id"] for c in nodes["gpu050"]["checks"]} >= {"data-dcgm", "data-node"}


@pytest.mark.parametrize("fault,node,gpu,hca", STORAGE_ROWS, ids=[r[0] for r in STORAGE_ROWS])
def test_drain_fault_on_the_storage_port_only_is_ok(table, fault, node, gpu, hca):
    _, _, nodes, _, after, _ = table
    assert (nodes[node]["status"], nodes[node]["action"]) == ("ok", "none") and not after[node].drained


def test_the_faulty_nodes_and_no_other_are_drained(table):
    h, _, nodes, before, after, _ = table
    newly = {n for n in after if after[n].drained and not before[n].drained}
    assert newly == {row[1] for row in DRAIN_ROWS}
    assert all(after[n].reason.startswith("opsctl:") for n in newly)
    drains = [r for r in h.audit() if r["event"] == "drain"]
    assert {r["node"] for r in drains} == newly
    assert all(r["dry_run"] is False and r["user"] and r["checks"] and r["evidence"] for r in drains)
    summary = nodes["_summary"]
    assert (summary["drained"], summary["fail"], summary["warn"], summary["unknown"]) == \
        (len(DRAIN_ROWS), len(DRAIN_ROWS), len(WARN_ROWS), 1)


def test_victoria_metrics_scraping_the_same_exporters_decides_exactly_alike(table):
    *_, (prometheus, victoria) = table
    if victoria is None:
        pytest.skip("victoria-metrics is not installed (make deps-test)")
    assert {n: a for n, (_, a, _) in prometheus.items()}["gpu033"] == "would-drain"
    assert victoria == prometheus
