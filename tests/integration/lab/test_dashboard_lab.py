"""The shipped dashboards against the lab's real Prometheus, with one fault of each kind injected: every
panel query runs, every health panel returns data and shows its injected node beyond the panel's
threshold, every variable has values, and the lab's `opsctl health --watch` metrics are scraped.

Faults go on gpu017..gpu030, which no other lab test touches, and on three of the health tests' nodes,
all at once, and are cleared at the end. They are injected through the lab's own functions, in this
process: `opsctl lab inject` as a command is tested in test_lab.py."""

import json
import urllib.parse
import urllib.request

import pytest

from opsctl_lab import cluster
from tests.conftest import REPO
from tests.integration.lab.health_support import forget_node_check, node_check

pytestmark = pytest.mark.lab

RATE_INTERVAL = "20s"  # what Grafana's $__rate_interval is at the lab's 5 s scrape interval (4 scrapes)
# fault, node, options, (dashboard, panel title prefix) that must show the node.
FAULTS = [
    ("xid:79", "gpu017", ["--gpu", "3"], [("opsctl-gpu", "XIDs per GPU")]),
    ("dbe", "gpu018", ["--gpu", "1"], [("opsctl-gpu", "ecc-dbe-new")]),
    ("sbe-storm", "gpu019", ["--gpu", "2"], [("opsctl-gpu", "sbe-storm")]),
    ("row-remap-failure", "gpu020", ["--gpu", "0"], [("opsctl-gpu", "row-remap-failure")]),
    ("row-remap-pending", "gpu021", ["--gpu", "4"], [("opsctl-gpu", "row-remap-pending")]),
    ("gpu-missing", "gpu022", ["--gpu", "7"], [("opsctl-gpu", "gpu-count")]),
    ("thermal", "gpu023", ["--gpu", "5"], [("opsctl-gpu", "gpu-temp-high"), ("opsctl-gpu", "clocks-hw-slowdown"),
                                          ("opsctl-overview", "Hottest GPU per node")]),
    ("nvlink-errors", "gpu024", ["--gpu", "6"], [("opsctl-gpu", "nvlink-errors-rising")]),
    ("pcie-replays", "gpu025", ["--gpu", "2"], [("opsctl-gpu", "pcie-replays")]),
    ("ib-down", "gpu026", ["--hca", "3"], [("opsctl-infiniband", "ib-down"), ("opsctl-infiniband", "Port state"),
                                           ("opsctl-infiniband", "Physical state")]),
    ("ib-degraded", "gpu027", ["--hca", "5"], [("opsctl-infiniband", "ib-degraded")]),
    ("ib-counters", "gpu028", ["--hca", "1"], [("opsctl-infiniband", "ib-errors"),
                                               ("opsctl-infiniband", "Link error recoveries/s"),
                                               ("opsctl-infiniband", "Receive errors/s")]),
    ("exporter-down", "gpu029", [], [("opsctl-overview", "Exporter targets down")]),
    ("remapped-rows", "gpu030", ["--gpu", "6"], [("opsctl-gpu", "remapped-rows-high")]),
    # The health tests' nodes: this module runs first and clears them.
    ("mig-on", "gpu057", ["--gpu", "4"], [("opsctl-gpu", "mig-enabled")]),
    ("ecc-off", "gpu059", ["--gpu", "1"], [("opsctl-gpu", "ecc-disabled")]),
    ("compute-exclusive", "gpu056", ["--gpu", "2"], [("opsctl-gpu", "compute-mode")]),
    ("persistence-off", "gpu060", ["--gpu", "6"], [("opsctl-gpu", "persistence-off")]),
    ("clock-slowdown:hw-thermal", "gpu058", ["--gpu", "3"], [("opsctl-gpu", "clock-slowdown")]),
    ("pcie-downtrain", "gpu061", ["--gpu", "5"], [("opsctl-gpu", "pcie-downtrained")]),
    ("vbios-drift", "gpu062", ["--gpu", "2"], [("opsctl-gpu", "firmware-drift")]),
    ("driver-drift", "gpu053", [], [("opsctl-gpu", "version-drift")]),
    ("sxid-fatal", "gpu054", [], [("opsctl-gpu", "nvswitch-fatal")]),
    ("sxid-nonfatal", "gpu055", [], [("opsctl-gpu", "nvswitch-errors")]),
    ("nvlink-down:2", "gpu063", ["--gpu", "4"], [("opsctl-gpu", "nvlink-down")]),
    ("nvlink-degraded:9", "gpu064", ["--gpu", "0"], [("opsctl-gpu", "nvlink-degraded")]),
]
# Read by `opsctl node check` (nvidia-smi nvlink -s, the kernel log): the fixture runs it on these nodes, as their
# timer would.
NODE_CHECKED = ("gpu063", "gpu064", "gpu054", "gpu055")  # and the kernel log's SXids
# Panels that plot a health signal: each must be shown by one of the faults above, except traffic, the
# last-XID table (the XID panel shows the fault), counters that no lab fault raises, the fabric test's
# results (`opsctl ib fabric-test` runs against the lab machines, not this simulated cluster), and the
# NVSwitch fabric's rules: they hold 5 minutes by default, a boot's grace, longer than this module waits
# (test_health_lab.py's table drains on them at a short hold), and the rate of the node check's AER counts,
# which needs the node check run again and again (the table does).
HEALTH_DASHBOARDS = ("opsctl-gpu", "opsctl-infiniband")
NOT_HEALTH = {"Last XID per GPU", "GPU power", "Data received", "Data transmitted", "Link downs/s",
              "Transmit discards/s", "Fabric test: Gb/s per node and rail", "Fabric test: culprits",
              "Fabric test: age of the results", "fabric-not-ready: GPU fabric status held short of Success",
              "fabric-manager-down: GPUs whose fabric nothing trains",
              "pcie-aer-rising: PCIe AER errors/min per GPU and HCA"}


