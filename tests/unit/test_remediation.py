"""Drain and resume plans (pure), the safety limits, and the on-disk lock, budget and audit log."""

import json

import pytest

from opsctl.config import parse_config
from opsctl.errors import SafetyStop
from opsctl.health.catalog import load_catalog
from opsctl.health.evaluate import Check, HandledXid, NodeVerdict, Report
from opsctl.remediation.audit import AuditLog
from opsctl.remediation.plan import breaker_limit, drain_reason, plan_drains, plan_resumes
from opsctl.remediation.state import RunLock, StateDir
from opsctl.slurm import SlurmNode

SAFETY = parse_config({}, "t", {}).safety
RULES = load_catalog(parse_config({}, "t", {}))
NOW = 1_800_000_000.0


def xid79(gpu=3):
    return Check(id="xid-79", severity="fail", status="fail", device=f"gpu{gpu}", kind="gpu", value=1, threshold=0,
                 op=">", evidence=f"gpu{gpu} xid=79 count=1", action="drain", xid=79)


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
    slurm = {name: SlurmNode(name, "idle") for name in names}
    slurm.update(slurm_over or {})
    return Report(nodes=nodes, rules=RULES), slurm


def test_one_failing_node_is_drained_with_an_owned_reason():
    report, slurm = cluster(failing={"gpu040": [xid79()]})
    plan = plan_drains(report, slurm, SAFETY, 0, dry_run=False, now=NOW)
    assert plan.drains == {"opsctl:xid-79 gpu3 xid=79 count=1": ["gpu040"]}
    assert report.nodes["gpu040"].action == "drain" and report.nodes["gpu041"].action == "none"
    assert plan.handled == [HandledXid("gpu040", "3", 79, NOW, 1)] and not plan.stop


def test_dry_run_plans_the_same_but_says_would_drain():
    report, slurm = cluster(failing={"gpu040": [xid79()]})
    plan = plan_drains(report, slurm, SAFETY, 0, dry_run=True, now=NOW)
    assert report.nodes["gpu040"].action == "would-drain" and plan.drains


def test_nodes_with_the_same_reason_share_one_call():
    report, slurm = cluster(failing={"gpu040": [ib_down()], "gpu041": [ib_down()], "gpu042": [ib_down("mlx5_3")]})
    plan = plan_drains(report, slurm, SAFETY, 0, dry_run=False, now=NOW)
    assert plan.drains == {"opsctl:ib-down mlx5_2 state_id=1": ["gpu040", "gpu041"],
                           "opsctl:ib-down mlx5_3 state_id=1": ["gpu042"]}


def test_report_only_failures_are_not_drained():
    warn = Check(id="xid-13", severity="warn", status="warn", device="gpu0", evidence="gpu0 xid=13", action="report")
    report, slurm = cluster(failing={"gpu040": [warn]}, statuses={"gpu040": "warn"})
    assert not plan_drains(report, slurm, SAFETY, 0, False, NOW).drains


def test_reason_is_capped_and_lists_every_rule():
    checks = [xid79(g) for g in range(8)] + [ib_down()]
    reason = drain_reason(checks, 128)
    assert len(reason) == 128 and reason.endswith("...")
    assert reason.startswith("opsctl:xid-79,ib-down gpu0 xid=79 count=1; gpu1")


def test_foreign_drains_and_down_nodes_are_never_touched():
    over = {"gpu040": SlurmNode("gpu040", "idle", ("DRAIN",), "maintenance"),
            "gpu041": SlurmNode("gpu041", "down", (), "Not responding"),
            "gpu042": SlurmNode("gpu042", "idle", ("DRAIN",), "opsctl:ib-down mlx5_2 state_id=1")}
    report, slurm = cluster(failing={n: [xid79()] for n in over}, slurm_over=over)
    plan = plan_drains(report, slurm, SAFETY, 0, False, NOW)
    assert not plan.drains
    assert report.nodes["gpu040"].action == report.nodes["gpu041"].action == "skip:not-owned"
    assert report.nodes["gpu042"].action == "skip:already-drained"
    assert {r[0] for r in plan.refusals} == {"gpu040", "gpu041"}


