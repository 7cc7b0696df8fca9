"""Issue 43's defects 2, 5, 6 and 9: one judgement of "may opsctl touch this node" (opsctl/slurm/reach.py) for
the ladder's every step, the node's own step and the rollout; a hold that reaches the node; a reboot's timeout
that counts from the boot Slurm reports. Over fakes of opsctl's Slurm protocol and the lab's emulated GPUs;
tests/integration/lab/test_health_remediation_lab.py runs the hold against the real slurmctld."""

import calendar
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest

from opsctl.config import parse_config
from opsctl.config.fields import duration_seconds
from opsctl.health.xid import xid_catalog
from opsctl.ladder.node_step import take_step
from opsctl.ladder.plan import Budgets, plan_ladder
from opsctl.rollout.batch import drain_batch, reboot_batch
from opsctl.slurm.base import DOWN_STATES, IN_SERVICE_FLAGS, OUT_OF_SERVICE_FLAGS
from opsctl.slurm.reach import FLAGS, HANDS_OFF, STATES, reach
from opsctl_lab.hardware import NodeHardware
from tests.unit.emulated_gpus import NOW, EmulatedGpus
from tests.unit.fakes import FakeSlurm, World, gpu_nodes, node

# What Slurm may hold a node for, beside opsctl's ladder step (the list, and the rest of the table).
SLURM_HOLDS = [("down", ("NOT_RESPONDING",)), ("down", ("DRAIN", "NOT_RESPONDING")), ("idle", ("DRAIN", "FAIL")),
               ("idle", ("DRAIN", "INVALID_REG")), ("idle", ("DRAIN", "POWERED_DOWN")),
               ("idle", ("DRAIN", "POWER_DRAIN")), ("idle", ("DRAIN", "REBOOT_REQUESTED")),
               ("idle", ("DRAIN", "MAINTENANCE")), ("idle", ("DRAIN", "RESERVED")), ("future", ("DRAIN",))]


def iso(seconds):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


@pytest.mark.parametrize("state,flags", SLURM_HOLDS)
def test_defect_2_a_validated_node_that_slurm_holds_is_never_resumed(tmp_path, state, flags):
    w = World(tmp_path, gpu040=node("gpu040", state=state, flags=flags,
                                    reason="opsctl:validated-pass gpu3 xid-79 after-reboot pass"))
    w.run("remediate")
    assert w.slurm.calls == []
    [refusal] = [r for r in w.audit() if r["event"] == "refuse"]
    assert refusal["detail"].startswith("slurm-state: held by Slurm:")


@pytest.mark.parametrize("reason", ["opsctl:validated-unchecked gpu3 row-remap-pending after-reset reset failed",
                                    "opsctl:validated-fail gpu3 row-remap-failure after-reset fail"])
def test_defect_2_a_powered_down_node_is_never_rebooted(tmp_path, reason):
    w = World(tmp_path, gpu040=node("gpu040", flags=("DRAIN", "POWERED_DOWN"), reason=reason))
    w.run("remediate")
    assert w.slurm.calls == []


def test_defect_2_a_node_in_maintenance_is_not_reworded_to_rma(tmp_path):
    inspect = "opsctl:xid-inspect gpu3 xid=142 count=1"  # NVIDIA's catalog: inspect, straight to RMA
    w = World(tmp_path, gpu040=node("gpu040", flags=("DRAIN", "MAINT"), reason=inspect))
    w.run("remediate")
    assert w.slurm.calls == []
    w.slurm.state["gpu040"] = replace(w.slurm.state["gpu040"], flags=("DRAIN",))  # the maintenance is over
    w.run("remediate")
    assert w.slurm.state["gpu040"].reason.startswith("opsctl:rma gpu3 xid-inspect")


def test_defect_2_the_judgement_lists_every_state_and_flag_and_waits_only_for_its_own_reboot():
    assert all(kind in ("service", "drain", "down", "reboot", "hands-off") for kind, _ in
               [*STATES.values(), *FLAGS.values()])
    rebooting = node("gpu001", state="down", flags=("REBOOT_ISSUED",), reason="opsctl:reboot gpu3 xid-79")
    assert reach(rebooting, rebooting=True).verdict == "wait"
    assert reach(rebooting).verdict == HANDS_OFF  # the same flags on any other step: someone else's reboot
    back = node("gpu001", state="down", reason="opsctl:validated-pass gpu3 xid-79 after-reboot pass")
    assert reach(back, down_ok=True).ok and not reach(back).ok
    assert not reach(node("gpu001", flags=("DRAIN", "NEW_FLAG_OF_2027"), reason="opsctl:xid-79 gpu3")).ok
    assert not reach(node("gpu001", flags=("DRAIN",), reason="opsctl:manual swap gpu3")).ok
    assert reach(node("gpu001"), take=True).ok and not reach(node("gpu001", reason="bad psu"), take=True).ok