def load(uid: str) -> dict:
    return json.loads((REPO / "dashboards" / f"{uid}.json").read_text())


def as_promql(expr: str, node: str = ".*") -> str:
    for name, value in {"$__rate_interval": RATE_INTERVAL, "$node": node, "$gpu": ".*", "$hca": ".*"}.items():
        expr = expr.replace(name, value)
    return expr


def colour(panel: dict, value: float) -> str:
    """The colour Grafana gives `value` by the panel's thresholds (the highest step at or below it)."""
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    return [s["color"] for s in steps if s["value"] is None or value >= s["value"]][-1]


def panel(uid: str, prefix: str) -> dict:
    return next(p for p in load(uid)["panels"] if p.get("title", "").startswith(prefix))


def node_of(series: dict) -> str | None:
    return series["metric"].get("node") or series["metric"].get("slurm_node")


@pytest.fixture(scope="module")
def faults(lab):
    for fault, node, options, _ in FAULTS:
        device = dict(zip(options[::2], options[1::2], strict=True))
        cluster.inject(node, fault, gpu=int(device["--gpu"]) if "--gpu" in device else None, hca=device.get("--hca"))
    for node in NODE_CHECKED:
        node_check(lab, node)
    try:
        def every_fault_shows():
            for _, node, _, panels in FAULTS:
                for uid, prefix in panels:
                    p = panel(uid, prefix)
                    series = lab.query(as_promql(p["targets"][0]["expr"]))
                    if p["type"] != "stat":
                        series = [s for s in series if node_of(s) == node]
                    if not any(colour(p, float(s["value"][1])) != "green" for s in series):
                        return None
            return True

        lab.wait_until(every_fault_shows, 90, "every injected fault on its panels", interval=2)
        yield
    finally:
        for _, node, _, _ in FAULTS:
            cluster.clear(node)
        for node in NODE_CHECKED:
            forget_node_check(lab, node)


