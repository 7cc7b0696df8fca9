"""Rule results that Prometheus recorded (opsctl.health.precomputed): `opsctl health` reads them when they
are there, fresh and its own, else queries the rules directly and says so in one line; both paths decide
the same. The component tier proves the same against a real Prometheus that evaluates the exported rules."""

import random
from dataclasses import replace

import pytest
import yaml

from opsctl.config import parse_config
from opsctl.health import precomputed, xid_inputs
from opsctl.health.catalog import PENDING_LABEL, condition, hold_samples, load_catalog, promql_number
from opsctl.health.export import render_prometheus_rules
from opsctl.prom.client import Sample
from tests.unit.fakes import World


def decisions(world, *args):
    code, nodes, summary = world.json(*args)
    return code, {n: (v["status"], v["action"], v["checks"]) for n, v in nodes.items()}, summary


def faulty_world(tmp_path, seed: int) -> World:
    world = World(tmp_path)
    chosen = random.Random(seed)
    for rule in chosen.sample(world.prom.rules, 6):
        for node in chosen.sample(sorted(world.slurm.state), 2):
            world.prom.breach(rule.id, node)
    return world


@pytest.mark.parametrize("seed", range(5))
def test_recorded_and_direct_results_decide_the_same(tmp_path, seed):
    recorded = faulty_world(tmp_path / "recorded", seed)
    direct = faulty_world(tmp_path / "direct", seed)
    direct.prom.recorded = {}
    code, nodes, summary = decisions(recorded, "--drain", "--dry-run")
    code_d, nodes_d, summary_d = decisions(direct, "--drain", "--dry-run")
    assert (code, nodes) == (code_d, nodes_d)
    assert any(v[0] == "fail" for v in nodes.values())  # the case has failing nodes to decide on
    assert (summary["rule_results"], summary_d["rule_results"]) == ("precomputed", "direct")
    assert summary["queries"] == 5 and summary_d["queries"] == 5 + len(direct.prom.rules)
    assert not any(q == rule.alert_expr() for q in recorded.prom.asked for rule in recorded.prom.rules)


def test_without_recording_rules_every_rule_is_queried_directly_and_the_run_says_so_in_one_line(tmp_path):
    world = World(tmp_path)
    world.prom.recorded = {}
    world.prom.breach("xid-79", "gpu040", "3")
    assert world.run("health") == 1
    assert "note:" not in world.stdout  # the table keeps its shape
    notes = world.stderr.splitlines()
    assert notes == ["note: recorded rule results not used for every rule, queried directly (not recorded "
                     "(opsctl rules export installs the recording rules): " + ", ".join(
                         r.id for r in world.prom.rules[:3]) + f" and {len(world.prom.rules) - 3} more)"]
    assert "gpu040" in world.stdout
    _, _, summary = world.json()
    assert summary["rule_results"] == "direct" and summary["rule_results_note"] == notes[0][len("note: "):]


def test_a_stale_heartbeat_sends_that_rule_to_the_direct_path_only(tmp_path):
    world = World(tmp_path)  # scrape interval 30s: results are fresh for 60s
    world.prom.recorded["xid-79"] = 61.0
    world.prom.breach("xid-79", "gpu040", "3")
    code, nodes, summary = decisions(world)
    assert code == 1 and nodes["gpu040"][0] == "fail"
    assert summary["rule_results"] == "mixed" and summary["queries"] == 6
    assert summary["rule_results_note"] == (f"recorded rule results not used for 1 of {len(world.prom.rules)} "
                                            "rules, queried directly (older than 60s (2 x "
                                            "prometheus.recording_interval): xid-79)")
    world.prom.recorded["xid-79"] = 59.0
    assert decisions(world)[2]["rule_results"] == "precomputed"


def test_the_recording_interval_sets_how_old_results_may_be(tmp_path):
    world = World(tmp_path, raw={"prometheus": {"recording_interval": "2m"}})
    world.prom.record_all(age=239.0)
    assert decisions(world)[2]["rule_results"] == "precomputed"
    world.prom.record_all(age=241.0)
    assert decisions(world)[2]["rule_results"] == "direct"


def test_results_recorded_from_another_expression_are_never_used(tmp_path):
    """A config changed since the export (a threshold, a hold), or another cluster's catalog on the same
    Prometheus: the recorded series carry another hash, and the rule is queried directly."""
    world = World(tmp_path)
    world.prom.recorded["gpu-temp-high"] = "other"
    code, nodes, summary = decisions(world)
    assert summary["rule_results"] == "mixed"
    assert "recorded from another expression (export the rules again): gpu-temp-high" in summary["rule_results_note"]


