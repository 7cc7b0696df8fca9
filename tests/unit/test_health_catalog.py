"""The rule catalog: shipped defaults, user extension and override, holds, and the Prometheus export."""

import re

import pytest
import yaml

from opsctl.config import parse_config
from opsctl.config.schema import duration_seconds
from opsctl.errors import ConfigError
from opsctl.health.catalog import held, load_catalog
from opsctl.health.export import alert_name, render_prometheus_rules
from opsctl.health.units import age

DRAIN_XIDS = [48, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 154, 155]
REPORT_XIDS = [13, 31, 43, 45, 68, 63, 92, 94]


def rules_of(raw=None):
    return {r.id: r for r in load_catalog(parse_config(raw or {}, "t", {}))}


def test_xid_defaults_follow_the_issue():
    rules = rules_of()
    for xid in DRAIN_XIDS:
        rule = rules[f"xid-{xid}"]
        assert (rule.severity, rule.action, rule.xid, rule.auto_resume) == ("fail", "drain", xid, False)
        assert f'xid="{xid}"' in rule.expr and "DCGM_EXP_XID_ERRORS_COUNT" in rule.expr
    for xid in REPORT_XIDS:
        assert (rules[f"xid-{xid}"].severity, rules[f"xid-{xid}"].action) == ("warn", "report")


@pytest.mark.parametrize("rid,severity,action", [
    ("row-remap-failure", "fail", "drain"), ("row-remap-pending", "fail", "drain"), ("ecc-dbe-new", "fail", "drain"),
    ("remapped-rows-high", "fail", "drain"), ("gpu-count", "fail", "drain"), ("ib-down", "fail", "drain"),
    ("ib-degraded", "fail", "drain"), ("gpu-temp-high", "warn", "report"), ("clocks-hw-slowdown", "warn", "report"),
    ("nvlink-errors-rising", "warn", "report"), ("pcie-replays", "warn", "report"), ("sbe-storm", "warn", "report"),
    ("ib-errors", "warn", "report"),
])
def test_non_xid_defaults(rid, severity, action):
    rule = rules_of()[rid]
    assert (rule.severity, rule.action) == (severity, action)
    assert rule.description and rule.remediation and "${" not in rule.expr


def test_ib_rules_use_the_hardware_allowlist_and_rate():
    rules = rules_of({"hardware": {"ib_devices": "mlx5_ib[0-7]", "ib_rate_bytes_per_second": 2.5e10}})
    for rid in ("ib-down", "ib-degraded", "ib-errors"):
        assert 'device=~"mlx5_ib[0-7]"' in rules[rid].expr
    assert rules["ib-degraded"].threshold == 2.5e10
    assert rules["gpu-count"].threshold == 8


def test_hold_is_in_the_promql():
    rules = rules_of({"catalog": {"overrides": {"gpu-temp-high": {"hold": "90s", "threshold": 80}}}})
    expr = 'min_over_time(DCGM_FI_DEV_GPU_TEMP{job="dcgm"}[90s])'
    assert rules["gpu-temp-high"].expr == expr
    # Everything but the certainly-ok series: a NaN or infinite value is returned, never read as ok.
    assert rules["gpu-temp-high"].alert_expr() == f"({expr}) unless (({expr}) <= 80 > -Inf < +Inf)"


@pytest.mark.parametrize("hold,interval,effective", [("30s", None, "1m"), ("50s", "30s", "1m"), ("10s", "6s", "12s"),
                                                     ("0s", "45s", "90s"), ("2m", "30s", "2m")])
def test_a_hold_shorter_than_two_scrape_intervals_is_raised_to_two(hold, interval, effective):
    raw = {"catalog": {"overrides": {"ib-down": {"hold": hold}}}}
    if interval:
        raw["prometheus"] = {"scrape_interval": interval}
    rule = rules_of(raw)["ib-down"]
    assert rule.hold == effective
    assert f"[{effective}])" in rule.expr and f"[{hold}]" not in rule.expr.replace(f"[{effective}]", "")


