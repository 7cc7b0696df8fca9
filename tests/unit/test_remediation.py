"""Drain and resume plans (pure: they return decisions and never change a verdict), the safety limits,
handled events, and the on-disk lock, state directory and audit log."""

import json
import os

import pytest

from opsctl.actor.audit import AuditLog
from opsctl.actor.lock import RunLock
from opsctl.actor.memory import Handled, HandledMemory, records_for
from opsctl.actor.state import State
from opsctl.config import parse_config
from opsctl.errors import ConfigError
from opsctl.health.catalog import load_catalog
from opsctl.health.evaluate import Check, NodeVerdict, Report
from opsctl.health.evidence import Evidence
from opsctl.health.plan import breaker_limit, drain_reason, plan_drains, plan_resumes, resume_candidates
from tests.unit.fakes import node

SAFETY = parse_config({}, "t", {}).safety
RULES = load_catalog(parse_config({}, "t", {}))
NOW = 1_800_000_000.0


def xid79(gpu=3):
    return Check(id="xid-79", severity="fail", status="fail", device=f"gpu{gpu}", kind="gpu", value=1, threshold=0,
                 op=">", evidence=f"gpu{gpu} xid=79 count=1", action="drain", xid=79, memory="window", window_s=300)


def ib_down(dev="mlx5_2"):
    return Check(id="ib-down", severity="fail", status="fail", device=dev, kind="hca", value=1, threshold=4, op="<",
                 evidence=f"{dev} state_id=1", action="drain")


def cluster(n=64, failing=None, statuses=None, slurm_over=None):
    """n idle nodes; failing: {node: [checks]}; statuses: {node: status}."""
    names = [f"gpu{i:03d}" for i in range(1, n + 1)]
    nodes = {}
    for name in names:
        checks = (failing or {}).get(name, [])
        status = (statuses or {}).get(name, "fail" if checks else "ok")
        nodes[name] = NodeVerdict(name, status=status, checks=list(checks))
    slurm = {name: node(name) for name in names}
    slurm.update(slurm_over or {})
    return Report(nodes=nodes, rules=RULES), slurm


def drains(report, slurm, safety=SAFETY, last_hour=0, dry_run=False, scope=None):
    return plan_drains(report, slurm, RULES, safety, last_hour, dry_run, scope)


def test_one_failing_node_is_drained_with_an_owned_reason():
    report, slurm = cluster(failing={"gpu040": [xid79()]})
    plan = drains(report, slurm)
    assert {r: [d.node for d in ds] for r, ds in plan.drains().items()} == {
        "opsctl:xid-79 gpu3 xid=79 count=1": ["gpu040"]}
    assert plan.action("gpu040") == "drain" and plan.action("gpu041") == "none" and not plan.stop
    assert plan.decisions["gpu040"].values == ({"rule": "xid-79", "device": "gpu3", "value": 1, "threshold": 0},)


def test_plans_never_write_into_the_verdicts():
    report, slurm = cluster(failing={"gpu040": [xid79()]})
    before = repr(report)
    drains(report, slurm)
    plan_resumes(report, slurm, RULES, {}, {}, 600.0, SAFETY, 0, False, NOW)
    assert repr(report) == before


def test_dry_run_plans_the_same_but_says_would_drain():
    report, slurm = cluster(failing={"gpu040": [xid79()]})
    plan = drains(report, slurm, dry_run=True)
    assert plan.action("gpu040") == "would-drain" and plan.drains() == {}


def test_nodes_with_the_same_reason_share_one_call():
    report, slurm = cluster(failing={"gpu040": [ib_down()], "gpu041": [ib_down()], "gpu042": [ib_down("mlx5_3")]})
    plan = drains(report, slurm)
    assert {r: [d.node for d in ds] for r, ds in plan.drains().items()} == {
        "opsctl:ib-down mlx5_2 state_id=1": ["gpu040", "gpu041"], "opsctl:ib-down mlx5_3 state_id=1": ["gpu042"]}


def test_report_only_failures_are_not_drained():
    warn = Check(id="xid-13", severity="warn", status="warn", device="gpu0", evidence="gpu0 xid=13", action="report")
    report, slurm = cluster(failing={"gpu040": [warn]}, statuses={"gpu040": "warn"})
    assert not drains(report, slurm).drains()


