"""Evaluation against a real Prometheus and, beside it, Debian's VictoriaMetrics, both scraping the
lab's dcgm-exporter emulator and the real node_exporter (see promlab.py). Faults are injected into
the in-memory hardware model. Every verdict read here comes from both databases, and the two must
agree, drain decisions included."""

import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler

import pytest
import yaml

from opsctl.actor.memory import Handled, HandledMemory
from opsctl.config import parse_config
from opsctl.config.schema import Duration
from opsctl.health import precomputed
from opsctl.health.catalog import load_catalog
from opsctl.health.evaluate import evaluate
from opsctl.health.evidence import read_evidence
from opsctl.health.export import render_prometheus_rules
from opsctl.health.plan import BreakerCount, plan_drains
from opsctl.prom import PromClientImpl
from opsctl.slurm import SlurmNode
from opsctl_lab.dcgm_emulator import send_body
from opsctl_lab.hardware import (
    DRIVER_DRIFT_VERSION,
    DRIVER_VERSION,
    HCA_FW,
    HCA_FW_MISMATCH,
    VBIOS_DRIFT_VERSION,
    VBIOS_VERSION,
)
from tests.component.promlab import (
    HAVE_NODE_EXPORTER,
    HAVE_PROMETHEUS,
    HAVE_VICTORIA,
    TSDBS,
    Running,
    Stack,
    Tsdb,
    drain_decisions,
    evaluate_everywhere,
    serve,
    verdicts,
    wait,
)

pytestmark = pytest.mark.skipif(not (HAVE_PROMETHEUS and HAVE_NODE_EXPORTER and HAVE_VICTORIA),
                                reason="needs prometheus, prometheus-node-exporter and victoria-metrics")
NODES = ["gpu001", "gpu002", "gpu003", "gpu004"]
# gpu004 takes the faults whose traces outlive a clear (a DBE stays in increase() for its hold).
FAST_HOLDS = {rid: {"hold": "3s"} for rid in ("ib-down", "ib-degraded", "gpu-temp-high", "nvlink-errors-rising",
                                               "pcie-replays", "sbe-storm", "ib-errors", "fabric-manager-down",
                                               "fabric-not-ready", "clock-slowdown", "pcie-downtrained",
                                               "firmware-drift", "version-drift")}
FAST_HOLDS["ecc-dbe-new"] = {"hold": "8s"}  # the counter must exist at the window's start: not 10m here
# Every rule holds two scrape intervals (2 s here), for series that existed before the hold: an XID count
# series is born with the XID, so its check shows after one to two holds.
XID_SCRAPES = 5


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("prom"), NODES, victoria=True)
    yield s
    s.stop()


@pytest.fixture
def clean(stack):
    """Every test starts from healthy hardware and leaves it healthy."""
    def reset():
        for node in NODES:
            stack.dcgm[node].hw.__init__(node=node)
            stack.dcgm[node].down = False
            stack.nodeexp[node].rewrite()
    reset()
    stack.wait_scrapes(2)
    yield stack
    reset()


def config_for(stack, **extra):
    raw = {"prometheus": {"url": stack.url, "scrape_interval": "1s"}, "catalog": {"overrides": FAST_HOLDS}}
    raw.update(extra)
    return parse_config(raw, "test", {})


def run(stack, config=None, slurm_nodes=NODES, memory=None, now=None):
    return evaluate_everywhere(stack.tsdbs, config or config_for(stack), slurm_nodes, memory, now)


def checks(report, node):
    return {(c.id, c.device, c.status) for c in report.nodes[node].checks}


def test_healthy_cluster_is_ok_with_a_fixed_number_of_queries(clean):
    report, client, rules = run(clean)
    assert {v.status for v in report.nodes.values()} == {"ok"}
    # Presence, scrape age, identity, the recorded results of every rule and presence again; queried
    # directly (the fallback, and VictoriaMetrics here), one more query per rule.
    assert report.queries == 5 and report.rule_results == "precomputed"
    direct = evaluate(PromClientImpl(clean.url), rules, config_for(clean, prometheus={
        "url": clean.url, "scrape_interval": "1s", "recording_rules": "off"}), NODES)
    assert direct.queries == len(rules) + 4


def test_xid_79_fails_with_evidence(clean):
    clean.dcgm["gpu002"].hw.inject("xid:79", gpu=3)
    clean.wait_scrapes(XID_SCRAPES)
    report, _, _ = run(clean)
    assert report.nodes["gpu002"].status == "fail"
    check = next(c for c in report.nodes["gpu002"].checks if c.id == "xid-79")
    assert (check.device, check.kind, check.value, check.threshold, check.action) == ("gpu3", "gpu", 1, 0, "drain")
    assert check.evidence == "gpu3 xid=79 count=1"
    assert report.nodes["gpu001"].status == report.nodes["gpu003"].status == "ok"


def test_application_xid_warns(clean):
    clean.dcgm["gpu001"].hw.inject("xid:13", gpu=0)
    clean.wait_scrapes(XID_SCRAPES)
    report, _, _ = run(clean)
    assert report.nodes["gpu001"].status == "warn"
    assert ("xid-13", "gpu0", "warn") in checks(report, "gpu001")


def test_handled_xid_within_its_window_is_not_a_new_failure(clean):
    clean.dcgm["gpu001"].hw.inject("xid:79", gpu=1)
    clean.wait_scrapes(XID_SCRAPES)
    now = time.time()
    handled = HandledMemory([Handled("gpu001", "xid-79", "gpu1", 1.0, now - 10, "window", 300.0, True)])
    report, _, _ = run(clean, memory=handled, now=now)
    assert report.nodes["gpu001"].status == "ok"
    assert ("xid-79", "gpu1", "handled") in checks(report, "gpu001")
    # Acted on longer ago than the window: the count must come from a new XID.
    old = HandledMemory([Handled("gpu001", "xid-79", "gpu1", 1.0, now - 301, "window", 300.0, True)])
    report, _, _ = run(clean, memory=old, now=now)
    assert report.nodes["gpu001"].status == "fail"


def test_gauge_mode_never_repeats_a_handled_xid(clean):
    clean.dcgm["gpu003"].hw.inject("xid:48", gpu=2)
    clean.dcgm["gpu003"].hw.clear()
    clean.wait_scrapes(XID_SCRAPES)
    config = config_for(clean, catalog={"overrides": FAST_HOLDS, "xid_source": "gauge"})
    report, _, _ = run(clean, config)
    assert ("xid-48", "gpu2", "fail") in checks(report, "gpu003")  # the gauge keeps 48 after clear
    handled = HandledMemory([Handled("gpu003", "xid-48", "gpu2", 48.0, 1.0, "level", 0.0, True)])
    report, _, _ = run(clean, config, memory=handled)
    assert report.nodes["gpu003"].status == "ok"


