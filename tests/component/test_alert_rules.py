"""The alert rules that `opsctl rules export --format prometheus` writes: promtool accepts them, and every
alert has a promtool unit test that fires and one that does not (tests/component/alerts/).

The alerts read the results that the recording groups of the same file record (opsctl.health.precomputed):
every promtool test evaluates the recording groups first and the alerts after them, at each step
(group_eval_order), from the raw series, so each test proves the recording stages and the alert on them
together. promtool evaluates every group once per evaluation_interval (1m), so the rules are exported with
that recording interval, the one they are written for.

The unit tests compare labels only, against a copy of the rules without annotations; one test below
checks the annotations of the real file, so that their templates are proven to render."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from opsctl.config import parse_config
from opsctl.health import precomputed
from opsctl.health.catalog import load_catalog
from opsctl.health.xid import xid_catalog
from tests.conftest import opsctl

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool (make deps-lab)")
CASES = Path(__file__).parent / "alerts" / "opsctl-rules.test.yaml"
EVALUATION_INTERVAL = "1m"  # the cases' evaluation_interval
XID_SERIES = 'DCGM_EXP_XID_ERRORS_COUNT{{job="dcgm", node="gpu020", Hostname="gpu020", gpu="3", xid="{xid}", ' \
             'window_size_in_ms="300000"}}'


# A bound on a hung promtool, not a timing: `test rules` evaluates every rule of the export at every step of
# every case (about 60 s alone on two cores, and twice that beside the other test streams).
PROMTOOL_TIMEOUT_S = 300


def promtool(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT_S)


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rules") / "opsctl.rules.yml"
    config = path.parent / "config.yaml"
    config.write_text(yaml.safe_dump({"prometheus": {"recording_interval": EVALUATION_INTERVAL}}))
    path.write_text(opsctl("rules", "export", "--format", "prometheus", env={"OPSCTL_CONFIG": str(config)}).stdout)
    return path


def in_order(doc: dict) -> list[str]:
    """The groups in the order promtool must evaluate them at each step: the recording stages first."""
    names = [g["name"] for g in doc["groups"]]
    return [n for n in names if n.startswith(precomputed.GROUP_PREFIX)] + \
        [n for n in names if not n.startswith(precomputed.GROUP_PREFIX)]


def alerts(path: Path) -> dict[str, dict]:
    return {r["alert"]: r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"] if "alert" in r}


def xid_cases() -> list[dict]:
    """One firing and one quiet group per XID rule of the catalog: the same shape, so generated."""
    cases = []
    for rule in load_catalog(parse_config({}, "t", {})):
        if rule.xid is None:
            continue
        name = f"OpsctlXid{rule.xid}"
        # Every rule holds two scrape intervals (1m with the default 30s): the count rises at 75s and the
        # alert fires once it has held, for a series that existed before the hold.
        fires = {"series": XID_SERIES.format(xid=rule.xid), "values": "0x4 1x8"}
        other = {"series": XID_SERIES.format(xid=999), "values": "1x12"}
        labels = {"severity": rule.severity, "action": rule.action, "rule_id": f"xid-{rule.xid}", "node": "gpu020",
                  "job": "dcgm", "gpu": "3", "window_size_in_ms": "300000"}  # kept by the rule's ${by} and xid
        cases.append({"name": f"{name} fires on a new XID {rule.xid} in the window", "interval": "15s",
                      "input_series": [fires], "alert_rule_test": [
                          {"eval_time": "3m", "alertname": name, "exp_alerts": [{"exp_labels": labels}]}]})
        cases.append({"name": f"{name} does not fire on another XID or a count of 0", "interval": "15s",
                      "input_series": [{**fires, "values": "0x12"}, other], "alert_rule_test": [
                          {"eval_time": "3m", "alertname": name, "exp_alerts": []}]})
    return cases


def xid_family_cases() -> list[dict]:
    """Per XID family: a code of the family fires (windowed count, and but for xid-report the
    last-XID gauge of a target without the count); a code of another family and a count of 0 do not."""
    rules = load_catalog(parse_config({}, "t", {}))
    own = {rule.xid for rule in rules if rule.xid is not None}
    codes = {f"xid-{family}": codes for family, codes in xid_catalog().family_codes(own).items()}
    codes["xid-unknown"] = [999]
    cases = []
    for rule in (r for r in rules if r.xid_series):
        mine = codes[rule.id][len(codes[rule.id]) // 2]
        other = next(c for rid, cs in codes.items() if rid != rule.id for c in cs)
        name = "OpsctlXid" + "".join(part.title() for part in rule.id.split("-")[1:])
        fires = {"series": XID_SERIES.format(xid=mine), "values": "0x4 1x8"}
        labels = {"severity": rule.severity, "action": rule.action, "rule_id": rule.id, "node": "gpu020",
                  "job": "dcgm", "gpu": "3", "xid": str(mine), "window_size_in_ms": "300000"}
        gauge = {"series": 'DCGM_FI_DEV_XID_ERRORS{job="dcgm", node="gpu021", Hostname="gpu021", gpu="5"}',
                 "values": f"0x4 {mine}x8"}
        gauge_labels = {"severity": rule.severity, "action": rule.action, "rule_id": rule.id, "node": "gpu021",
                        "job": "dcgm", "gpu": "5", "xid_source": "gauge"}
        cases.append({"name": f"{name} fires on XID {mine}, windowed or the last-XID gauge", "interval": "15s",
                      "input_series": [fires, gauge], "alert_rule_test": [
                          {"eval_time": "3m", "alertname": name,
                           # Reported codes never come from the gauge (catalog.yaml, xid-report).
                           "exp_alerts": [{"exp_labels": labels}] + ([{"exp_labels": gauge_labels}]
                                                                     if rule.id != "xid-report" else [])}]})
        quiet_gauge = {**gauge, "values": f"0x4 {other}x8"}
        cases.append({"name": f"{name} does not fire on XID {other} or a count of 0", "interval": "15s",
                      "input_series": [{**fires, "values": "0x12"}, {**fires, "series": XID_SERIES.format(
                          xid=other)}, quiet_gauge], "alert_rule_test": [
                          {"eval_time": "3m", "alertname": name, "exp_alerts": []}]})
    return cases


def test_promtool_checks_the_export(exported):
    proc = promtool("check", "rules", str(exported))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recording = [r for g in yaml.safe_load(exported.read_text())["groups"] for r in g["rules"] if "record" in r]
    config = parse_config({"prometheus": {"recording_interval": EVALUATION_INTERVAL}}, "t", {})
    groups = precomputed.recording_groups(load_catalog(config), config)
    assert len(recording) == sum(len(g["rules"]) for g in groups)  # one or two stages; the XID group three
    assert f"SUCCESS: {len(alerts(exported)) + len(recording)} rules found" in proc.stdout


def test_every_alert_fires_in_one_unit_test_and_stays_quiet_in_another(exported, tmp_path):
    doc = yaml.safe_load(exported.read_text())
    assert yaml.safe_load(CASES.read_text())["evaluation_interval"] == EVALUATION_INTERVAL
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "labels-only.rules.yml").write_text(yaml.safe_dump(doc))
    # The XID cases, two per XID rule, run against the XID alerts and their recording groups alone: promtool
    # evaluates every rule of its files at every step of every case, and the others would only stay quiet.
    def xid_group(group: dict) -> bool:
        return group["name"] == precomputed.XID_GROUP or group["name"].startswith(precomputed.GROUP_PREFIX + "xid-")

    xid_doc = {"groups": [g for g in doc["groups"] if xid_group(g)] + [
        {**g, "rules": [r for r in g["rules"] if r.get("alert", "").startswith("OpsctlXid")]}
        for g in doc["groups"] if not g["name"].startswith(precomputed.GROUP_PREFIX)]}
    xid_doc["groups"] = [g for g in xid_doc["groups"] if g["rules"]]
    (tmp_path / "xid.rules.yml").write_text(yaml.safe_dump(xid_doc))
    tests = yaml.safe_load(CASES.read_text())
    tests["rule_files"] = ["labels-only.rules.yml"]
    tests["group_eval_order"] = in_order(doc)
    xid_tests = {**tests, "rule_files": ["xid.rules.yml"], "group_eval_order": in_order(xid_doc),
                 "tests": xid_cases() + xid_family_cases()}
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    (tmp_path / "xid-tests.yml").write_text(yaml.safe_dump(xid_tests, sort_keys=False))

    fires, quiet = set(), set()
    for case in tests["tests"] + xid_tests["tests"]:
        for check in case["alert_rule_test"]:
            (fires if check["exp_alerts"] else quiet).add(check["alertname"])
    names = set(alerts(exported))
    assert names - fires == set(), "alerts without a firing test"
    assert names - quiet == set(), "alerts without a test where they stay quiet"

    for cases in ("tests.yml", "xid-tests.yml"):
        proc = promtool("test", "rules", str(tmp_path / cases))
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_annotations_render_with_the_alerts_own_labels_and_value(exported, tmp_path):
    rule = alerts(exported)["OpsctlRowRemapFailure"]
    test = {"rule_files": [str(exported)], "evaluation_interval": EVALUATION_INTERVAL,
            "group_eval_order": in_order(yaml.safe_load(exported.read_text())), "tests": [{
        "interval": "15s",
        "input_series": [{"series": 'DCGM_FI_DEV_ROW_REMAP_FAILURE{job="dcgm", node="gpu002", gpu="2"}',
                          "values": "1x4"}],
        "alert_rule_test": [{"eval_time": "1m", "alertname": "OpsctlRowRemapFailure", "exp_alerts": [{
            "exp_labels": {"severity": "fail", "action": "drain", "rule_id": "row-remap-failure", "job": "dcgm",
                           "node": "gpu002", "gpu": "2"},
            "exp_annotations": {"summary": rule["annotations"]["summary"],
                                "remediation": rule["annotations"]["remediation"],
                                "description": "row-remap-failure: value 1 > 0 on gpu002"}}]}]}]}
    (tmp_path / "annotations.yml").write_text(yaml.safe_dump(test))
    proc = promtool("test", "rules", str(tmp_path / "annotations.yml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.skipif(shutil.which("vmalert") is None, reason="needs vmalert (victoria-metrics)")
def test_the_export_is_valid_metricsql_for_vmalert(exported, tmp_path):
    """The recording stages and the alerts stay valid for a site whose ruler is vmalert (docs/health.md,
    sharding): vmalert parses every expression as MetricsQL, and refuses a file with one it cannot."""
    proc = subprocess.run(["vmalert", "-dryRun", f"-rule={exported}"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    broken = tmp_path / "broken.rules.yml"
    broken.write_text(exported.read_text() + '  - record: opsctl:broken\n    expr: "sum(("\n')
    assert subprocess.run(["vmalert", "-dryRun", f"-rule={broken}"], capture_output=True, timeout=60).returncode != 0