def test_every_panel_query_of_every_dashboard_runs(lab):
    queries = [(path.stem, p["title"], as_promql(t["expr"])) for path in sorted((REPO / "dashboards").glob("*.json"))
               for p in json.loads(path.read_text())["panels"] for t in p.get("targets", [])]
    assert len(queries) > 40
    for _uid, _title, expr in queries:
        lab.query(expr)  # raises on a PromQL error


def test_each_health_panel_returns_data_and_shows_its_injected_node(lab, faults):
    shown = {(uid, prefix) for _, _, _, panels in FAULTS for uid, prefix in panels}
    for uid in HEALTH_DASHBOARDS:
        for p in load(uid)["panels"]:
            if p["type"] in ("row", "text") or p["title"] in NOT_HEALTH:
                continue
            assert any(p["title"].startswith(prefix) for u, prefix in shown if u == uid), \
                f"{uid}: no fault shows {p['title']!r}"
    for fault, node, _, panels in FAULTS:
        for uid, prefix in panels:
            p = panel(uid, prefix)
            series = lab.query(as_promql(p["targets"][0]["expr"]))
            assert series, f"{fault}: {uid} {p['title']!r} returns no data"
            if p["type"] == "stat":  # a cluster-wide count: it shows the fault, not the node
                assert colour(p, float(series[0]["value"][1])) != "green"
                continue
            flagged = {node_of(s) for s in series if colour(p, float(s["value"][1])) != "green"}
            assert node in flagged, f"{fault}: {uid} {p['title']!r} does not flag {node} (flags {flagged})"
            # Picking the node in the dashboard keeps only its series.
            assert {node_of(s) for s in lab.query(as_promql(p["targets"][0]["expr"], node))} == {node}


def test_opsctl_status_per_node_shows_the_unknown_and_the_failing_node(lab, faults):
    expr = as_promql(panel("opsctl-overview", "opsctl status per node")["targets"][0]["expr"])

    def statuses():
        got = {s["metric"]["slurm_node"]: float(s["value"][1]) for s in lab.query(expr)}
        return got if got.get("gpu029") == 3 and got.get("gpu020") == 2 else None

    # The watch judges every 30 s (opsctl_lab.cluster.WATCH_INTERVAL_S), Prometheus scrapes it 5 s later.
    got = lab.wait_until(statuses, 90, "the lab's opsctl --watch to judge gpu029 unknown and gpu020 failing", 2)
    assert got["gpu001"] in (0, 1, 2) and len(got) == lab.nodes


def test_every_variable_query_returns_values(lab):
    for path in sorted((REPO / "dashboards").glob("*.json")):
        for variable in json.loads(path.read_text())["templating"]["list"]:
            if variable["type"] != "query":
                continue
            inner = variable["query"].removeprefix("label_values(").removesuffix(")")
            selector, label = (part.strip() for part in inner.rsplit(",", 1))
            url = (f"{lab.prometheus_url}/api/v1/label/{label}/values?"
                   + urllib.parse.urlencode({"match[]": as_promql(selector)}))
            with urllib.request.urlopen(url, timeout=10) as resp:
                values = json.load(resp)["data"]
            assert values, f"{path.stem}: variable {variable['name']} has no values"
            if variable["name"] == "node":
                assert len(values) == lab.nodes


def test_watch_metrics_reach_the_lab_prometheus(lab):
    """`opsctl lab up` runs `opsctl health --watch` serving on metrics.listen_address; Prometheus scrapes it."""
    def scraped():
        runs = lab.query('sum(opsctl_runs_total{job="opsctl"})')
        fresh = lab.query('time() - opsctl_last_success_timestamp_seconds{job="opsctl"} < 60')
        return runs and float(runs[0]["value"][1]) > 0 and fresh

    assert lab.wait_until(scraped, 60, "opsctl --watch metrics in the lab's Prometheus", interval=2)
    nodes = lab.query('sum(opsctl_nodes{job="opsctl"})')
    assert float(nodes[0]["value"][1]) == lab.nodes
    assert lab.query('opsctl_drains_total{job="opsctl", rule_id="xid-79"}'), "drain counters start at 0 per rule"