def test_a_stock_exporter_without_the_windowed_count_still_shows_xid_79(clean):
    """catalog.xid_source auto: where a target exports no DCGM_EXP_XID_ERRORS_COUNT, the last-XID gauge."""
    clean.dcgm["gpu002"].xid_count = False
    clean.dcgm["gpu002"].hw.inject("xid:79", gpu=6)
    clean.wait_scrapes(XID_SCRAPES)
    try:
        report, _, _ = run(clean)
        check = next(c for c in report.nodes["gpu002"].checks if c.id == "xid-79")
        assert (check.status, check.device, check.memory) == ("fail", "gpu6", "level")
        assert "last-XID gauge" in check.evidence
        assert report.nodes["gpu001"].status == "ok"  # exporters with the count do not read the gauge
    finally:
        clean.dcgm["gpu002"].xid_count = True


def test_every_xid_gets_a_decision_from_nvidias_xid_catalog(clean):
    """XID 46 has no rule of its own; NVIDIA's catalog says RESET_GPU, so xid-reset drains it and names the
    code. 143 (RESET_GPU) on a stock exporter without the windowed count: the same, from the last-XID
    gauge. 999 is in no catalog: xid-unknown warns."""
    clean.dcgm["gpu003"].xid_count = False
    clean.dcgm["gpu002"].hw.inject("xid:46", gpu=3)
    clean.dcgm["gpu003"].hw.inject("xid:143", gpu=1)
    clean.dcgm["gpu001"].hw.inject("xid:999", gpu=0)
    clean.wait_scrapes(XID_SCRAPES)
    try:
        report, _, _ = run(clean)
        found = {(node, c.id): c for node in ("gpu001", "gpu002", "gpu003") for c in report.nodes[node].checks}
        windowed, gauge, unknown = found["gpu002", "xid-reset"], found["gpu003", "xid-reset"], \
            found["gpu001", "xid-unknown"]
        assert (windowed.status, windowed.action, windowed.xid, windowed.evidence) == \
            ("fail", "drain", 46, "gpu3 xid=46 count=1")
        assert (gauge.status, gauge.device, gauge.xid, gauge.memory) == ("fail", "gpu1", 143, "level")
        assert gauge.evidence == "gpu1 xid=143 (last-XID gauge; no windowed count)"
        assert (unknown.status, unknown.action, unknown.xid) == ("warn", "report", 999)
        assert [n for n in ("gpu001", "gpu002", "gpu003") if report.nodes[n].drain_checks()] == ["gpu002", "gpu003"]
    finally:
        clean.dcgm["gpu003"].xid_count = True


@pytest.mark.parametrize("fault,rule", [("row-remap-failure", "row-remap-failure"),
                                        ("row-remap-pending", "row-remap-pending"), ("dbe", "ecc-dbe-new")])
def test_memory_faults_fail(clean, fault, rule):
    clean.dcgm["gpu004"].hw.inject(fault, gpu=5)
    clean.wait_scrapes(3)
    report, _, _ = run(clean)
    assert (rule, "gpu5", "fail") in checks(report, "gpu004")


def run_until_failing(stack, failing: dict[str, tuple[str, str]], timeout: float = 30.0):
    """The report of a run on both engines, run again until each node fails its (rule, device) check."""
    found = {}

    def judged() -> bool:
        found["report"], _, _ = run(stack)
        return all((*check, "fail") in checks(found["report"], node) for node, check in failing.items())
    wait(judged, timeout, f"failing checks {failing}")
    return found["report"]


def test_a_stuck_gpu_fabric_and_a_node_without_fabric_manager_fail_their_own_rule(clean):
    """fabric-stuck on one GPU is fabric-not-ready on that GPU; fabricmanager-down (every GPU untrained) is
    fabric-manager-down on the node alone, not eight fabric-not-ready checks: on both engines."""
    clean.dcgm["gpu003"].hw.inject("fabric-stuck", gpu=2)
    clean.dcgm["gpu001"].hw.inject("fabricmanager-down")

    report = run_until_failing(clean, {"gpu003": ("fabric-not-ready", "gpu2"), "gpu001": ("fabric-manager-down", "")})
    assert {c for c in checks(report, "gpu003") if c[0].startswith("fabric")} == {("fabric-not-ready", "gpu2", "fail")}
    assert {c for c in checks(report, "gpu001") if c[0].startswith("fabric")} == {("fabric-manager-down", "", "fail")}
    assert next(c for c in report.nodes["gpu001"].checks if c.id == "fabric-manager-down").value == 8
    assert not any(c[0].startswith("fabric") for n in ("gpu002", "gpu004") for c in checks(report, n))


def test_a_clock_slowdown_and_a_downtrained_link_fail_their_gpu_alone_on_both_engines(clean):
    """clock-slowdown:power-brake on gpu002's GPU 6 (busy, mask 0x88) and pcie-downtrain on gpu004's GPU 1
    (x8 of x16) fail their own rule on their GPU alone, with the values that name what was seen; the idle
    GPUs' clock event reasons (GPU_IDLE) and the other links (x16 of x16) are ok."""
    clean.dcgm["gpu002"].hw.inject("clock-slowdown:power-brake", gpu=6)
    clean.dcgm["gpu004"].hw.inject("pcie-downtrain", gpu=1)
    report = run_until_failing(clean, {"gpu002": ("clock-slowdown", "gpu6"), "gpu004": ("pcie-downtrained", "gpu1")})
    new = {"clock-slowdown", "pcie-downtrained"}
    assert {(n, c.id, c.device, c.value) for n, v in report.nodes.items() for c in v.checks if c.id in new} == {
        ("gpu002", "clock-slowdown", "gpu6", 0x88), ("gpu004", "pcie-downtrained", "gpu1", 0.5)}
    slowed = next(c for c in report.nodes["gpu002"].checks if c.id == "clock-slowdown")
    assert slowed.evidence == "gpu6 hw-slowdown,power-brake"