def test_reason_is_capped_and_lists_every_rule():
    checks = [xid79(g) for g in range(8)] + [ib_down()]
    reason = drain_reason(checks, 128)
    assert len(reason) == 128 and reason.endswith("...")
    assert reason.startswith("opsctl:xid-79,ib-down gpu0 xid=79 count=1; gpu1")


@pytest.mark.parametrize("slurm_node,action", [
    (node("gpu040", flags=("DRAIN",), reason="maintenance"), "skip:not-owned"),
    (node("gpu040", "down", reason="Not responding"), "skip:not-owned"),
    (node("gpu040", reason="someone's note"), "skip:not-owned"),  # any foreign reason, whatever the state
    (node("gpu040", flags=("FAIL",)), "skip:slurm-state"),
    (node("gpu040", "down"), "skip:slurm-state"),
    (node("gpu040", flags=("RESERVED", "MAINTENANCE")), "skip:slurm-state"),
    (node("gpu040", flags=("RESERVED",)), "skip:slurm-state"),
    (node("gpu040", "mixed", flags=("REBOOT_REQUESTED",)), "skip:slurm-state"),
    (node("gpu040", flags=("POWERED_DOWN",)), "skip:slurm-state"),
    (node("gpu040", flags=("DRAIN",), reason="opsctl:ib-down mlx5_2 state_id=1"), "escalate"),
    (node("gpu040", flags=("DRAIN",), reason="opsctl:xid-79 gpu3 xid=79 count=1"), "skip:already-drained"),
    # A new fault under the remediation ladder is added to its reason (tests/unit/test_ladder_second_fault.py).
    (node("gpu040", flags=("DRAIN",), reason="opsctl:xid-48 gpu1 xid=48 count=1"), "escalate"),
    (node("gpu040", flags=("DRAIN",), reason="opsctl:manual fan"), "skip:already-drained"),
    (node("gpu040", flags=("DRAIN",), reason="opsctl:epilog GPU3=1024MiB"), "skip:already-drained"),  # not a rule
])
def test_nodes_slurm_or_someone_else_holds_are_never_drained(slurm_node, action):
    report, slurm = cluster(failing={"gpu040": [xid79()]}, slurm_over={"gpu040": slurm_node})
    plan = drains(report, slurm)
    assert plan.action("gpu040") == action and plan.drains() == {}


def test_an_event_that_needs_a_person_escalates_an_auto_resumable_drain():
    over = {"gpu040": node("gpu040", flags=("DRAIN",), reason="opsctl:ib-down mlx5_2 state_id=1")}
    report, slurm = cluster(failing={"gpu040": [xid79(), ib_down()]}, slurm_over=over)
    decision = drains(report, slurm).decisions["gpu040"]
    assert decision.action == "escalate" and [c.id for c in decision.checks] == ["xid-79"]
    assert decision.reason == "opsctl:ib-down,xid-79 mlx5_2 state_id=1; gpu3 xid=79 count=1"


def test_unknown_and_unmapped_nodes_are_never_drained():
    report, slurm = cluster(failing={"gpu040": [xid79()]}, statuses={"gpu040": "unknown"})
    report.nodes["stranger"] = NodeVerdict("stranger", status="fail", checks=[xid79()], in_slurm=False)
    plan = drains(report, slurm)
    assert not plan.drains() and plan.action("gpu040") == "skip:unknown"
    assert plan.action("stranger") == "skip:not-in-slurm"


@pytest.mark.parametrize("nodes,limit", [(10, 2), (64, 6.4), (1000, 100)])
def test_breaker_limit_is_max_of_two_and_ten_percent(nodes, limit):
    assert breaker_limit(SAFETY, nodes) == pytest.approx(limit)


def test_breaker_trips_above_the_limit_and_acts_on_none():
    report, slurm = cluster(failing={f"gpu{i:03d}": [xid79()] for i in range(33, 40)})  # 7 > 6.4
    plan = drains(report, slurm)
    assert not plan.drains() and "circuit breaker" in plan.stop
    assert {plan.action(f"gpu{i:03d}") for i in range(33, 40)} == {"skip:circuit-breaker"}


def test_scoped_runs_count_the_whole_cluster_for_the_breaker():
    report, slurm = cluster(failing={f"gpu{i:03d}": [xid79()] for i in range(33, 40)})
    for scope in ({"gpu033", "gpu034", "gpu035"}, {"gpu036", "gpu037", "gpu038", "gpu039"}):
        plan = drains(report, slurm, scope=scope)
        assert not plan.drains() and plan.breaker and set(plan.decisions) == scope