def test_recording_rules_off_never_reads_them_and_says_nothing(tmp_path):
    world = World(tmp_path, raw={"prometheus": {"recording_rules": "off"}})
    code, _, summary = decisions(world)
    assert precomputed.QUERY not in world.prom.asked
    assert summary["rule_results"] == "direct" and summary["rule_results_note"] is None
    assert summary["queries"] == 4 + len(world.prom.rules)


def test_the_export_records_each_rule_in_a_group_of_its_own_stage_after_stage(tmp_path):
    """A held rule's group records its condition first and holds it second, in that order (Prometheus runs
    a group's rules in order, at one timestamp): stage 2 reads stage 1's series of its own rule and hash,
    over a window of exactly its hold's samples, and passes on stage 1's heartbeat. A rule whose expr
    holds by itself records its condition alone. Nothing is joined over the fleet (no unless). A rule with a
    healthy value first records its series with any other value, and its condition reads only those: its
    expression runs once per round."""
    world = World(tmp_path, raw={"prometheus": {"scrape_interval": "15s"}})
    assert world.run("rules", "export", "--format", "prometheus") == 0
    groups = {g["name"]: g for g in yaml.safe_load(world.stdout)["groups"]}
    for rule in world.prom.rules:
        if rule.xid is not None or rule.xid_series:
            continue  # the XID rules share a group (below)
        group = groups[precomputed.GROUP_PREFIX + rule.id]
        labels = {precomputed.RULE_LABEL: rule.id, precomputed.EXPR_LABEL: precomputed.expr_hash(rule)}
        assert group["interval"] == "15s" and all(r["labels"] == labels for r in group["rules"])
        assert "unless" not in rule.condition_expr().replace(rule.plot_expr or rule.expr, "E"), rule.id
        stages = group["rules"]
        if rule.healthy is not None:
            if rule.candidates:  # recorded first, and what stage 0 reads in their place
                candidates, *stages = stages
                assert candidates == {"record": precomputed.CANDIDATES, "expr": rule.candidates, "labels": labels}
            unhealthy, *stages = stages
            assert unhealthy["record"] == precomputed.UNHEALTHY, rule.id
            recorded = f'{precomputed.CANDIDATES}{{opsctl_rule="{rule.id}", opsctl_expr="{labels["opsctl_expr"]}"}}'
            assert unhealthy["expr"] == (rule.unhealthy.replace("${candidates}", recorded) or
                                         f"({rule.plot_expr or rule.expr}) != {promql_number(rule.healthy)}")
            assert "${" not in unhealthy["expr"] and (recorded in unhealthy["expr"]) == bool(rule.candidates)
            mine = f'{precomputed.UNHEALTHY}{{opsctl_rule="{rule.id}", opsctl_expr="{labels["opsctl_expr"]}"}}'
            expected = f"{condition(mine, rule.op, rule.threshold)} or {precomputed.HEARTBEAT}"
        else:
            expected = f"{rule.condition_expr()} or {precomputed.HEARTBEAT}"
        assert stages[0]["expr"] == expected, rule.id  # its heartbeat: its own
        if not rule.plot_expr:
            assert [r["record"] for r in stages] == [precomputed.RECORD], rule.id
            continue
        assert [r["record"] for r in stages] == [precomputed.CONDITION, precomputed.RECORD], rule.id
        hold = stages[1]["expr"]
        mine = f'{precomputed.CONDITION}{{opsctl_rule="{rule.id}", opsctl_expr="{labels["opsctl_expr"]}"'
        assert hold.count(precomputed.CONDITION) == hold.count(mine) >= 3, rule.id
        assert f'{mine}, opsctl_heartbeat="1"}}' in hold  # the heartbeat of stage 1's evaluation
        assert "DCGM" not in hold and "node_" not in hold  # reads stage 1 only
        assert hold.count("unless") == 1 and "heartbeat=\"1\"} unless on() (count_over_time(" in hold  # one series