def test_a_gpu_in_exclusive_process_mode_fails_compute_mode_alone_on_both_engines(clean):
    """compute-exclusive on gpu002's GPU 2 (DCGM_FI_DEV_COMPUTE_MODE 2): compute-mode fails that GPU alone,
    naming both modes; a site whose GPUs run Exclusive_Process on purpose sees it the other way round."""
    clean.dcgm["gpu002"].hw.inject("compute-exclusive", gpu=2)
    report = run_until_failing(clean, {"gpu002": ("compute-mode", "gpu2")})
    failing = {(n, c.device, c.evidence) for n, v in report.nodes.items() for c in v.checks
               if c.id == "compute-mode" and c.status == "fail"}
    assert failing == {("gpu002", "gpu2", "gpu2 compute mode Exclusive_Process, not Default")}
    exclusive = config_for(clean, hardware={"compute_mode": "exclusive-process"})
    found = {}

    def all_but_one() -> bool:
        found["report"], _, _ = run(clean, exclusive)
        found["seen"] = {(n, c.device) for n, v in found["report"].nodes.items() for c in v.checks
                         if c.id == "compute-mode" and c.status == "fail"}
        return len(found["seen"]) == 4 * 8 - 1
    wait(all_but_one, 30, "every GPU but gpu002's GPU 2 failing compute-mode in an exclusive-process site")
    assert ("gpu002", "gpu2") not in found["seen"]


def test_a_gpu_with_another_vbios_warns_naming_both_versions_and_a_pin_makes_it_drain(clean):
    """vbios-drift on gpu003's GPU 4, while every other GPU runs 96.00.A5.00.03: firmware-drift warns on that
    GPU alone, its series naming both versions, on both engines. With hardware.firmware pinning 96.00.A5.00.03
    it fails and is drained; pinned at the other version, every other GPU fails instead."""
    clean.dcgm["gpu003"].hw.inject("vbios-drift", gpu=4)
    drifted = f"gpu4 vbios {VBIOS_DRIFT_VERSION} (most run {VBIOS_VERSION})"
    found = {}

    def drifts(config, status: str, nodes: set[str]) -> bool:
        found["report"], _, found["rules"] = run(clean, config)
        seen = {(n, c.device) for n, v in found["report"].nodes.items() for c in v.checks
                if c.id == "firmware-drift" and c.status == status}
        found["seen"] = seen
        return {n for n, _ in seen} == nodes
    wait(lambda: drifts(None, "warn", {"gpu003"}), 30, "gpu003's firmware-drift warning")
    assert found["seen"] == {("gpu003", drifted)}
    check = next(c for c in found["report"].nodes["gpu003"].checks if c.id == "firmware-drift")
    assert (check.kind, check.value, found["report"].nodes["gpu003"].status) == ("firmware", 1, "warn")

    pinned = config_for(clean, hardware={"firmware": {"vbios": VBIOS_VERSION}})
    wait(lambda: drifts(pinned, "fail", {"gpu003"}), 30, "gpu003 failing firmware-drift against the pin")
    assert found["seen"] == {("gpu003", f"gpu4 vbios {VBIOS_DRIFT_VERSION} (pinned {VBIOS_VERSION})")}
    assert drain_decisions(found["report"], found["rules"], NODES)["gpu003"] == "would-drain"

    other = config_for(clean, hardware={"firmware": {"vbios": VBIOS_DRIFT_VERSION}})
    wait(lambda: drifts(other, "fail", set(NODES)), 30, "every node failing firmware-drift against the other pin")
    assert len(found["seen"]) == 4 * 8 - 1 and ("gpu003", drifted) not in found["seen"]


def test_an_hca_on_other_firmware_and_a_node_on_another_driver_warn_and_a_gpu_pin_drains_neither(clean):
    """ib-fw-mismatch on gpu002's mlx5_3 (node_exporter's node_infiniband_info) and driver-drift on gpu004
    (dcgm-exporter's driver label): version-drift warns on each, naming the HCA or the driver and both
    versions, on both engines; the storage ports (another HCA type, another firmware) are their own group.
    A VBIOS pin, which makes firmware-drift drain, leaves both warnings."""
    clean.dcgm["gpu002"].hw.inject("ib-fw-mismatch", hca=3)
    clean.nodeexp["gpu002"].rewrite()
    clean.dcgm["gpu004"].hw.inject("driver-drift")
    expected = {("gpu002", f"mlx5_3 hca {HCA_FW_MISMATCH} (most run {HCA_FW})"),
                ("gpu004", f"driver {DRIVER_DRIFT_VERSION} (most run {DRIVER_VERSION})")}
    found: dict = {}
    for config in (None, config_for(clean, hardware={"firmware": {"vbios": VBIOS_VERSION}})):
        found.clear()

        def warned(config=config) -> bool:
            found["report"], _, found["rules"] = run(clean, config)
            found["seen"] = {(n, c.device) for n, v in found["report"].nodes.items() for c in v.checks
                             if c.id == "version-drift" and c.status == "warn"}
            return found["seen"] == expected
        wait(warned, 30, "version-drift warnings on gpu002's mlx5_3 and gpu004's driver")
        assert {n: v.status for n, v in found["report"].nodes.items()} == {
            "gpu001": "ok", "gpu002": "warn", "gpu003": "ok", "gpu004": "warn"}
        assert "would-drain" not in drain_decisions(found["report"], found["rules"], NODES).values()


def _gpu_count_once_judged(stack, node: str):
    """The report and the node's gpu-count check, read again until the check is there: on a busy host a
    scrape can time out, and a node whose scrape failed is unknown for that run, with no checks."""
    found = {}

    def judged():
        report, _, _ = run(stack)
        found["report"] = report
        found["check"] = next((c for c in report.nodes[node].checks if c.id == "gpu-count"), None)
        return found["check"] is not None and found["check"].status == "fail"
    wait(judged, 20, f"{node}'s gpu-count check failing")
    return found["report"], found["check"]


def test_missing_gpu_fails_the_count(clean):
    clean.dcgm["gpu002"].hw.inject("gpu-missing", gpu=7)
    clean.wait_scrapes()
    _, check = _gpu_count_once_judged(clean, "gpu002")
    assert (check.status, check.value, check.threshold) == ("fail", 7, 8)


def test_all_gpus_gone_counts_zero_not_unknown(clean):
    for gpu in range(8):
        clean.dcgm["gpu002"].hw.inject("gpu-missing", gpu=gpu)
    clean.wait_scrapes()
    report, check = _gpu_count_once_judged(clean, "gpu002")
    assert (report.nodes["gpu002"].status, check.value) == ("fail", 0)