def test_breaker_at_the_limit_does_not_trip_but_the_budget_caps():
    report, slurm = cluster(failing={f"gpu{i:03d}": [xid79()] for i in range(33, 39)})  # 6 <= 6.4
    plan = drains(report, slurm)
    assert [plan.action(f"gpu{i:03d}") for i in range(33, 39)] == ["drain"] * 4 + ["skip:budget"] * 2
    assert "budget" in plan.stop


def test_already_drained_nodes_do_not_count_as_newly_failing():
    over = {f"gpu{i:03d}": node(f"gpu{i:03d}", flags=("DRAIN",), reason="opsctl:xid-79 gpu3") for i in range(33, 40)}
    report, slurm = cluster(failing={n: [xid79()] for n in list(over) + ["gpu050"]}, slurm_over=over)
    safety = parse_config({"safety": {"max_out_of_service_fraction": 0.5}}, "t", {}).safety
    plan = drains(report, slurm, safety)
    assert [d.node for ds in plan.drains().values() for d in ds] == ["gpu050"]


def test_the_out_of_service_share_never_passes_its_limit():
    # 64 nodes, 20 %: at most 12 out of service. 11 are out for any reason; 3 newly fail: one may go.
    over = {f"gpu{i:03d}": node(f"gpu{i:03d}", "down", reason="dead psu") for i in range(1, 12)}
    report, slurm = cluster(failing={n: [xid79()] for n in ("gpu040", "gpu041", "gpu042")}, slurm_over=over)
    plan = drains(report, slurm)
    assert [plan.action(n) for n in ("gpu040", "gpu041", "gpu042")] == ["drain"] + ["skip:out-of-service-limit"] * 2
    assert "max_out_of_service_fraction" in plan.decisions["gpu041"].detail and plan.stop


def test_hourly_budget_counts_earlier_drains():
    report, slurm = cluster(failing={"gpu040": [xid79()], "gpu041": [xid79()]})
    plan = drains(report, slurm, last_hour=SAFETY.max_drains_per_hour - 1)
    assert plan.action("gpu040") == "drain" and plan.action("gpu041") == "skip:budget"


def test_unknown_nodes_have_their_own_breaker():
    report, slurm = cluster(n=10, failing={"gpu001": [xid79()]},
                            statuses={f"gpu{i:03d}": "unknown" for i in range(2, 8)})
    plan = drains(report, slurm)
    assert not plan.drains() and "no usable data" in plan.stop
    report, slurm = cluster(n=10, failing={"gpu001": [xid79()]},
                            statuses={f"gpu{i:03d}": "unknown" for i in range(2, 6)})
    assert drains(report, slurm).drains()  # 4 of 10 unknown: under 50 %


def drained(name, reason):
    return {name: node(name, flags=("DRAIN",), reason=reason)}


OK = Evidence("ok", [("mlx5_2", 4.0)])


def resume_plan(slurm_over, failing=None, statuses=None, since=None, after=600.0, evidence=None, last_hour=0):
    report, slurm = cluster(failing=failing, statuses=statuses, slurm_over=slurm_over)
    evidence = {(n, "ib-down"): OK for n in slurm_over} if evidence is None else evidence
    plan = plan_resumes(report, slurm, RULES, evidence, since or {}, after, SAFETY, last_hour, False, NOW)
    return plan


def test_resume_waits_for_the_healthy_period_then_resumes():
    over = drained("gpu040", "opsctl:ib-down mlx5_2 state_id=1")
    plan = resume_plan(over)
    assert plan.with_action("resume") == [] and plan.action("gpu040") == "skip:healthy-period"
    assert plan.healthy_since == {"gpu040": NOW}
    plan = resume_plan(over, since={"gpu040": NOW - 601})
    [decision] = plan.with_action("resume")
    assert decision.node == "gpu040" and decision.healthy_s == 601
    assert decision.values == ({"rule": "ib-down", "device": "mlx5_2", "value": 4.0, "threshold": 4.0},)


