"""`opsctl node check --remediate-self`, the node's part of the ladder, against the lab's emulated H200: its
`nvidia-smi -r`, `-pm` and `dcgmi diag -j` (opsctl_lab.hwtools, in process), and a fake of opsctl's Slurm
protocol. The head's part (`opsctl remediate`) then reads the answer: tests/unit/test_remediate.py."""

import json
from dataclasses import replace

from opsctl.actor.result import ActionResult
from opsctl.config import parse_config
from opsctl.ladder.node_step import take_step
from opsctl.slurm import SlurmNode
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.hwtools.nvidia_smi import gpu_serial
from tests.unit.emulated_gpus import NOW, EmulatedGpus
from tests.unit.fakes import FakeSlurm, node


def setup(tmp_path, reason, fault=None, state="idle", flags=("DRAIN",)):
    config = parse_config({}, "t", {"OPSCTL_STATE_DIR": str(tmp_path / "state")})
    hw = NodeHardware(node="gpu007")
    if fault:
        hw.inject(fault, gpu=2, now=NOW - 60)
    slurm = FakeSlurm({"gpu007": node("gpu007", state=state, flags=flags, reason=reason)})
    return config, hw, slurm, EmulatedGpus(hw)


def test_a_reset_asked_for_is_done_with_persistence_off_around_it_then_checked_and_answered(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, "opsctl:reset gpu2 row-remap-pending row_remap_pending=1",
                                    "row-remap-pending")
    step = take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    resetting = gpus.calls.index("-r -i 2")
    assert gpus.calls[resetting - 1:resetting + 2] == ["-pm 0 -i 2", "-r -i 2", "-pm 1 -i 2"]
    assert gpus.calls[-1].startswith("diag -r 2 -j -i 2")
    assert step.reason == "opsctl:validated-pass gpu2 row-remap-pending after-reset pass"
    assert slurm.state["gpu007"].reason == step.reason and hw.persistence_mode(2)
    assert [r["event"] for r in map(json.loads, (tmp_path / "state" / "audit.jsonl").read_text().splitlines())] \
        == ["validated"]


def test_the_answer_is_in_the_action_result_that_node_check_renders(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, "opsctl:reset gpu2 row-remap-pending row_remap_pending=1",
                                    "row-remap-pending")
    action = ActionResult()
    step = take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus, result=action)
    assert action.done == [f"validated gpu007: {step.reason}"] and action.refused == {}


def test_a_sticky_fault_fails_the_diagnostics_and_leaves_the_evidence_for_the_vendor(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, "opsctl:reset gpu2 row-remap-failure row_remap_failure=1",
                                    "row-remap-failure")
    step = take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    serial = gpu_serial("gpu007", 2)
    assert step.reason.startswith(f"opsctl:validated-fail gpu2 row-remap-failure after-reset serial={serial} fail: "
                                  "software on GPU 2")
    [kept] = (tmp_path / "state" / "validation").iterdir()
    assert json.loads((kept / "dcgmi-diag.json").read_text())["DCGM Diagnostic"]
    assert serial in (kept / "nvidia-smi-q.txt").read_text()
    assert "nvidia-bug-report.sh" not in " ".join(gpus.calls)  # after a reset: the ladder reboots, no RMA yet


def test_a_failure_after_a_reboot_adds_nvidia_bug_report_where_it_is_installed(tmp_path):
    for installed in (True, False):
        config, hw, slurm, gpus = setup(tmp_path / str(installed), "opsctl:reboot gpu2 row-remap-failure "
                                        "row_remap_failure=1", "row-remap-failure", state="down", flags=())
        gpus.bug_report = "nvidia-bug-report output" if installed else None
        step = take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
        assert step.reason.startswith(f"opsctl:validated-fail gpu2 row-remap-failure after-reboot serial="
                                      f"{gpu_serial('gpu007', 2)} fail")
        [kept] = (tmp_path / str(installed) / "state" / "validation").iterdir()
        assert {p.name for p in kept.iterdir()} == {"dcgmi-diag.json", "nvidia-smi-q.txt"} | (
            {"nvidia-bug-report.log.gz"} if installed else set())