def test_ib_down_and_degraded_on_compute_rails_fail(clean):
    hw = clean.dcgm["gpu003"].hw
    hw.inject("ib-down", hca=2)
    hw.inject("ib-degraded", hca=5)
    clean.nodeexp["gpu003"].rewrite()
    clean.wait_scrapes(5)
    report, _, _ = run(clean)
    found = checks(report, "gpu003")
    assert ("ib-down", "mlx5_2", "fail") in found
    assert ("ib-degraded", "mlx5_5", "fail") in found
    # Evidence for people, the raw value beside it (node_exporter's state id and bytes per second).
    evidence = {(c.id, c.device): (c.evidence, c.value) for c in report.nodes["gpu003"].checks}
    assert evidence[("ib-down", "mlx5_2")] == ("mlx5_2 DOWN (state_id=1)", 1)
    assert evidence[("ib-degraded", "mlx5_5")] == ("mlx5_5 200 Gb/s, expected 400 (rate_bytes=25000000000)", 2.5e10)


def test_storage_port_is_not_a_compute_rail(clean):
    hw = clean.dcgm["gpu001"].hw
    hw.inject("ib-down", hca="mlx5_bond_0")
    hw.inject("ib-degraded", hca=8)
    clean.nodeexp["gpu001"].rewrite()
    clean.wait_scrapes(5)
    report, _, _ = run(clean)
    assert report.nodes["gpu001"].status == "ok", report.nodes["gpu001"].checks
    # ... and it is so because of the allowlist: widen it and the same data fails.
    wide = config_for(clean, hardware={"ib_devices": "mlx5_([0-7]|bond_0)"})
    report, _, _ = run(clean, wide)
    assert ("ib-down", "mlx5_bond_0", "fail") in checks(report, "gpu001")


def test_thermal_warns(clean):
    clean.dcgm["gpu002"].hw.inject("thermal", gpu=4)
    clean.wait_scrapes(5)
    report, _, _ = run(clean)
    found = checks(report, "gpu002")
    assert report.nodes["gpu002"].status == "warn"
    assert ("gpu-temp-high", "gpu4", "warn") in found
    assert ("clocks-hw-slowdown", "gpu4", "warn") in found
    by_id = {c.id: c for c in report.nodes["gpu002"].checks}
    # The emulator sets HW_SLOWDOWN, SW_THERMAL and HW_THERMAL: the rule's value is the mask of its two bits.
    assert (by_id["clocks-hw-slowdown"].evidence, by_id["clocks-hw-slowdown"].value) == \
        ("gpu4 HW_SLOWDOWN,HW_THERMAL (0x48)", 72)
    temp = by_id["gpu-temp-high"]
    assert temp.evidence == f"gpu4 {temp.value:g}°C (threshold 87°C)"


def test_exporter_down_is_unknown(clean):
    clean.dcgm["gpu003"].down = True
    clean.wait_scrapes()
    report, _, _ = run(clean)
    assert report.nodes["gpu003"].status == "unknown"
    assert ("data-dcgm", "", "unknown") in checks(report, "gpu003")


def test_stale_or_missing_recorded_results_are_queried_directly_and_decide_the_same(clean, tmp_path):
    """The recording groups stop (reloaded with an interval of a year: their series stay, their heartbeats
    age); then the config changes a rule and adds one that was never exported. Each run queries those
    rules directly, says why, and judges as the run that read every recorded result did."""
    clean.dcgm["gpu001"].hw.inject("xid:79", gpu=3)
    clean.dcgm["gpu003"].hw.inject("ib-down", hca=6)
    clean.nodeexp["gpu003"].rewrite()
    clean.wait_scrapes(XID_SCRAPES)
    prom = {"url": clean.url, "scrape_interval": "1s", "recording_interval": "2s"}
    config = config_for(clean, prometheus=prom)
    recorded, _, rules = run(clean, config)
    assert {("xid-79", "gpu3", "fail"), ("ib-down", "mlx5_6", "fail")} <= checks(recorded, "gpu001") | \
        checks(recorded, "gpu003")
    prometheus = clean.tsdbs["prometheus"]
    try:
        prometheus.record(rules, config, interval="8760h")  # a group first runs anywhere in its interval
        time.sleep(5)  # older than two recording intervals
        stale = evaluate(PromClientImpl(clean.url), rules, config, NODES)
        assert stale.rule_results == "direct"
        assert stale.rule_results_note.startswith("recorded rule results not used for every rule, queried directly "
                                                  "(older than 4s (2 x prometheus.recording_interval): ")
        assert verdicts(stale) == verdicts(recorded)
    finally:
        prometheus.record(rules, config)  # evaluated again
    (tmp_path / "probe.yaml").write_text(yaml.safe_dump({"rules": [{
        "id": "never-probe", "expr": 'max by (${by}) (up{job="${dcgm}"}) * 0', "op": ">", "threshold": 0,
        "severity": "fail", "action": "drain", "description": "d", "remediation": "r"}]}))
    changed = config_for(clean, prometheus=prom, catalog={"files": [str(tmp_path / "probe.yaml")], "overrides": {
        **FAST_HOLDS, "gpu-temp-high": {**FAST_HOLDS["gpu-temp-high"], "threshold": 95}}})
    mixed = evaluate(PromClientImpl(clean.url), load_catalog(changed), changed, NODES)
    assert mixed.rule_results == "mixed"
    assert "recorded from another expression (export the rules again): gpu-temp-high" in mixed.rule_results_note
    assert "not recorded (opsctl rules export installs the recording rules): never-probe" in mixed.rule_results_note
    assert verdicts(mixed) == verdicts(recorded)


def pending_of(report) -> dict:
    return {n: sorted((c.id, c.device) for c in v.pending) for n, v in report.nodes.items()}


