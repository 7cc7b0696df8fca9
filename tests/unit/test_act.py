"""The one actor (opsctl/actor/act.py): it alone changes nodes in Slurm; its limits survive a crash
after scontrol, a full audit disk and Ctrl-C; compare and set rests on flags and reason; the safety limits
count GPU nodes; `--resume` honours the unknown stop; actions refuse a private state directory. Over
fakes of the Slurm and PromQuery protocols; the lab tier kills a real run right after its scontrol."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from opsctl.actor.act import REBOOT_REFUSED, Actor, Change
from opsctl.actor.state import State
from opsctl.cli import main
from opsctl.clients import Clients
from opsctl.config import parse_config
from opsctl.errors import ExitCode
from opsctl.health.findings import drain_findings, failing_check
from tests.unit.fakes import FakeSlurm, World, gpu_nodes, node

NOW = 1_800_000_000.0


class Killed(BaseException):
    """Stands for SIGKILL right after scontrol: nothing after it in the process runs."""


class KilledAfterChange(FakeSlurm):
    def drain(self, names, reason):
        super().drain(names, reason)
        raise Killed


def test_a_run_killed_right_after_scontrol_has_already_counted_the_drain_and_its_event(tmp_path):
    world = World(tmp_path)
    world.slurm = KilledAfterChange(world.slurm.state)
    world.prom.breach("xid-79", "gpu040", "3")
    with pytest.raises(Killed):
        CliRunner().invoke(main, ["health", "--drain"], obj=Clients(world.config, world.prom, world.slurm),
                           catch_exceptions=False)
    assert world.slurm.nodes()["gpu040"].drained
    state = State(world.config.state_dir)
    budget = json.loads((Path(world.config.state_dir) / "budget.json").read_text())
    assert len(budget["drains"]) == 1
    assert [(r.node, r.rule) for r in state.handled.load().records] == [("gpu040", "xid-79")]


def test_the_budget_holds_across_runs_whose_audit_disk_is_full(tmp_path):
    """Each run drains, cannot audit (exit 3, naming what it did), and the next run still counts it."""
    world = World(tmp_path, raw={"safety": {"max_drains_per_run": 4, "max_drains_per_hour": 8}})
    audit = Path(world.config.audit_log)
    drained = 0
    for run in range(3):
        for i in range(4):
            world.prom.breach("xid-79", f"gpu{10 * run + i + 10:03d}", "3")
        audit.parent.mkdir(parents=True, exist_ok=True)
        audit.unlink(missing_ok=True)
        audit.mkdir()  # every write to it fails, as on a full disk
        code = world.run("health", "--drain")
        audit.rmdir()
        drained_now = sum(1 for n in world.slurm.nodes().values() if n.drained) - drained
        drained += drained_now
        if drained_now:
            assert code == 3 and "done before the error: drain gpu" in world.stdout, (code, world.stdout)
            assert "audit log" in world.stderr
    assert drained == 8


def test_ctrl_c_during_a_run_exits_130_lists_and_audits_what_was_done(tmp_path):
    world = World(tmp_path)

    class InterruptedOnSecond(FakeSlurm):
        def set_reason(self, names, reason):
            raise KeyboardInterrupt

    world.slurm = InterruptedOnSecond(gpu_nodes(64, gpu050=node("gpu050", flags=["DRAIN"],
                                                                 reason="opsctl:ib-down mlx5_0 state_id=1")))
    world.prom.breach("xid-79", "gpu040", "3")
    world.prom.breach("xid-79", "gpu050", "1")  # needs a person: escalates opsctl's own auto-resumable drain
    assert world.run("health", "--drain") == 130
    assert "done before the error: drain gpu040" in world.stdout and "interrupted" in world.stderr
    events = [r["event"] for r in world.audit()]
    assert "drain" in events and "interrupted" in events


def test_compare_and_set_ignores_a_busy_node_moving_between_idle_mixed_and_allocated(tmp_path):
    world = World(tmp_path)

    class Busy(FakeSlurm):
        def nodes(self):
            self.state["gpu040"] = replace(self.state["gpu040"], state=["idle", "mixed", "allocated"][self.reads % 3])
            return super().nodes()

    world.slurm = Busy(world.slurm.state)
    world.prom.breach("xid-79", "gpu040", "3")
    assert world.run("health", "--drain") == 1
    assert world.slurm.nodes()["gpu040"].drained


def test_compare_and_set_still_leaves_a_node_whose_reason_changed(tmp_path):
    config = parse_config({}, "t", {"OPSCTL_STATE_DIR": str(tmp_path / "state")})
    slurm = FakeSlurm(gpu_nodes(8))
    seen = slurm.nodes()["gpu001"]
    slurm.state["gpu001"] = replace(seen, flags=("DRAIN",), reason="ticket-1")
    with Actor(config, slurm, NOW) as actor:
        acted = actor.apply([Change(node="gpu001", event="drain", seen=seen, reason="opsctl:xid-79 gpu3")])
    assert acted.made == [] and [c.node for c, _ in acted.dropped] == ["gpu001"] and slurm.calls == []


@pytest.mark.parametrize("return_to_service,rebooted", [(0, True), (1, True), (2, False)])
def test_a_reboot_is_refused_where_slurm_would_return_the_node_before_its_checks(tmp_path, return_to_service,
                                                                                   rebooted):
    config = parse_config({}, "t", {"OPSCTL_STATE_DIR": str(tmp_path / "state")})
    slurm = FakeSlurm(gpu_nodes(8))
    slurm.state["gpu001"] = replace(slurm.state["gpu001"], flags=("DRAIN",), reason="opsctl:xid-79 gpu3")
    slurm.return_to_service_value = return_to_service
    reboot = Change(node="gpu001", event="reboot", seen=slurm.nodes()["gpu001"], reason="opsctl:reboot gpu3 xid-79")
    with Actor(config, slurm, NOW) as actor:
        acted = actor.apply([reboot])
    audit = [json.loads(line) for line in (tmp_path / "state" / "audit.jsonl").read_text().splitlines()]
    if rebooted:
        assert acted.made == [reboot] and slurm.calls == [("reboot", ("gpu001",), reboot.reason)]
        assert [r["event"] for r in audit] == ["reboot"]
    else:
        assert acted.dropped == [(reboot, REBOOT_REFUSED)] and slurm.calls == []
        assert [(r["event"], r["detail"]) for r in audit] == [("refuse", REBOOT_REFUSED)]
        assert not State(config.state_dir).budgets.recent("reboots", NOW)  # no budget spent on it


def test_resume_alone_honours_the_too_many_unknown_stop(tmp_path):
    world = World(tmp_path, gpu005=node("gpu005", flags=["DRAIN"], reason="opsctl:ib-down mlx5_0 state_id=1"))
    for i in range(20, 65):
        world.prom.up[(f"gpu{i:03d}", "dcgm")] = 0.0
    code, nodes, summary = world.json("--resume")
    assert code == 4 and "no usable data" in summary["safety_stop"]
    assert world.slurm.calls == [] and world.slurm.nodes()["gpu005"].drained


def test_cpu_only_nodes_in_the_partition_do_not_raise_the_breakers_threshold(tmp_path):
    """64 GPU nodes and 40 CPU-only ones: the breaker counts 64 (limit 6.4), not 104 (10.4)."""
    cpu = {f"cpu{i:03d}": replace(node(f"cpu{i:03d}"), gres="") for i in range(1, 41)}
    world = World(tmp_path, **cpu)
    for i in range(10, 18):
        world.prom.breach("xid-79", f"gpu{i:03d}", "3")
    code, _, summary = world.json("--drain")
    assert code == 4 and "circuit breaker" in summary["safety_stop"] and world.slurm.calls == []


def test_an_action_with_a_private_state_directory_is_refused_and_a_read_only_run_is_not(tmp_path, monkeypatch):
    site = tmp_path / "config.yaml"
    site.write_text(f"state_dir: {tmp_path / 'system'}\nmetrics: {{listen_address: null}}\n")
    monkeypatch.setenv("OPSCTL_STATE_DIR", str(tmp_path / "mine"))
    slurm = FakeSlurm(gpu_nodes(8))
    result = CliRunner().invoke(main, ["drain", "gpu001", "--reason", "x", "--config", str(site)],
                                obj=Clients(slurm=slurm))
    assert result.exit_code == 2 and slurm.calls == []
    assert f"OPSCTL_STATE_DIR={tmp_path / 'mine'} is for read-only runs" in result.stderr
    assert "a directory of your own" not in result.stderr
    monkeypatch.setenv("OPSCTL_STATE_DIR", str(tmp_path / "system"))
    result = CliRunner().invoke(main, ["drain", "gpu001", "--reason", "x", "--config", str(site)],
                                obj=Clients(slurm=slurm))
    assert result.exit_code == 0 and slurm.nodes()["gpu001"].drained


def test_a_culprit_that_is_not_a_slurm_node_is_named_and_exits_2(tmp_path):
    """fabric-test's inventory names nodes by FQDN while slurm.conf uses short names: never a silent 0."""
    config = parse_config({}, "t", {"OPSCTL_STATE_DIR": str(tmp_path / "state")})
    slurm = FakeSlurm(gpu_nodes(8))
    found = {"gpu003.cluster.example": [failing_check("ib-fabric", "mlx5_5", "mlx5_5 dead")]}
    result = drain_findings(config, slurm, found, "", dry_run=False, now=NOW)
    assert result.exit_code == ExitCode.USAGE and slurm.calls == []
    assert any(line.startswith("skip:not-in-slurm gpu003.cluster.example:") for line in result.lines), result.lines