def test_defect_5_a_hold_reaches_the_node_which_then_runs_no_reset(tmp_path):
    reason = "opsctl:reset gpu2 row-remap-pending row_remap_pending=1"
    w = World(tmp_path, gpu007=node("gpu007", flags=("DRAIN",), reason=reason))
    hw = NodeHardware(node="gpu007")
    hw.inject("row-remap-pending", gpu=2, now=NOW - 60)
    assert w.run("hold", "gpu007", "--reason", "vendor on site") == 0
    assert w.slurm.state["gpu007"].reason != reason  # the hold is in Slurm, where the node reads it
    gpus = EmulatedGpus(hw)
    take_step(w.config, w.slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    assert gpus.calls == []
    assert w.run("hold", "gpu007", "--release") == 0
    assert w.slurm.state["gpu007"].reason == reason  # the step it was on, back
    take_step(w.config, w.slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    assert "-r -i 2" in gpus.calls


def test_defect_5_the_health_run_and_the_ladder_leave_a_held_node_alone(tmp_path):
    w = World(tmp_path, raw={"safety": {"resume_after": "0s"}},
              gpu007=node("gpu007", flags=("DRAIN",), reason="opsctl:ib-down mlx5_0 state_id=1"))
    assert w.run("hold", "gpu007", "--reason", "cable swap") == 0
    held = w.slurm.state["gpu007"].reason
    calls = len(w.slurm.calls)
    w.run("health", "--drain", "--resume")  # the port reads ok: the resume would lift an unheld drain
    w.run("remediate")
    assert len(w.slurm.calls) == calls and w.slurm.state["gpu007"].reason == held


def _reboot_records(name, at):
    return [{"event": "drain", "node": name, "time": iso(at - 60), "checks": ["xid-79"], "evidence": "gpu3"},
            {"event": "reboot", "node": name, "time": iso(at), "checks": ["xid-79"]}]


def test_defect_6_a_reboot_that_waited_for_a_long_job_is_not_unvalidated_when_it_comes_back(tmp_path):
    config = parse_config({}, "t", {"OPSCTL_STATE_DIR": str(tmp_path / "state")})
    now = float(calendar.timegm(time.gmtime(NOW)))
    asked = now - 3 * 3600  # `scontrol reboot ASAP` three hours ago; a job ran until a minute ago
    back = replace(node("gpu040", state="down", reason="opsctl:reboot gpu3 xid-79 xid=79 count=1"), boot_time=now - 60)
    plan = plan_ladder({"gpu040": back}, xid_catalog(), _reboot_records("gpu040", asked), set(), Budgets(), config, now)
    assert [d.action for d in plan.decisions] == ["wait"]
    # The same node, step_timeout after its boot with no answer from its checks: a person's.
    later = now + duration_seconds(config.remediation.step_timeout) + 60
    plan = plan_ladder({"gpu040": back}, xid_catalog(), _reboot_records("gpu040", asked), set(), Budgets(), config,
                       later)
    assert [d.action for d in plan.decisions] == ["unvalidated"]


def test_defect_9_the_rollout_never_reboots_a_node_in_a_persons_maintenance_reservation(tmp_path):
    reason = "opsctl:provision nvidia driver 570.172.08"
    config = parse_config({}, "t", {"OPSCTL_STATE_DIR": str(tmp_path / "state")})
    slurm = FakeSlurm(gpu_nodes(4, gpu001=node("gpu001", flags=("DRAIN", "MAINT"), reason=reason),
                                gpu002=node("gpu002", flags=("DRAIN", "RESERVED"), reason=reason)))
    outcome = drain_batch(config, slurm, "gpu[001-002]", "nvidia driver 570.172.08", 0, clock=lambda: 0.0,
                          sleep=lambda _: None, now=NOW)
    assert outcome.drained == [] and set(outcome.skipped) == {"gpu001", "gpu002"}
    back, lines = reboot_batch(config, slurm, "gpu[001-002]", "nvidia driver 570.172.08", 0, clock=lambda: 0.0,
                               sleep=lambda _: None, now=NOW)
    assert slurm.calls == [] and back == []


def test_defect_2_docs_remediation_has_a_row_for_every_state_and_flag_with_its_kind():
    doc = (Path(__file__).parents[2] / "docs" / "remediation.md").read_text()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| (?:state|flag) `([A-Za-z_]+)` \| [^|]+ \| ([a-z-]+) \|",
                                                         doc, re.MULTILINE)}
    assert rows == {name: kind for name, (kind, _) in [*STATES.items(), *FLAGS.items()]}


def test_the_state_sets_of_slurm_base_agree_with_the_one_table():
    assert IN_SERVICE_FLAGS <= {name for name, (kind, _) in FLAGS.items() if kind in ("service", "drain")}
    assert OUT_OF_SERVICE_FLAGS <= {name for name, (kind, _) in FLAGS.items() if kind not in ("service", "drain")}
    assert DOWN_STATES <= {name for name, (kind, _) in STATES.items() if kind in ("down", "hands-off")}


@pytest.mark.parametrize("state,flags", [*SLURM_HOLDS, ("idle", ("DRAIN", "SOME_FLAG_OF_2030"))])
def test_defect_2_the_nodes_own_step_takes_no_step_on_a_node_slurm_holds(tmp_path, state, flags):
    hw = NodeHardware(node="gpu007")
    slurm = FakeSlurm({"gpu007": node("gpu007", state=state, flags=flags, reason="opsctl:reset gpu2 xid-48 x")})
    gpus = EmulatedGpus(hw)
    config = parse_config({}, "t", {"OPSCTL_STATE_DIR": str(tmp_path / "state")})
    take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    assert (gpus.calls, slurm.calls) == ([], [])


@pytest.mark.parametrize("flags", [("DRAIN", "MAINT"), ("DRAIN", "POWERED_DOWN"), ("DRAIN", "SOME_FLAG_OF_2030")])
def test_defect_2_the_health_run_adds_no_fault_to_a_node_slurm_holds(tmp_path, flags):
    w = World(tmp_path, gpu040=node("gpu040", flags=flags, reason="opsctl:reset gpu1 xid-48 xid=48 count=1"))
    w.prom.breach("xid-79", "gpu040", "3")
    code, nodes, _ = w.json("--drain")
    assert w.slurm.calls == [] and nodes["gpu040"]["action"] == "skip:slurm-state"