def test_pending_series_come_back_on_both_engines_and_both_paths(clean):
    """A condition that holds now but whose hold has not yet elapsed (row-remap-pending, held for 30s here)
    comes back marked pending from the rule results Prometheus recorded, from its direct query and from
    VictoriaMetrics' alike, never as a failure; a fault whose hold has elapsed (row-remap-failure on
    gpu004) is a failure, not also pending. The breaker counts them all: with a limit of 2 it stops before
    the first drain. The exported alert stays on the held breach alone. The recording groups run for a
    whole hold before the pending faults come: a group's history shorter than its hold is read directly.
    gpu004's fault comes first, so it is past its hold by then; every path is read within the 30 s, which
    a machine busy with other streams kept only when nothing else was waited for in between. The two rules
    alone are recorded: Prometheus evaluating every group of the catalog each 2 s on such a machine missed
    a round of row-remap-pending's, which then rightly reads directly for a hold."""
    shipped = [r.id for r in load_catalog(parse_config({}, "t", {}))]
    config = config_for(clean, catalog={"overrides": {**FAST_HOLDS, "row-remap-pending": {"hold": "30s"}},
                                        "disable": [r for r in shipped
                                                    if r not in ("row-remap-pending", "row-remap-failure")]})
    clean.dcgm["gpu004"].hw.inject("row-remap-failure", gpu=5)
    # Until every group's history is whole, each read as the paths below read it: fresh for two 2 s intervals
    # (fresh for two of 1 s, every one of tens of groups at one instant, a machine busy with other streams is not).
    recorded_config = replace(config, prometheus=replace(config.prometheus, recording_interval=Duration(2)))
    rules = load_catalog(config)
    clean.tsdbs["prometheus"].record(rules, recorded_config)
    for node in ("gpu001", "gpu002", "gpu003"):
        clean.dcgm[node].hw.inject("row-remap-pending", gpu=2)
    clean.wait_scrapes(3)
    expected = {**{n: [("row-remap-pending", "gpu2")] for n in ("gpu001", "gpu002", "gpu003")}, "gpu004": []}
    statuses = {**{n: "ok" for n in expected}, "gpu004": "fail"}
    client = PromClientImpl(clean.url)
    direct_config = replace(config, prometheus=replace(config.prometheus, recording_rules="off"))
    paths = {"prometheus, recorded": (client, recorded_config), "prometheus, direct": (client, direct_config),
             **{f"{kind}, direct": (PromClientImpl(tsdb.url), direct_config) for kind, tsdb in clean.tsdbs.items()
                if kind != "prometheus"}}
    for path, (on, cfg) in paths.items():
        found = {}

        want = "precomputed" if "recorded" in path else "direct"  # a group late on a busy machine: read again

        def judged(on=on, cfg=cfg, found=found, want=want) -> bool:
            found["report"] = evaluate(on, rules, cfg, NODES)
            report = found["report"]
            return (pending_of(report) == expected and report.rule_results == want
                    and {n: v.status for n, v in report.nodes.items()} == statuses)
        wait(judged, 20, f"the pending series and gpu004's failure on {path}",
             lambda found=found: f"read {verdicts(found['report'])}, pending {pending_of(found['report'])}, "
                                 f"{found['report'].rule_results}: {found['report'].rule_results_note}")
        report = found["report"]
        assert [c.status for c in report.nodes["gpu001"].pending] == ["pending"] and \
            report.nodes["gpu001"].checks == [], path
        safety = parse_config({"safety": {"breaker_min_nodes": 2, "max_out_of_service_fraction": 1.0}}, "t", {}).safety
        cluster = {n: SlurmNode(n, "idle", partitions=("gpu",), gres="gpu:8") for n in NODES}
        plan = plan_drains(report, cluster, rules, safety, 0, True)
        assert (plan.action("gpu004"), plan.counted) == ("skip:circuit-breaker", BreakerCount(1, 3, 0, 2.0)), path
    pending_rule = next(r for r in rules if r.id == "row-remap-pending")
    assert clean.query(pending_rule.alert_expr()) == []


def test_unknown_when_slurm_node_has_no_metrics_and_metrics_without_slurm_node_are_marked(clean):
    report, _, _ = run(clean, slurm_nodes=["gpu001", "gpu002", "gpu099"])
    assert report.nodes["gpu099"].status == "unknown"
    assert report.nodes["gpu003"].in_slurm is False and report.nodes["gpu004"].in_slurm is False
    assert report.nodes["gpu001"].in_slurm is True


def test_exported_alerts_fire_exactly_where_health_fails(clean):
    """The exported alert expressions, run by Prometheus itself at the moment `opsctl health` read, select
    the same node and device pairs that it reports."""
    clean.dcgm["gpu001"].hw.inject("xid:79", gpu=3)
    clean.dcgm["gpu002"].hw.inject("thermal", gpu=1)
    clean.dcgm["gpu003"].hw.inject("ib-down", hca=6)
    clean.nodeexp["gpu003"].rewrite()
    faults = {("gpu001", "xid-79", "gpu3"), ("gpu002", "gpu-temp-high", "gpu1"), ("gpu003", "ib-down", "mlx5_6")}
    config = config_for(clean, prometheus={"url": clean.url, "scrape_interval": "1s", "recording_rules": "off"})
    rules = load_catalog(config)

    def judged() -> tuple[set, float | None]:
        report = evaluate(PromClientImpl(clean.url), rules, config, NODES)
        return {(v.node, c.id, c.device) for v in report.nodes.values() for c in v.checks
                if not c.id.startswith("data-")}, report.query_time

    # An XID count series is born with the XID: its hold shows it after one to two holds.
    wait(lambda: faults <= judged()[0], 30, "every injected fault judged")
    seen, moment = judged()
    alerts = yaml.safe_load(render_prometheus_rules(rules))["groups"][0]["rules"]
    by_id = {r.id: r for r in rules}
    fired = set()
    for alert in alerts:
        rule = by_id[alert["labels"]["rule_id"]]
        for series in clean.query(alert["expr"], at=moment):
            raw = series["metric"].get(rule.device_label, "") if rule.device_label else ""
            device = f"gpu{raw}" if rule.device_label == "gpu" else raw
            fired.add((series["metric"]["node"], rule.id, device))
    assert faults <= fired
    assert fired == seen


def test_nan_and_infinite_values_never_read_as_ok(clean, tmp_path):
    """A rule whose value is NaN or infinite makes the check unknown on Prometheus. VictoriaMetrics
    (MetricsQL) drops NaN from its answers: there the series is simply absent, so the check cannot
    show unknown, but positive evidence is missing and a resume waits (docs/health.md)."""
    probe = {"source": "dcgm", "device_label": "", "op": ">", "threshold": 0, "severity": "fail", "action": "drain",
             "auto_resume": True, "description": "d", "remediation": "r"}
    (tmp_path / "probes.yaml").write_text(yaml.safe_dump({"rules": [
        {**probe, "id": "nan-probe", "expr": 'max by (${by}) (up{job="${dcgm}", node="gpu003"}) * 0 / 0'},
        {**probe, "id": "inf-probe", "expr": 'max by (${by}) (up{job="${dcgm}", node="gpu004"}) / 0'}]}))
    shipped = [r.id for r in load_catalog(config_for(clean))]
    config = config_for(clean, catalog={"files": [str(tmp_path / "probes.yaml")], "disable": shipped})
    rules = load_catalog(config)
    for kind, tsdb in clean.tsdbs.items():
        report = evaluate(PromClientImpl(tsdb.url), rules, config, NODES)
        assert report.nodes["gpu004"].status == "unknown" and report.nodes["gpu004"].drain_checks() == []
        evidence = read_evidence(PromClientImpl(tsdb.url), rules, {"nan-probe": {"gpu003"}}, report)
        if kind == "prometheus":
            assert [c.status for c in report.nodes["gpu003"].checks] == ["unknown"]
            assert evidence[("gpu003", "nan-probe")].status == "unknown"
        else:
            assert evidence[("gpu003", "nan-probe")].status == "no-data"
        assert evidence[("gpu003", "nan-probe")].status != "ok"  # never a resume on it