@pytest.mark.parametrize("xid_source", ["auto", "window", "gauge"])
def test_the_xid_rules_share_one_group_that_reads_each_raw_family_once(xid_source):
    """However many XID rules there are, their group reads the count, the gauge and the kernel log's count
    once per round (opsctl:xid_input); each rule's stages read only that, under the rule's own labels,
    from one recording rule per stage."""
    config = parse_config({"catalog": {"xid_source": xid_source}}, "t", {})
    rules = load_catalog(config)
    groups = {g["name"]: g for g in precomputed.recording_groups(rules, config)}
    group = groups[precomputed.XID_GROUP]
    xids = [r for r in rules if r.xid is not None or r.xid_series]
    alone = {r.id for r in xids if precomputed.GROUP_PREFIX + r.id in groups}
    assert alone == set()  # in every variant (the gauge variant's xid-report reads `gauge < 0`: nothing)
    inputs, *stages = group["rules"]
    assert inputs["record"] == xid_inputs.INPUT
    raw = tuple(inputs["expr"].count(m) for m in xid_inputs.RAW_METRICS)  # count, gauge, kernel log
    assert raw == {"auto": (2, 1, 1), "window": (1, 0, 1), "gauge": (0, 1, 0)}[xid_source]  # once, and the guard
    assert [s["record"] for s in stages] == [precomputed.CONDITION, precomputed.RECORD]
    for stage in stages:
        assert not any(m in stage["expr"] for m in xid_inputs.RAW_METRICS) and "unless on(node" not in stage["expr"]
        assert "labels" not in stage  # each rule's series carry its own
    for rule in xids:
        if rule.id in alone:
            continue
        mine = f'"{precomputed.RULE_LABEL}", "{rule.id}", "", "")'
        assert mine in stages[0]["expr"], rule.id
        # The gauge variant's `xid-79` is the gauge's series themselves: recorded without the input's label.
        rewritten = xid_inputs.rewrite(rule, xid_inputs.sources(config))
        assert rewritten.expr.endswith(f', "{xid_inputs.INPUT_LABEL}", "", "", "")'), rule.id
        assert f'{precomputed.CONDITION}{{opsctl_rule="{rule.id}", opsctl_expr="{precomputed.expr_hash(rule)}"' \
            in stages[1]["expr"], rule.id


def test_an_xid_rule_that_a_site_rewrote_keeps_a_group_of_its_own(tmp_path):
    """The shared inputs drop zeros, which only the shipped rules' shape makes safe: a rule from a catalog
    file, or one whose threshold or expression an override replaced, reads the raw series itself."""
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump({"rules": [{
        "id": "xid-low", "source": "dcgm", "device_label": "gpu", "xid": "series", "op": "<", "threshold": 5,
        "severity": "warn", "action": "report", "description": "d", "remediation": "r",
        "expr": 'max by (${by}, gpu) (DCGM_FI_DEV_XID_ERRORS{job="${dcgm}"})'}]}))
    config = parse_config({"catalog": {"files": [str(tmp_path / "mine.yaml")],
                                       "overrides": {"xid-79": {"threshold": 2}}}}, "t", {})
    rules = load_catalog(config)
    names = {g["name"] for g in precomputed.recording_groups(rules, config)}
    assert {precomputed.GROUP_PREFIX + "xid-low", precomputed.GROUP_PREFIX + "xid-79"} <= names
    assert precomputed.GROUP_PREFIX + "xid-48" not in names and precomputed.XID_GROUP in names
    # Even shipped, a gauge compared so that 0 passes is never read from the inputs without zeros.
    src = xid_inputs.sources(config)
    low = replace(next(r for r in rules if r.id == "xid-low"), shipped=True)
    assert xid_inputs.rewrite(low, src) is None
    codes = replace(low, plot_expr=f"{src.gauge} >= 143 <= 150 or {src.gauge} == -1", op=">", threshold=0)
    assert xid_inputs.rewrite(codes, src).inputs == {"gauge"}


@pytest.mark.parametrize("hold,step,samples,window", [("1m", "30s", 3, "75000ms"), ("1m", "15s", 5, "67500ms"),
                                                      ("10m", "1m", 11, "630000ms"), ("90s", "1m", 3, "150000ms")])
def test_stage_two_counts_every_round_of_the_hold_its_first_included(hold, step, samples, window):
    """The window spans the last `samples` rounds and half a round more: never one round too many, whether
    the engine includes a window's start (Prometheus 2) or not (Prometheus 3, MetricsQL). A hold that is no
    multiple of the interval rounds up: the samples always span the whole hold."""
    rule = next(r for r in load_catalog(parse_config({"prometheus": {"recording_interval": step}}, "t", {}))
                if r.id == "row-remap-pending")
    rule = replace(rule, hold=hold)
    assert hold_samples(hold, step) == samples
    expr = precomputed.hold_expr(rule)
    assert f"[{window}])) and (count_over_time(" in expr and f"[{window}]) >= {samples})" in expr
    # The direct path's subquery samples the condition the same number of times, `step` apart.
    direct = rule.alert_expr()
    assert f":{step}]" in direct and "scalar(count_over_time(vector(1)[" in direct


