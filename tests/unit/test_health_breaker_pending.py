"""The circuit breaker sees what is coming (opsctl/health/plan.py): beside the nodes that newly fail, it
counts those whose condition holds now but whose hold has not yet elapsed (pending) and those the
remediation ladder holds out of service for a reset or a reboot. A fault that reaches many nodes within
a few scrapes completes its hold on one of them first; counting only held failures drained that one.
Pending nodes are counted, never failed, drained or otherwise acted on."""

import pytest
import yaml

from opsctl.health import precomputed
from opsctl.health.catalog import PENDING_LABEL
from opsctl.health.evaluate import evaluate
from opsctl.health.plan import ladder_holds
from opsctl.ladder.reasons import REBOOT, RESET, rung_of
from tests.unit.fakes import World, node

PENDING = ["gpu002", "gpu003", "gpu004", "gpu005", "gpu006"]


def staggered(tmp_path, path: str) -> World:
    """8 nodes; XID 79 on GPU 3 of six of them: held on gpu001, pending on the five others."""
    world = World(tmp_path, n=8)
    if path == "direct":
        world.prom.recorded = {}
    world.prom.breach("xid-79", "gpu001", "3")
    for name in PENDING:
        world.prom.pending("xid-79", name, "3")
    return world


@pytest.mark.parametrize("path", ["recorded", "direct"])
def test_defect_11_a_staggered_fleet_wide_fault_stops_the_breaker_before_the_first_drain(tmp_path, path):
    world = staggered(tmp_path, path)
    code, nodes, summary = world.json("--drain")
    assert world.slurm.calls == []  # nothing drained
    assert code == 4
    assert nodes["gpu001"]["action"] == "skip:circuit-breaker"
    assert summary["safety_stop"].startswith("circuit breaker: 1 nodes newly fail, 5 pending (failing now, their "
                                             "hold not yet elapsed) and 0 on the remediation ladder")
    assert summary["breaker"] == {"failing": 1, "pending": 5, "ladder": 0, "limit": 2}
    # Counted, never failed: the pending nodes are ok and left alone, and say what is pending on them.
    assert {nodes[n]["status"] for n in PENDING} == {"ok"} and {nodes[n]["action"] for n in PENDING} == {"none"}
    assert nodes["gpu002"]["pending"] == [{"id": "xid-79", "severity": "fail", "status": "pending", "gpu": "gpu3",
                                           "value": 1, "threshold": 0, "evidence": "gpu3 xid=79 count=1"}]
    assert "pending" not in nodes["gpu001"]  # its hold has elapsed: a failure, not also pending
    # No query more: the recorded results carry the pending series, a direct rule's one query returns them.
    assert summary["queries"] == (5 if path == "recorded" else 5 + len(world.prom.rules))


def test_defect_11_nodes_the_ladder_holds_for_a_reset_or_reboot_count_beside_the_failures(tmp_path):
    world = World(tmp_path, n=8, raw={"safety": {"max_out_of_service_fraction": 1.0}},
                  gpu002=node("gpu002", flags=("DRAIN",), reason="opsctl:reset gpu3 xid-79 gpu3 xid=79 count=1"),
                  gpu003=node("gpu003", "down", flags=("REBOOT_REQUESTED",),
                              reason="opsctl:reboot gpu1 xid-79 no validation 10m after the reset"))
    world.prom.breach("xid-79", "gpu001", "3")
    code, nodes, summary = world.json("--drain")
    assert world.slurm.calls == [] and code == 4
    assert nodes["gpu001"]["action"] == "skip:circuit-breaker"
    assert summary["breaker"] == {"failing": 1, "pending": 0, "ladder": 2, "limit": 2}
    assert "1 nodes newly fail, 0 pending" in summary["safety_stop"]
    assert "and 2 on the remediation ladder (a reset or a reboot): 3 in all, more than the limit 2" in \
        summary["safety_stop"]


def test_pending_alone_stops_nothing_and_a_lone_fault_still_drains(tmp_path):
    world = World(tmp_path, n=8)
    world.prom.pending("xid-79", "gpu004", "3")
    code, nodes, summary = world.json("--drain")
    assert (code, world.slurm.calls, summary["safety_stop"]) == (0, [], None)
    assert nodes["gpu004"]["status"] == "ok" and nodes["gpu004"]["action"] == "none"
    assert summary["breaker"] == {"failing": 0, "pending": 1, "ladder": 0, "limit": 2}
    world.prom.breach("xid-79", "gpu001", "3")  # one failing and one pending: 2, not more than 2
    code, nodes, summary = world.json("--drain")
    assert code == 1 and nodes["gpu001"]["action"] == "drain" and nodes["gpu004"]["action"] == "none"
    assert [call[0] for call in world.slurm.calls] == ["drain"]