# ---- Counters that are young, and node check results that are old: plain text endpoints ----------------
class TextTarget:
    """A scrape target whose /metrics body a test sets (the exporters' exact text format)."""

    def __init__(self):
        self.body = ""
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                send_body(self, 200, target.body.encode(), "text/plain; version=0.0.4")

            def log_message(self, *args):
                pass

        self.server = serve(Handler)
        self.address = f"127.0.0.1:{self.server.server_port}"


class TextSite(Running):
    """Prometheus and VictoriaMetrics scraping, every second, one dcgm and one node target of gpu001."""

    def __init__(self, tmp):
        self.dcgm = {"gpu001": TextTarget()}
        self.nodeexp = {}
        self.node = TextTarget()
        scrape = [{"job_name": job, "static_configs": [{"targets": [t.address], "labels": {"node": "gpu001"}}]}
                  for job, t in (("dcgm", self.dcgm["gpu001"]), ("node", self.node))]
        self.tsdbs = {kind: Tsdb(kind, tmp, scrape) for kind in TSDBS}
        for tsdb in self.tsdbs.values():
            wait(lambda t=tsdb: len(t.query("up == 1")) == 2, what=f"targets up in {tsdb.kind}")

    def stop(self) -> None:
        super().stop()
        self.node.server.shutdown()


DBE = 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{gpu="0", Hostname="gpu001", DCGM_FI_DRIVER_VERSION="{driver}"}} {value}\n'
TEMP = 'DCGM_FI_DEV_GPU_TEMP{{gpu="{gpu}", Hostname="gpu001"}} 40\n'
HOLD = "6s"  # ecc-dbe-new's window here: a series younger than this is young


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    site = TextSite(tmp_path_factory.mktemp("texts"))
    yield site
    site.stop()


def text_config(texts, *rules):
    shipped = [r.id for r in load_catalog(parse_config({}, "t", {}))]
    return parse_config({"prometheus": {"url": texts.tsdbs["prometheus"].url, "scrape_interval": "1s"},
                         "hardware": {"gpus_per_node": 1},
                         "catalog": {"disable": [r for r in shipped if r not in rules],
                                     "overrides": {"ecc-dbe-new": {"hold": HOLD}}}}, "t", {})


def dcgm_body(value, driver="550.54.15"):
    return TEMP.format(gpu=0) + DBE.format(driver=driver, value=value)


def never_drains_for(texts, config, seconds):
    """Every engine judges gpu001 again and again for `seconds`: it never fails ecc-dbe-new."""
    rules = load_catalog(config)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for kind, tsdb in texts.tsdbs.items():
            report = evaluate(PromClientImpl(tsdb.url), rules, config, ["gpu001"])
            assert report.nodes["gpu001"].checks == [], (kind, report.nodes["gpu001"].checks)
        time.sleep(0.5)


def test_counters_that_start_above_zero_or_change_labels_are_no_increase_on_either_engine(texts):
    """A GPU that carried one volatile DBE since before monitoring began: its series first appears at 1
    (an exporter redeploy), later under a new driver label (a driver upgrade). MetricsQL's increase()
    alone counts such a first sample as an increase; the catalog's rule does not, on either engine. A
    real increase of the same counter still drains on both."""
    config = text_config(texts, "ecc-dbe-new")
    texts.node.body = ""
    texts.dcgm["gpu001"].body = TEMP.format(gpu=0)
    time.sleep(2.5)
    texts.dcgm["gpu001"].body = dcgm_body(1)  # the series is born at 1
    never_drains_for(texts, config, 9)
    texts.dcgm["gpu001"].body = dcgm_body(1, driver="560.35.03")  # a new series, the same value
    never_drains_for(texts, config, 9)
    texts.dcgm["gpu001"].body = dcgm_body(2, driver="560.35.03")  # a new DBE
    # Both engines have scraped it (a fixed wait of two scrapes was at times too short on a busy machine).
    wait(lambda: all(tsdb.query("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL == 2") for tsdb in texts.tsdbs.values()), 10,
         "the new DBE in both databases")
    report, _, _ = evaluate_everywhere(texts.tsdbs, config, ["gpu001"])
    assert [(c.id, c.device, c.status) for c in report.nodes["gpu001"].checks] == [("ecc-dbe-new", "gpu0", "fail")]


def test_old_node_check_results_warn_and_never_drain(texts):
    config = text_config(texts, "node-check-stale", "node-check")
    texts.dcgm["gpu001"].body = TEMP.format(gpu=0)
    result = 'opsctl_node_check{check="ib-port-state",device="node"} 0\n'
    texts.node.body = result + f"opsctl_node_check_timestamp_seconds {time.time() - 400:.3f}\n"
    time.sleep(5)  # held for two scrape intervals, for a series that existed before the hold
    report, _, _ = evaluate_everywhere(texts.tsdbs, config, ["gpu001"])
    verdict = report.nodes["gpu001"]
    [check] = verdict.checks
    assert (verdict.status, check.id, check.status, check.action) == ("warn", "node-check-stale", "warn", "report")
    assert check.evidence.startswith("node checks last ran 6m") and check.evidence.endswith("ago (threshold 5m)")
    assert verdict.drain_checks() == []
    texts.node.body = result + f"opsctl_node_check_timestamp_seconds {time.time():.3f}\n"
    time.sleep(5)
    report, _, _ = evaluate_everywhere(texts.tsdbs, config, ["gpu001"])
    assert report.nodes["gpu001"].status == "ok"