def test_a_short_range_window_written_into_the_expr_is_refused_naming_the_rule():
    expr = 'max_over_time(node_infiniband_state_id{job="${node}"}[30s])'
    raw = {"catalog": {"overrides": {"ib-down": {"expr": expr}}}}
    with pytest.raises(ConfigError, match="rule 'ib-down': its range window .* shorter than two scrape intervals") \
            as err:
        rules_of(raw)
    assert err.value.exit_code == 2


@pytest.mark.parametrize("interval", ["30s", "45s", "5s"])
def test_every_rule_holds_for_at_least_two_scrape_intervals(interval):
    """One missed scrape of one series must not drain a node: every rule, the ones without a hold of their
    own too, holds for max(hold, 2 x scrape_interval), inside its PromQL."""
    rules = load_catalog(parse_config({"prometheus": {"scrape_interval": interval}}, "t", {}))
    scrape = duration_seconds(interval)
    for rule in rules:
        assert duration_seconds(rule.hold) >= 2 * scrape, rule.id
        if rule.plot_expr:  # held by opsctl: sampled once per scrape over the hold, and existing before it
            assert f")[{rule.hold}:{interval}]" in rule.expr and f"offset {rule.hold})" in rule.expr, rule.id
            assert rule.plot_expr in rule.expr
        else:  # holds by itself: its range selectors span the hold, or its series must be there a hold ago
            assert f"[{rule.hold}]" in rule.expr or f"offset {rule.hold})" in rule.expr, rule.id
    by_id = {r.id: r for r in rules}
    assert not by_id["ib-down"].plot_expr and by_id["gpu-count"].plot_expr


def test_gpu_count_takes_the_most_gpus_seen_over_the_hold():
    """A GPU series missing from one scrape lowers the count at that scrape only: the rule reads the
    highest count over the hold, so only a GPU gone for the whole hold fails it."""
    rule = rules_of()["gpu-count"]
    inner = rule.plot_expr
    assert rule.hold == "1m" and inner.startswith("count by (node, job, instance) (DCGM_FI_DEV_GPU_TEMP")
    assert rule.expr == f"(max_over_time(({inner})[1m:30s])) and count_over_time(({inner})[1m:30s] offset 1m)"


@pytest.mark.parametrize("op,value", [
    (">", "min_over_time((E)[1m:30s])"), (">=", "min_over_time((E)[1m:30s])"),
    ("<", "max_over_time((E)[1m:30s])"), ("<=", "max_over_time((E)[1m:30s])"),
    ("==", "(max_over_time((E)[1m:30s]) != 79) or min_over_time((E)[1m:30s])"),
    ("!=", "min_over_time(((E) == 79)[1m:30s]) or max_over_time((E)[1m:30s])"),
])
def test_the_held_value_is_the_one_that_breaches_least(op, value):
    assert held("E", op, 79.0, "1m", "30s") == f"({value}) and count_over_time((E)[1m:30s] offset 1m)"


def test_the_gauge_xid_rule_is_held_with_its_equality():
    rule = rules_of({"catalog": {"xid_source": "gauge"}})["xid-79"]
    assert (rule.op, rule.threshold) == ("==", 79)
    assert rule.expr.startswith('((max_over_time((DCGM_FI_DEV_XID_ERRORS{job="dcgm"})[1m:30s]) != 79) or ')


COUNTER = re.compile(r"\b(increase|rate)\((\w+\{.*?\})\[([0-9]+[smh])\]\)")


def test_every_counter_rule_needs_the_series_at_the_window_start():
    """MetricsQL counts a young series' first sample as an increase: every increase() and rate() of the
    catalog is joined with its own counter at the window's start, so both engines agree."""
    found = 0
    for rule in rules_of().values():
        for _, selector, window in COUNTER.findall(rule.expr):
            found += 1
            assert window == rule.hold, rule.id
            assert f"[{window}]) and {selector} offset {window}" in rule.expr, (rule.id, selector)
        assert "delta(" not in rule.expr and "irate(" not in rule.expr
    assert found == 1 + 1 + 4 + 3 + 1 + 1  # pcie-replays, sbe-storm, nvlink, ib-errors, nfs, pcie-aer