def test_unknown_and_unmapped_nodes_are_never_drained():
    report, slurm = cluster(failing={"gpu040": [xid79()]}, statuses={"gpu040": "unknown"})
    report.nodes["stranger"] = NodeVerdict("stranger", status="fail", checks=[xid79()], in_slurm=False)
    plan = plan_drains(report, slurm, SAFETY, 0, False, NOW)
    assert not plan.drains
    assert report.nodes["gpu040"].action == "skip:unknown"
    assert report.nodes["stranger"].action == "skip:not-in-slurm"


@pytest.mark.parametrize("nodes,limit", [(10, 2), (64, 6.4), (1000, 100)])
def test_breaker_limit_is_max_of_two_and_ten_percent(nodes, limit):
    assert breaker_limit(SAFETY, nodes) == pytest.approx(limit)


def test_breaker_trips_above_the_limit_and_acts_on_none():
    report, slurm = cluster(failing={f"gpu{i:03d}": [xid79()] for i in range(33, 40)})  # 7 > 6.4
    plan = plan_drains(report, slurm, SAFETY, 0, False, NOW)
    assert not plan.drains and "circuit breaker" in plan.stop
    assert {report.nodes[f"gpu{i:03d}"].action for i in range(33, 40)} == {"skip:circuit-breaker"}


def test_breaker_at_the_limit_does_not_trip_but_the_budget_caps():
    report, slurm = cluster(failing={f"gpu{i:03d}": [xid79()] for i in range(33, 39)})  # 6 <= 6.4
    plan = plan_drains(report, slurm, SAFETY, 0, False, NOW)
    assert sum(len(v) for v in plan.drains.values()) == SAFETY.max_drains_per_run == 4
    assert [report.nodes[f"gpu{i:03d}"].action for i in range(33, 39)] == ["drain"] * 4 + ["skip:budget"] * 2
    assert "budget" in plan.stop


def test_already_drained_nodes_do_not_count_as_newly_failing():
    over = {f"gpu{i:03d}": SlurmNode(f"gpu{i:03d}", "idle", ("DRAIN",), "opsctl:xid-79 gpu3") for i in range(33, 40)}
    report, slurm = cluster(failing={n: [xid79()] for n in list(over) + ["gpu050"]}, slurm_over=over)
    plan = plan_drains(report, slurm, SAFETY, 0, False, NOW)
    assert plan.drains == {"opsctl:xid-79 gpu3 xid=79 count=1": ["gpu050"]}


def test_hourly_budget_counts_earlier_drains():
    report, slurm = cluster(failing={"gpu040": [xid79()], "gpu041": [xid79()]})
    plan = plan_drains(report, slurm, SAFETY, SAFETY.max_drains_per_hour - 1, False, NOW)
    assert plan.drains == {"opsctl:xid-79 gpu3 xid=79 count=1": ["gpu040"]}
    assert report.nodes["gpu041"].action == "skip:budget"


def test_unknown_nodes_have_their_own_breaker():
    report, slurm = cluster(n=10, failing={"gpu001": [xid79()]},
                            statuses={f"gpu{i:03d}": "unknown" for i in range(2, 8)})
    plan = plan_drains(report, slurm, SAFETY, 0, False, NOW)
    assert not plan.drains and "have no data" in plan.stop
    report, slurm = cluster(n=10, failing={"gpu001": [xid79()]},
                            statuses={f"gpu{i:03d}": "unknown" for i in range(2, 6)})
    assert plan_drains(report, slurm, SAFETY, 0, False, NOW).drains  # 4 of 10 unknown: under 50 %


def drained(name, reason):
    return {name: SlurmNode(name, "idle", ("DRAIN",), reason)}