def test_an_xid_only_the_kernel_log_saw_drains_by_its_catalog_action(texts):
    """XID 62 never reached DCGM (NVIDIA/DCGM issue 235); `opsctl node check` saw it in the kernel log and
    exported its windowed count: xid-62 drains it on both engines, and 46 (RESET_GPU in NVIDIA's catalog)
    through the xid-reset family, each saying where it came from."""
    config = text_config(texts, "xid-62", "xid-reset")
    # DCGM itself saw no XID: a stock exporter's last-XID gauge reads 0.
    texts.dcgm["gpu001"].body = TEMP.format(gpu=0) + 'DCGM_FI_DEV_XID_ERRORS{gpu="0", Hostname="gpu001"} 0\n'
    count = 'opsctl_node_kernel_xid_count{{gpu="0",pci_bus_id="00000000:18:00.0",xid="{xid}",' \
            'window_size_in_ms="900000"}} {n}\n'
    texts.node.body = count.format(xid=62, n=1) + count.format(xid=46, n=2)
    time.sleep(5)  # held for two scrape intervals, for a series that existed before the hold
    report, _, _ = evaluate_everywhere(texts.tsdbs, config, ["gpu001"])
    found = {(c.id, c.device, c.status, c.action, c.xid, c.evidence) for c in report.nodes["gpu001"].checks}
    assert found == {("xid-62", "gpu0", "fail", "drain", 62, "gpu0 xid=62 count=1 (kernel log)"),
                     ("xid-reset", "gpu0", "fail", "drain", 46, "gpu0 xid=46 count=2 (kernel log)")}
    texts.node.body = count.format(xid=62, n=0) + count.format(xid=46, n=0)  # out of the window
    time.sleep(3)
    report, _, _ = evaluate_everywhere(texts.tsdbs, config, ["gpu001"])
    assert report.nodes["gpu001"].status == "ok"


def test_a_fatal_sxid_drains_naming_the_switch_and_a_non_fatal_one_is_reported_for_its_window(texts):
    """The node check's windowed SXid counts: a fatal SXid fails nvswitch-fatal (drain) and a non-fatal one
    warns nvswitch-errors, each naming the NVSwitch and the SXid, on both engines; each counts as handled for
    its series' window (window_size_in_ms), not the rule's hold; out of the window, the node is ok."""
    config = text_config(texts, "nvswitch-fatal", "nvswitch-errors")
    texts.dcgm["gpu001"].body = TEMP.format(gpu=0)
    count = 'opsctl_node_kernel_sxid_count{{nvswitch_pci="{pci}",sxid="{sxid}",fatal="{fatal}",' \
            'window_size_in_ms="900000"}} {n}\n'
    texts.node.body = (count.format(pci="00000000:06:00.0", sxid=20034, fatal="true", n=1)
                       + count.format(pci="00000000:05:00.0", sxid=12028, fatal="false", n=3))
    time.sleep(5)  # held for two scrape intervals, for a series that existed before the hold
    report, _, _ = evaluate_everywhere(texts.tsdbs, config, ["gpu001"])
    found = {(c.id, c.kind, c.device, c.status, c.action, c.memory, c.window_s, c.evidence)
             for c in report.nodes["gpu001"].checks}
    assert found == {
        ("nvswitch-fatal", "nvswitch", "00000000:06:00.0 sxid 20034", "fail", "drain", "window", 900.0,
         "00000000:06:00.0 sxid 20034 fatal, 1 in its window"),
        ("nvswitch-errors", "nvswitch", "00000000:05:00.0 sxid 12028", "warn", "report", "window", 900.0,
         "00000000:05:00.0 sxid 12028 non-fatal, 3 in its window")}
    texts.node.body = (count.format(pci="00000000:06:00.0", sxid=20034, fatal="true", n=0)
                       + count.format(pci="00000000:05:00.0", sxid=12028, fatal="false", n=0))
    time.sleep(3)
    report, _, _ = evaluate_everywhere(texts.tsdbs, config, ["gpu001"])
    assert report.nodes["gpu001"].status == "ok"


# ---- The recording stages: a condition recorded every round, held over its own history ----------------
CHECK = 'opsctl_node_check{{check="ib-port-state",device="{device}"}} {value}\n'


def staged_config(texts, hold="6s"):
    """node-check alone, held for `hold` (six samples a second apart, the first included), recorded every
    second as the scrapes come."""
    shipped = [r.id for r in load_catalog(parse_config({}, "t", {}))]
    return parse_config({"prometheus": {"url": texts.tsdbs["prometheus"].url, "scrape_interval": "1s"},
                         "hardware": {"gpus_per_node": 1},
                         "catalog": {"disable": [r for r in shipped if r != "node-check"],
                                     "overrides": {"node-check": {"hold": hold}}}}, "t", {})


def both_paths(texts, config, rules):
    """gpu001's checks and pending checks, from the recorded results and from the direct query."""
    prometheus = texts.tsdbs["prometheus"]
    prometheus.record(rules, config)
    client = PromClientImpl(prometheus.url)
    direct = replace(config, prometheus=replace(config.prometheus, recording_rules="off"))
    out = {}
    for path, cfg in (("recorded", config), ("direct", direct)):
        report = evaluate(client, rules, cfg, ["gpu001"])
        assert report.rule_results == ("precomputed" if path == "recorded" else "direct"), report.rule_results_note
        verdict = report.nodes["gpu001"]
        out[path] = (sorted((c.id, c.device, c.status) for c in verdict.checks),
                     sorted((c.id, c.device) for c in verdict.pending))
    return out


def test_a_breach_that_starts_within_the_hold_or_a_series_that_appears_breaching_waits_on_both_paths(texts):
    """A check that turns failed, and a finding whose series appears failed: while the hold has not
    elapsed both paths see them pending (the breaker counts them) and neither fails the node; once it
    has, both fail it. The recorded path holds over the condition that stage 1 recorded every round."""
    config = staged_config(texts)
    rules = load_catalog(config)
    texts.dcgm["gpu001"].body = TEMP.format(gpu=0)
    texts.node.body = CHECK.format(device="node", value=0)
    wait(lambda: texts.tsdbs["prometheus"].query("opsctl_node_check"), 10, "the check in Prometheus")
    time.sleep(7)  # the passing check has a whole hold of history
    both_paths(texts, config, rules)  # the groups run
    texts.node.body = CHECK.format(device="node", value=1) + CHECK.format(device="mlx5_2", value=1)
    wait(lambda: len(texts.tsdbs["prometheus"].query("opsctl_node_check == 1")) == 2, 10, "both findings scraped")
    time.sleep(1.5)  # stage 1 has recorded them: still far from the end of the hold
    early = both_paths(texts, config, rules)
    pending = [("node-check", "ib-port-state mlx5_2"), ("node-check", "ib-port-state node")]
    assert early["recorded"] == early["direct"] == ([], pending), early
    time.sleep(7)
    held = both_paths(texts, config, rules)
    failed = [("node-check", "ib-port-state mlx5_2", "fail"), ("node-check", "ib-port-state node", "fail")]
    assert held["recorded"] == held["direct"] == (failed, []), held
    texts.node.body = ""