@pytest.mark.parametrize("evidence,why", [
    ({}, "skip:no-data"),                                                   # the series vanished
    ({("gpu040", "ib-down"): Evidence("unknown", [("mlx5_2", float("nan"))])}, "skip:no-data"),
    ({("gpu040", "ib-down"): Evidence("failing", [("mlx5_2", 1.0)])}, "skip:still-failing"),
])
def test_a_resume_needs_positive_evidence(evidence, why):
    plan = resume_plan(drained("gpu040", "opsctl:ib-down mlx5_2 state_id=1"), since={"gpu040": 0.0}, evidence=evidence)
    assert plan.action("gpu040") == why and not plan.with_action("resume")


@pytest.mark.parametrize("reason,why", [
    ("opsctl:manual fan swap", "none"), ("maintenance", "none"), ("opsctl:no-such-rule x", "skip:rule-unknown"),
    ("opsctl:xid-79 gpu3 xid=79", "skip:needs-person"),
])
def test_resume_never_lifts_what_it_cannot_own_or_judge(reason, why):
    plan = resume_plan(drained("gpu040", reason), since={"gpu040": 0.0})
    assert plan.with_action("resume") == [] and plan.action("gpu040") == why


@pytest.mark.parametrize("flags,state", [(("DRAIN", "FAIL"), "idle"), (("DRAIN",), "down"),
                                         (("DRAIN", "MAINTENANCE", "RESERVED"), "idle"),
                                         (("DRAIN", "POWERED_DOWN"), "idle")])
def test_resume_leaves_a_drain_alone_while_slurm_holds_the_node(flags, state):
    over = {"gpu040": node("gpu040", state, flags=flags, reason="opsctl:ib-down mlx5_2 state_id=1")}
    plan = resume_plan(over, since={"gpu040": 0.0})
    assert plan.action("gpu040") == "skip:slurm-state"


def test_resume_refuses_while_the_rule_fails_or_data_is_missing():
    over = drained("gpu040", "opsctl:ib-down mlx5_2 state_id=1")
    plan = resume_plan(over, failing={"gpu040": [ib_down()]}, since={"gpu040": 0.0})
    assert plan.action("gpu040") == "skip:still-failing" and plan.healthy_since == {}  # the clock starts again
    plan = resume_plan(over, statuses={"gpu040": "unknown"}, since={"gpu040": 0.0})
    assert plan.action("gpu040") == "skip:unknown"
    plan = resume_plan(over, failing={"gpu040": [xid79()]}, since={"gpu040": 0.0})
    assert plan.action("gpu040") == "skip:other-failing"


def test_resumes_have_a_budget():
    over = {n: v for i in range(40, 46) for n, v in drained(f"gpu{i:03d}", "opsctl:ib-down mlx5_2 x").items()}
    since = dict.fromkeys(over, 0.0)
    plan = resume_plan(over, since=since)
    assert len(plan.with_action("resume")) == SAFETY.max_resumes_per_run == 4
    assert plan.action("gpu045") == "skip:budget" and "resume budget" in plan.stop
    plan = resume_plan(over, since=since, last_hour=SAFETY.max_resumes_per_hour - 1)
    assert len(plan.with_action("resume")) == 1


def test_resume_candidates_are_what_the_evidence_query_asks_about():
    over = {**drained("gpu040", "opsctl:ib-down mlx5_2 x"), **drained("gpu041", "opsctl:xid-79 gpu3 x"),
            **drained("gpu042", "opsctl:ib-down,row-remap-pending x"), **drained("gpu043", "maintenance")}
    report, slurm = cluster(slurm_over=over)
    assert resume_candidates(report, slurm, RULES) == {"ib-down": {"gpu040", "gpu042"},
                                                        "row-remap-pending": {"gpu042"}}


# ---- handled events -------------------------------------------------------------------------------
def test_records_are_written_for_rules_with_memory_only():
    records = records_for("gpu040", [xid79(), ib_down()], NOW)
    assert records == [Handled("gpu040", "xid-79", "gpu3", 1.0, NOW, "window", 300.0, settled=False)]


def test_an_intent_covers_like_a_settled_record_and_a_refused_change_drops_it():
    memory = HandledMemory(records_for("gpu040", [xid79()], NOW))
    assert memory.covers("gpu040", xid79(), NOW + 10)  # written before scontrol: a crash must not re-drain
    memory.drop_intents(["gpu040"])
    assert not memory.covers("gpu040", xid79(), NOW + 10)
    memory.add(records_for("gpu040", [xid79()], NOW))
    memory.settle(["gpu040"])
    memory.drop_intents(["gpu040"])
    assert memory.covers("gpu040", xid79(), NOW + 10)