def test_the_pending_series_come_from_stage_one_of_the_same_round(tmp_path):
    world = World(tmp_path)
    rule = world.prom.rule("row-remap-pending")
    stage2 = precomputed.hold_expr(rule)
    now = f'{precomputed.CONDITION}{{opsctl_rule="{rule.id}", opsctl_expr="{precomputed.expr_hash(rule)}", ' \
          f'opsctl_heartbeat=""}}'
    assert stage2.endswith(f'label_replace({now} > 0, "{PENDING_LABEL}", "1", "", "")')
    report_only = world.prom.rule("xid-13")
    assert PENDING_LABEL not in precomputed.hold_expr(report_only)


@pytest.mark.parametrize("op,expr", [
    (">", "clamp_min(E, 5) != 5 or (E) == -Inf"), ("<", "clamp_max(E, 5) != 5 or (E) == +Inf"),
    (">=", "(E) >= 5 or (E) == -Inf or (E) * 0 != 0"), ("<=", "(E) <= 5 or (E) == +Inf or (E) * 0 != 0"),
    ("==", "(E) == 5 or (E) == -Inf or (E) == +Inf or (E) * 0 != 0"), ("!=", "(E) != 5")])
def test_the_condition_keeps_every_series_that_is_not_certainly_ok_with_its_value(op, expr):
    """Filters by a number only, never a join of the expression with itself over the fleet: for > and <
    one clamp keeps the breaching values and NaN as they are, and the infinity it would fold into the
    threshold is selected beside it (an infinity stays one: MetricsQL drops NaN)."""
    assert condition("E", op, 5.0) == expr


def test_alerts_read_the_recorded_results_when_the_file_holds_the_recording_groups(tmp_path):
    world = World(tmp_path)
    assert world.run("rules", "export", "--format", "prometheus") == 0
    doc = yaml.safe_load(world.stdout)
    alerts = {r["labels"]["rule_id"]: r["expr"] for g in doc["groups"] for r in g["rules"]
              if "alert" in r and "rule_id" in r["labels"]}
    for rule in world.prom.rules:
        assert alerts[rule.id] == precomputed.alert_expr(rule)
        assert f'{precomputed.RECORD}{{opsctl_rule="{rule.id}", opsctl_expr="{precomputed.expr_hash(rule)}", ' \
               f'opsctl_heartbeat="", opsctl_pending=""}}' in alerts[rule.id]
    # Without the recording groups beside them, the alerts evaluate the rules themselves.
    alone = yaml.safe_load(render_prometheus_rules(world.prom.rules))["groups"][0]["rules"]
    assert [a["expr"] for a in alone] == [r.alert_expr() for r in world.prom.rules]


def test_a_history_shorter_than_the_hold_sends_the_rule_to_the_direct_path_and_says_why(tmp_path):
    """Stage 2 marks its heartbeat young while stage 1 has not recorded every round of the hold (rules just
    loaded, Prometheus restarted, rounds missed): its empty result would read as ok, so the rule is read
    directly, with a note, and its young heartbeat is never taken for a result."""
    world = World(tmp_path)
    rules = world.prom.rules
    rule = world.prom.rule("row-remap-pending")
    tags = {precomputed.RULE_LABEL: rule.id, precomputed.EXPR_LABEL: precomputed.expr_hash(rule)}
    now = 1_800_000_000.0
    young = Sample({**tags, precomputed.HEARTBEAT_LABEL: precomputed.YOUNG}, now - 1, at=now)
    found = precomputed.read([young], rules, world.config)
    assert rule in found.direct and rule.id not in found.answers
    assert found.why["recorded for less than their hold (rules just loaded, or rounds missed)"][0] == rule.id
    beat = Sample({**tags, precomputed.HEARTBEAT_LABEL: "1"}, now - 1, at=now)
    assert precomputed.read([beat], rules, world.config).answers[rule.id] == []


def test_a_healthy_value_that_an_override_made_a_breach_is_not_used():
    """Stage 0 drops the healthy value, which is safe only while that value is certainly ok: a threshold
    moved so that it breaches (row-remap-failure > -1 breaches at 0) judges every series again."""
    config = parse_config({"catalog": {"overrides": {"row-remap-failure": {"threshold": -1},
                                                     "ib-down": {"healthy": 3}}}}, "t", {})
    rules = {r.id: r for r in load_catalog(config)}
    groups = {g["name"]: g for g in precomputed.recording_groups(list(rules.values()), config)}
    assert rules["row-remap-failure"].healthy is None and rules["row-remap-pending"].healthy == 0
    records = [r["record"] for r in groups[precomputed.GROUP_PREFIX + "row-remap-failure"]["rules"]]
    assert records == [precomputed.CONDITION, precomputed.RECORD]
    assert rules["ib-down"].healthy is None  # ib-down breaches below 4: a port at 3 is no healthy one
    assert groups[precomputed.GROUP_PREFIX + "row-remap-pending"]["rules"][0]["record"] == precomputed.UNHEALTHY