def test_a_nan_condition_is_recorded_as_unknown_and_held_like_a_breach(texts, tmp_path):
    """A probe whose value is NaN: stage 1 records it (it is not certainly ok), the hold keeps it, and both
    paths read the node as unknown, never ok."""
    (tmp_path / "nan.yaml").write_text(yaml.safe_dump({"rules": [{
        "id": "nan-probe", "source": "dcgm", "device_label": "", "op": ">", "threshold": 0, "severity": "fail",
        "action": "drain", "description": "d", "remediation": "r",
        "expr": 'max by (${by}) (DCGM_FI_DEV_GPU_TEMP{job="${dcgm}"}) * 0 / 0'}]}))
    shipped = [r.id for r in load_catalog(parse_config({}, "t", {}))]
    config = parse_config({"prometheus": {"url": texts.tsdbs["prometheus"].url, "scrape_interval": "1s"},
                           "hardware": {"gpus_per_node": 1},
                           "catalog": {"files": [str(tmp_path / "nan.yaml")], "disable": shipped}}, "t", {})
    rules = load_catalog(config)
    texts.dcgm["gpu001"].body = TEMP.format(gpu=0)
    texts.node.body = ""
    time.sleep(3)
    both_paths(texts, config, rules)
    found = {}

    def judged() -> bool:
        found.update(both_paths(texts, config, rules))
        return found["recorded"][0] == [("nan-probe", "", "unknown")]
    wait(judged, 15, "the NaN held on the recorded path")
    assert found["recorded"] == found["direct"] == ([("nan-probe", "", "unknown")], []), found


# ---- Stage 0 as the catalog spells it: the same series as `(expr) != healthy`, on both engines ---------
NVLINK = 'DCGM_FI_DEV_NVLINK_{kind}_ERROR_COUNT_TOTAL{{gpu="{gpu}", Hostname="gpu001"}} {value}\n'
IB_COUNTER = 'node_infiniband_{name}_total{{device="{device}",port="1"}} {value}\n'
GPU_SERIES = '{name}{{gpu="{gpu}", Hostname="gpu001"}} {value}\n'
NFS = 'opsctl_node_nfs_rpc_retransmissions_total{{mount="{mount}"}} {value}\n'
# Clock event masks: none, idle and SW power cap, each hardware bit alone and both, those beside the bits
# between them (16, 32), bits above 64, and the values no exporter should send (NaN, infinities, negative).
CLOCK_MASKS = [0, 5, 8, 64, 72, 48, 56, 200, 328, 1.5, "NaN", "+Inf", "-Inf", -8, -72, -100]
OWN_STAGE_ZERO = {"nvlink-errors-rising", "ib-errors", "clocks-hw-slowdown", "pcie-replays", "sbe-storm",
                  "nfs-retransmissions"}


def test_a_rules_own_unhealthy_expression_finds_what_its_expression_finds(texts):
    """The rules that spell stage 0 themselves (catalog.yaml, `unhealthy`, with its `candidates` inline):
    nvlink-errors-rising and ib-errors drop the zero terms of their sums before the `or`s, the single counters
    guard only what rises, clocks-hw-slowdown takes the mask of the GPUs its filter kept. On either engine
    each answers what `(expr) != 0` answers, series and values, for counters that rise, stay flat at zero
    or above it, and one that is young, and for every kind of clock event mask."""
    holds = {rule: {"hold": "4s"} for rule in OWN_STAGE_ZERO - {"clocks-hw-slowdown"}}
    config = parse_config({"prometheus": {"url": texts.tsdbs["prometheus"].url, "scrape_interval": "1s"},
                           "hardware": {"gpus_per_node": 4}, "catalog": {"overrides": holds}}, "t", {})
    rules = [r for r in load_catalog(config) if r.unhealthy]
    assert {r.id for r in rules} == OWN_STAGE_ZERO
    assert [r.id for r in rules if r.candidates] == ["clocks-hw-slowdown"]

    def bodies(step: int) -> tuple[str, str]:
        dcgm = TEMP.format(gpu=0)
        dcgm += NVLINK.format(kind="CRC_FLIT", gpu=0, value=100 + 50 * step)  # rises
        dcgm += NVLINK.format(kind="REPLAY", gpu=0, value=7 + step)  # rises, slower
        dcgm += NVLINK.format(kind="CRC_FLIT", gpu=1, value=0)  # flat at zero
        dcgm += NVLINK.format(kind="CRC_DATA", gpu=2, value=42)  # flat above zero
        for name in ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"):
            dcgm += GPU_SERIES.format(name=name, gpu=0, value=3 * step)  # rises
            dcgm += GPU_SERIES.format(name=name, gpu=1, value=9)  # flat above zero
        dcgm += "".join(GPU_SERIES.format(name="DCGM_FI_DEV_CLOCKS_EVENT_REASONS", gpu=gpu, value=mask)
                        for gpu, mask in enumerate(CLOCK_MASKS))
        node = NFS.format(mount="/home", value=2 * step) + NFS.format(mount="/scratch", value=5)
        if step >= 6:
            dcgm += NVLINK.format(kind="RECOVERY", gpu=3, value=1000 + 10 * step)  # young
            dcgm += GPU_SERIES.format(name="DCGM_FI_DEV_PCIE_REPLAY_COUNTER", gpu=3, value=500 + step)  # young
            node += NFS.format(mount="/data", value=70 + step)  # young
        node += IB_COUNTER.format(name="link_error_recovery", device="mlx5_0", value=step)
        node += IB_COUNTER.format(name="link_downed", device="mlx5_0", value=3)
        node += IB_COUNTER.format(name="port_errors_received", device="mlx5_1", value=0)
        return dcgm, node

    for step in range(9):
        texts.dcgm["gpu001"].body, texts.node.body = bodies(step)
        time.sleep(1)
    at = time.time() - 1
    for kind, tsdb in texts.tsdbs.items():
        for rule in rules:
            def answer(expr, tsdb=tsdb):
                return sorted((tuple(sorted(s["metric"].items())), s["value"][1]) for s in tsdb.query(expr, at))
            plain = answer(f"({rule.plot_expr or rule.expr}) != 0")
            assert plain, (kind, rule.id)  # something rises
            assert answer(precomputed.unhealthy_expr(rule)) == plain, (kind, rule.id)
    texts.dcgm["gpu001"].body, texts.node.body = TEMP.format(gpu=0), ""