def test_a_reset_refused_is_unchecked_never_a_pass(tmp_path):
    """A holder opsctl does not stop (no service to stop named: remediation.reset_stops empty): nvidia-smi refuses
    the reset, and its words are the answer."""
    config, hw, slurm, gpus = setup(tmp_path, "opsctl:reset gpu2 xid-48 xid=48 count=1")
    config = replace(config, remediation=replace(config.remediation, reset_stops=()))
    step = take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    assert step.reason.startswith("opsctl:validated-unchecked gpu2 xid-48 after-reset reset failed (exit 255): The "
                                  "following GPUs could not be reset")
    assert gpus.calls[-1] == "-pm 1 -i 2"  # persistence mode back on, after the refusal too


def test_a_passing_diag_with_another_check_failing_is_a_failed_validation(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, "opsctl:reboot gpu2 xid-79 xid=79 count=1", state="down", flags=())
    step = take_step(config, slurm, "gpu007", False, "other checks failed: ib-port-state mlx5_3", run=gpus, now=NOW,
                     pace=gpus)
    assert step.reason == "opsctl:validated-fail gpu2 xid-79 after-reboot other checks failed: ib-port-state mlx5_3"
    assert not any(call.startswith("-r") for call in gpus.calls)  # after a reboot: checks only


def test_nothing_is_done_while_jobs_run_a_reboot_is_under_way_or_the_reason_is_not_the_ladders(tmp_path):
    for reason, state, flags in [("opsctl:reset gpu2 xid-48", "mixed", ("DRAIN",)),
                                 ("opsctl:reboot gpu2 xid-79", "down", ("REBOOT_ISSUED",)),
                                 ("opsctl:xid-79 gpu2 xid=79 count=1", "idle", ("DRAIN",)),
                                 ("opsctl:reset gpu2 xid-48", "idle", ("DRAIN", "MAINT")),
                                 ("swap gpu2, ticket 7", "idle", ("DRAIN",))]:
        config, hw, slurm, gpus = setup(tmp_path, reason, state=state, flags=flags)
        step = take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
        assert (gpus.calls, slurm.calls, step.reason) == ([], [], ""), reason


def test_a_person_who_changed_the_reason_meanwhile_wins(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, "opsctl:reset gpu2 xid-48 xid=48 count=1")
    original = slurm.nodes

    def person_meanwhile():
        seen = original()
        slurm.state["gpu007"] = replace(slurm.state["gpu007"], reason="mine now, ticket 9")
        slurm.nodes = original
        return seen

    slurm.nodes = person_meanwhile
    step = take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    assert step.reason == "" and "changed meanwhile" in step.line
    assert slurm.state["gpu007"].reason == "mine now, ticket 9" and slurm.calls == []


def test_slurm_unreadable_is_a_line_not_an_error(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, "opsctl:reset gpu2 xid-48")

    def down():
        from opsctl.errors import SourceUnavailable
        raise SourceUnavailable("Slurm: scontrol: cannot reach slurmctld")

    slurm.nodes = down
    assert "Slurm unreadable" in take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus).line


def test_the_head_resumes_what_the_node_validated(tmp_path):
    """The node's answer is what the head's ladder reads: a pass is resumed."""
    from opsctl.ladder.remediate import remediate

    config, hw, slurm, gpus = setup(tmp_path, "opsctl:reset gpu2 ecc-dbe-new dbe_increase=1", "dbe")
    take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    assert slurm.state["gpu007"].reason.startswith("opsctl:validated-pass gpu2 ecc-dbe-new after-reset")
    assert remediate(config, slurm, dry_run=False).made == ["gpu007"]
    assert slurm.state["gpu007"] == SlurmNode("gpu007", "idle", (), "", partitions=("gpu",), gres="gpu:h200:8")