def test_a_new_dbe_is_the_counter_above_its_lowest_in_the_hold():
    """A step, not a rate: one sample before it is enough history, and a series that first appears above
    zero reads 0 on every engine (min_over_time has no first-sample rule to differ on)."""
    expr = rules_of()["ecc-dbe-new"].expr
    assert "increase(" not in expr and "min_over_time(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" in expr


def test_node_check_stale_warns_and_its_threshold_is_overridable():
    rule = rules_of()["node-check-stale"]
    assert (rule.severity, rule.action, rule.source, rule.device_label, rule.op, rule.threshold) == \
        ("warn", "report", "node", "", ">", 300)
    assert 'time() - max by (node, job, instance) (opsctl_node_check_timestamp_seconds{job="node"})' in rule.expr
    assert rule.format_evidence("", 312) == "node checks last ran 5m12s ago (threshold 5m)"
    assert rules_of({"catalog": {"overrides": {"node-check-stale": {"threshold": 900}}}})["node-check-stale"] \
        .threshold == 900
    assert "node-check-stale" not in rules_of({"prometheus": {"jobs": {"node": None}}})


@pytest.mark.parametrize("seconds,text", [(312, "5m12s"), (300, "5m"), (42.5, "42s"), (3725, "1h2m5s"), (0, "0s")])
def test_ages_are_written_in_hours_minutes_and_seconds(seconds, text):
    assert age(seconds) == text


def test_every_rule_keeps_the_target_labels_and_gpu_count_uses_them_too():
    rules = rules_of({"node_mapping": {"target_label": None}})
    assert "on(job, instance) (max by (job, instance) (up{" in rules["gpu-count"].expr
    assert "node" not in rules["gpu-count"].expr.replace("node_", "")


@pytest.mark.parametrize("source,expected", [
    ("auto", ["DCGM_EXP_XID_ERRORS_COUNT", "DCGM_FI_DEV_XID_ERRORS", 'xid_source", "gauge"']),
    ("window", ["DCGM_EXP_XID_ERRORS_COUNT"]),
    ("gauge", ["DCGM_FI_DEV_XID_ERRORS"]),
])
def test_xid_sources(source, expected):
    rule = rules_of({"catalog": {"xid_source": source}})["xid-79"]
    assert all(text in rule.expr for text in expected)
    assert (rule.op, rule.threshold) == (("==", 79) if source == "gauge" else (">", 0))


def test_a_site_without_node_exporter_loses_the_rules_that_need_it():
    rules = rules_of({"prometheus": {"jobs": {"node": None}}})
    assert not {"ib-down", "ib-degraded", "ib-errors"} & set(rules) and "xid-79" in rules


def test_sticky_rules_have_memory():
    rules = rules_of()
    assert {rid: rules[rid].memory for rid in ("xid-79", "ecc-dbe-new", "remapped-rows-high", "row-remap-failure",
                                               "row-remap-pending", "ib-down")} == {
        "xid-79": "window", "ecc-dbe-new": "window", "remapped-rows-high": "level", "row-remap-failure": "level",
        "row-remap-pending": "none", "ib-down": "none"}


def test_user_file_adds_and_replaces_rules(tmp_path):
    extra = tmp_path / "site.yaml"
    extra.write_text(yaml.safe_dump({"rules": [
        {"id": "gpu-power-low", "source": "dcgm", "device_label": "gpu", "expr": "DCGM_FI_DEV_POWER_USAGE",
         "op": "<", "threshold": 50, "severity": "warn", "action": "report", "description": "d", "remediation": "r"},
        {"id": "gpu-temp-high", "source": "dcgm", "device_label": "gpu", "expr": "DCGM_FI_DEV_GPU_TEMP",
         "op": ">", "threshold": 95, "severity": "fail", "action": "drain", "description": "d", "remediation": "r"},
    ]}))
    rules = rules_of({"catalog": {"files": [str(extra)]}})
    assert rules["gpu-power-low"].threshold == 50
    assert (rules["gpu-temp-high"].threshold, rules["gpu-temp-high"].action) == (95, "drain")