@pytest.mark.parametrize("held", [True, False])
def test_pending_counts_only_on_nodes_a_drain_could_reach(tmp_path, held):
    """Six nodes pending beside one failing pass the limit of 6.4 (64 nodes), unless someone else's drain
    or Slurm holds them: those could never be drained, so they are coming to nothing."""
    others = [f"gpu{i:03d}" for i in range(2, 8)]
    holds = {n: node(n, flags=("DRAIN",), reason="a person's repair") for n in others[:3]}
    holds.update({n: node(n, "down", flags=("NOT_RESPONDING",)) for n in others[3:]})
    world = World(tmp_path, **(holds if held else {}))
    world.prom.breach("xid-79", "gpu001", "3")
    for name in others:
        world.prom.pending("xid-79", name, "3")
    code, nodes, summary = world.json("--drain")
    assert summary["breaker"]["pending"] == (0 if held else 6)
    assert nodes["gpu001"]["action"] == ("drain" if held else "skip:circuit-breaker")


def test_the_table_and_watch_say_what_the_breaker_counted(tmp_path):
    world = staggered(tmp_path, "recorded")
    assert world.run("health", "--drain", "--dry-run") == 4
    lines = world.stdout.splitlines()
    assert any(line.endswith("breaker counts 1 failing, 5 pending, 0 on the ladder (limit 2)") for line in lines)
    assert any(line.startswith("safety stop: circuit breaker: 1 nodes newly fail, 5 pending") for line in lines)


def test_a_run_that_plans_no_drains_counts_nothing(tmp_path):
    world = staggered(tmp_path, "recorded")
    code, _, summary = world.json()
    assert code == 1 and summary["breaker"] is None and summary["safety_stop"] is None


def test_the_recording_rules_record_the_pending_series_and_the_alerts_do_not(tmp_path):
    world = World(tmp_path)
    assert world.run("rules", "export", "--format", "prometheus") == 0
    groups = yaml.safe_load(world.stdout)["groups"]
    recorded = {g["name"].removeprefix(precomputed.GROUP_PREFIX): g["rules"][-1]["expr"] for g in groups
                if g["name"].startswith(precomputed.GROUP_PREFIX)}
    alerts = [r for g in groups for r in g["rules"] if "alert" in r]
    # alerts: held breaches only (they read the recorded ones without the pending series)
    assert alerts and not any(f'"{PENDING_LABEL}", "1"' in alert["expr"] for alert in alerts)
    assert all(f'{PENDING_LABEL}=""' in alert["expr"] for alert in alerts if alert["alert"].startswith("OpsctlXid"))
    for rule in world.prom.rules:
        pending = rule.pending_expr()
        assert bool(pending) == (rule.action == "drain" and bool(rule.plot_expr)), rule.id
        if rule.id not in recorded:  # an XID rule: its stage 2 is a part of the XID group's last rule
            mine = precomputed.hold_expr(rule)
            assert f"({mine})" in recorded["xid"], rule.id
            assert (PENDING_LABEL in mine) == bool(pending), rule.id
            continue
        assert (PENDING_LABEL in recorded[rule.id]) == bool(pending), rule.id
    assert precomputed.hold_expr(world.prom.rule("xid-79")).endswith('"opsctl_pending", "1", "", "")')


def test_the_breaker_reads_the_ladders_steps_as_the_ladder_does():
    """opsctl.health may not import opsctl.ladder (that imports opsctl.health): both read the reason words
    of opsctl/health/ladder_reason.py, and the breaker's reading agrees with the ladder's own."""
    reasons = ["opsctl:reset gpu3 xid-79 gpu3 xid=79 count=1", "opsctl:reboot node xid-79 after the reset",
               "opsctl:validated-pass gpu3 xid-79 after-reset", "opsctl:rma gpu3 xid-79 serial=1",
               "opsctl:unvalidated gpu3 xid-79 no answer", "opsctl:xid-79 gpu3 xid=79 count=1",
               "opsctl:manual reset gpu3 xid-79", "opsctl:reset gpu3", "reset gpu3 xid-79 by a person"]
    for reason in reasons:
        drained = node("gpu001", flags=("DRAIN",), reason=reason)
        rung = rung_of(drained)
        assert ladder_holds(drained) == (rung is not None and rung.step in (RESET, REBOOT)), reason
        assert not ladder_holds(node("gpu001", reason=reason)), reason  # in service: the ladder holds nothing


class CoversXid79OnGpu004:
    """What opsctl already acted on (opsctl.health.evaluate.Memory): XID 79 on gpu004's GPU 3."""

    def covers(self, node_name, check, now):
        return (node_name, check.id, check.device) == ("gpu004", "xid-79", "gpu3")


def test_an_event_opsctl_already_acted_on_is_not_pending_again(tmp_path):
    world = World(tmp_path, n=8)
    for name in ("gpu004", "gpu005"):
        world.prom.pending("xid-79", name, "3")
    report = evaluate(world.prom, world.prom.rules, world.config, world.slurm.state, CoversXid79OnGpu004(), 1.0)
    assert [c.device for c in report.nodes["gpu005"].pending] == ["gpu3"]
    assert report.nodes["gpu004"].pending == [] and report.nodes["gpu004"].status == "ok"