def resume_plan(slurm_over, failing=None, statuses=None, since=None, after=600.0, dry_run=False):
    report, slurm = cluster(failing=failing, statuses=statuses, slurm_over=slurm_over)
    plan = plan_resumes(report, slurm, RULES, since or {}, after, dry_run, NOW)
    return plan, report


def test_resume_waits_for_the_healthy_period_then_resumes():
    over = drained("gpu040", "opsctl:ib-down mlx5_2 state_id=1")
    plan, report = resume_plan(over)
    assert plan.resumes == [] and report.nodes["gpu040"].action == "skip:healthy-period"
    assert plan.healthy_since == {"gpu040": NOW}
    plan, report = resume_plan(over, since={"gpu040": NOW - 601})
    assert plan.resumes == ["gpu040"] and report.nodes["gpu040"].action == "resume"


@pytest.mark.parametrize("reason,why", [
    ("opsctl:manual fan swap", None), ("maintenance", None), ("opsctl:no-such-rule x", "skip:rule-unknown"),
    ("opsctl:xid-79 gpu3 xid=79", "skip:needs-person"),
])
def test_resume_never_lifts_what_it_cannot_own_or_judge(reason, why):
    plan, report = resume_plan(drained("gpu040", reason), since={"gpu040": 0.0})
    assert plan.resumes == []
    assert report.nodes["gpu040"].action == (why or "none")


def test_resume_refuses_while_the_rule_fails_or_data_is_missing():
    over = drained("gpu040", "opsctl:ib-down mlx5_2 state_id=1")
    plan, report = resume_plan(over, failing={"gpu040": [ib_down()]}, since={"gpu040": 0.0})
    assert not plan.resumes and report.nodes["gpu040"].action == "skip:still-failing"
    assert plan.healthy_since == {}  # the healthy clock starts again
    plan, report = resume_plan(over, statuses={"gpu040": "unknown"}, since={"gpu040": 0.0})
    assert not plan.resumes and report.nodes["gpu040"].action == "skip:unknown"
    plan, report = resume_plan(over, failing={"gpu040": [xid79()]}, since={"gpu040": 0.0})
    assert not plan.resumes and report.nodes["gpu040"].action == "skip:other-failing"


def test_state_budget_and_handled_xids_persist(tmp_path):
    state = StateDir(tmp_path / "state")
    assert state.drains_last_hour(NOW) == [] and state.handled_xids() == []
    state.record_drains(2, NOW - 3700)
    state.record_drains(3, NOW)
    assert len(state.drains_last_hour(NOW)) == 3
    state.record_xids([HandledXid("gpu040", "3", 79, NOW, 1)], NOW)
    assert StateDir(tmp_path / "state").handled_xids() == [HandledXid("gpu040", "3", 79, NOW, 1)]


def test_corrupt_state_is_a_clear_error(tmp_path):
    (tmp_path / "budget.json").write_text("{")
    with pytest.raises(Exception, match="budget.json is unreadable"):
        StateDir(tmp_path).drains_last_hour(NOW)


def test_second_lock_holder_gets_a_safety_stop(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(SafetyStop, match="another acting opsctl holds"):
            with RunLock(tmp_path):
                pass
    with RunLock(tmp_path):  # released again
        pass


def test_audit_log_appends_json_lines(tmp_path):
    log = AuditLog(tmp_path / "log" / "audit.jsonl")
    log.write("drain", node="gpu040", checks=["xid-79"], evidence="gpu3 xid=79", reason="opsctl:xid-79 gpu3 xid=79")
    log.write("refuse", node="gpu041", detail="not-owned", dry_run=True)
    lines = (tmp_path / "log" / "audit.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["event"] for r in records] == ["drain", "refuse"]
    assert set(records[0]) == {"time", "user", "event", "node", "checks", "evidence", "reason", "dry_run", "detail"}
    assert records[1]["dry_run"] is True and records[0]["user"]
    assert log.read(node="gpu041") == [records[1]] and log.read(limit=1) == [records[1]]