def test_level_records_end_when_the_rule_reads_ok_and_windows_expire():
    level = Handled("gpu040", "row-remap-failure", "gpu1", 1.0, NOW, "level", 0.0, True)
    memory = HandledMemory([level, *records_for("gpu041", [xid79()], NOW)])
    assert memory.level_rules() == {"row-remap-failure": {"gpu040"}}
    memory.forget([("gpu040", "row-remap-failure", "gpu1")])
    memory.prune(NOW + 301)
    assert memory.records == []


# ---- state directory, lock, audit log -------------------------------------------------------------
def test_state_budget_and_handled_events_persist(tmp_path):
    state = State(tmp_path / "state")
    assert state.budgets.recent("drains", NOW) == [] and state.handled.load().records == []
    state.budgets.record("drains", 2, NOW - 3700)
    state.budgets.record("drains", 3, NOW)
    state.budgets.record("resumes", 1, NOW)
    assert len(state.budgets.recent("drains", NOW)) == 3 and len(state.budgets.recent("resumes", NOW)) == 1
    state.handled.save(HandledMemory(records_for("gpu040", [xid79()], NOW)))
    assert State(tmp_path / "state").handled.load().records == records_for("gpu040", [xid79()], NOW)
    assert os.stat(tmp_path / "state").st_mode & 0o777 == 0o700


def test_corrupt_state_is_a_clear_error(tmp_path):
    (tmp_path / "budget.json").write_text("{")
    with pytest.raises(ConfigError, match="budget.json is unreadable"):
        State(tmp_path).budgets.recent("drains", NOW)


def test_a_symlink_in_place_of_a_state_file_is_never_followed(tmp_path):
    state = tmp_path / "s"
    state.mkdir(mode=0o700)
    (tmp_path / "elsewhere.json").write_text("[]")
    (state / "handled.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(ConfigError, match="handled.json is unreadable"):
        State(state).handled.load()
    (state / "lock").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(ConfigError, match="lock"):
        RunLock(state).__enter__()
    os.symlink(tmp_path / "nowhere", tmp_path / "linked")
    with pytest.raises(ConfigError, match="not a directory"):
        State(tmp_path / "linked").handled.load()


def test_audit_log_appends_json_lines_with_values(tmp_path):
    log = AuditLog(tmp_path / "log" / "audit.jsonl")
    log.write("drain", node="gpu040", checks=["xid-79"], evidence="gpu3 xid=79", reason="opsctl:xid-79 gpu3 xid=79",
              values=[{"rule": "xid-79", "device": "gpu3", "value": 1, "threshold": 0}])
    log.write("refuse", node="gpu041", detail="not-owned", dry_run=True)
    log.write("resume", node="gpu042", healthy_seconds=612.4)
    records = [json.loads(line) for line in (tmp_path / "log" / "audit.jsonl").read_text().splitlines()]
    assert [r["event"] for r in records] == ["drain", "refuse", "resume"]
    assert set(records[0]) == {"time", "user", "event", "node", "state", "checks", "evidence", "reason", "dry_run",
                               "detail", "values"}
    assert records[0]["values"] == [{"rule": "xid-79", "device": "gpu3", "value": 1, "threshold": 0}]
    assert records[2]["healthy_seconds"] == 612 and records[1]["dry_run"] is True
    assert log.read(node="gpu041") == ([records[1]], []) and log.read(limit=1) == ([records[2]], [])


def test_a_torn_last_line_is_skipped_with_a_warning_and_the_next_record_starts_its_own_line(tmp_path):
    log = AuditLog(tmp_path / "audit.jsonl")
    log.write("drain", node="gpu040")
    with open(tmp_path / "audit.jsonl", "a") as out:
        out.write('{"time": "2026-01-01T00:00:00Z", "event": "dra')
    records, warnings = log.read()
    assert [r["node"] for r in records] == ["gpu040"] and warnings == [
        f"audit log {tmp_path / 'audit.jsonl'} line 2: torn last line skipped"]
    log.write("drain", node="gpu041")
    records, warnings = log.read()
    assert [r["node"] for r in records] == ["gpu040", "gpu041"]
    assert warnings == [f"audit log {tmp_path / 'audit.jsonl'} line 2: torn line (not JSON) skipped"]