def test_candidates_go_with_the_stage_zero_they_were_spelled_for():
    """An override of expr drops the shipped unhealthy and candidates (spelled after the shipped expr); one
    of unhealthy alone drops the shipped candidates unless it names them too."""
    clocks, mask = "clocks-hw-slowdown", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
    shipped = rules_of()[clocks]
    assert "${candidates}" in shipped.unhealthy and "% 128" in shipped.candidates
    expr = rules_of({"catalog": {"overrides": {clocks: {"expr": mask}}}})[clocks]
    assert (expr.unhealthy, expr.candidates) == ("", "")
    own = rules_of({"catalog": {"overrides": {clocks: {"unhealthy": mask}}}})[clocks]
    assert (own.unhealthy, own.candidates) == (mask, "")


def test_disable_removes_a_rule():
    assert "sbe-storm" not in rules_of({"catalog": {"disable": ["sbe-storm"]}})


@pytest.mark.parametrize("raw,message", [
    ({"catalog": {"overrides": {"nope": {"threshold": 1}}}}, "catalog.overrides.nope: no such rule"),
    ({"catalog": {"overrides": {"ib-down": {"source": "x"}}}}, "catalog.overrides.ib-down.source: not overridable"),
    ({"catalog": {"overrides": {"ib-down": {"severity": "warn"}}}}, "only severity fail may drain"),
    ({"catalog": {"overrides": {"ib-down": {"op": "=~"}}}}, "op must be one of"),
    ({"catalog": {"overrides": {"ib-down": {"hold": "soon"}}}}, "not a duration"),
    ({"catalog": {"disable": ["nope"]}}, "catalog.disable: no such rule"),
    ({"catalog": {"overrides": {"pcie-replays": {"candidates": "x != 0"}}}}, "candidates and .* go together"),
    ({"catalog": {"overrides": {"pcie-replays": {"unhealthy": "${candidates} != 0"}}}}, "go together"),
    ({"catalog": {"overrides": {"pcie-replays": {"unhealthy": "${gpus} != 0"}}}}, "unknown placeholder in unhealthy"),
])
def test_bad_catalog_changes_are_config_errors(raw, message):
    with pytest.raises(ConfigError, match=message):
        rules_of(raw)


def test_bad_user_file_is_a_config_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - id: Bad Id\n    expr: up\n")
    with pytest.raises(ConfigError, match="id must be lowercase"):
        rules_of({"catalog": {"files": [str(bad)]}})
    bad.write_text("rules:\n  - id: x\n    colour: red\n")
    with pytest.raises(ConfigError, match="unknown key 'colour'"):
        rules_of({"catalog": {"files": [str(bad)]}})


def test_export_matches_the_evaluated_promql():
    config = parse_config({"catalog": {"overrides": {"ib-down": {"hold": "75s"}}}}, "t", {})
    rules = load_catalog(config)
    doc = yaml.safe_load(render_prometheus_rules(rules))
    alerts = {a["labels"]["rule_id"]: a for a in doc["groups"][0]["rules"]}
    assert set(alerts) == {r.id for r in rules}
    for rule in rules:
        alert = alerts[rule.id]
        assert alert["expr"] == rule.alert_expr()
        assert alert["alert"] == alert_name(rule.id)
        assert alert["labels"] == {"severity": rule.severity, "action": rule.action, "rule_id": rule.id}
        assert "for" not in alert  # the hold is inside the PromQL, so alerts and opsctl agree
    assert "[75s]" in alerts["ib-down"]["expr"]
    assert "[90s:30s]" in alerts["gpu-count"]["expr"]  # three samples over two scrape intervals, as opsctl holds it


def test_a_renamed_rules_old_id_still_overrides_and_disables_it():
    from opsctl.health.catalog import RENAMED

    assert RENAMED == {"nvlink-errors": "nvlink-errors-rising"}
    rules = {r.id: r for r in load_catalog(parse_config(
        {"catalog": {"overrides": {"nvlink-errors": {"threshold": 7}}}}, "t", {}))}
    assert "nvlink-errors" not in rules and rules["nvlink-errors-rising"].threshold == 7
    assert "nvlink-errors-rising" not in {r.id for r in load_catalog(parse_config(
        {"catalog": {"disable": ["nvlink-errors"]}}, "t", {}))}
