"""The node's ladder step as an HGX board needs it (docs/remediation.md, "Ready before the checks"): it waits for
the NVSwitch fabric that Fabric Manager trains after a reset or a boot, checks every GPU after a reboot or an
NVLink fault, and fails a GPU towards RMA only on a second failing diag. Against the lab's emulated H200
(tests/unit/emulated_gpus.py), whose fabric trains for opsctl_lab.hardware.FABRIC_TRAINING_S after a reset."""

import json
import subprocess
from dataclasses import replace

import pytest

from opsctl.config import parse_config
from opsctl.health.xid import xid_catalog
from opsctl.ladder.node_step import take_step
from opsctl.ladder.plan import Budgets, plan_ladder
from opsctl.ladder.ready import not_ready, wait_ready
from opsctl_lab.hardware import FABRIC_TRAINING_S, NodeHardware
from tests.unit.emulated_gpus import NOW, EmulatedGpus
from tests.unit.fakes import FakeSlurm, node

EVERY_GPU = "0,1,2,3,4,5,6,7"


def setup(tmp_path, reason, fault=None, state="idle", flags=("DRAIN",), booted=None):
    config = parse_config({}, "t", {"OPSCTL_STATE_DIR": str(tmp_path / "state")})
    hw = NodeHardware(node="gpu007")
    if booted is not None:
        hw.booted = booted
    if fault:
        hw.inject(fault, gpu=2, now=NOW - 60)
    slurm = FakeSlurm({"gpu007": node("gpu007", state=state, flags=flags, reason=reason)})
    return config, hw, slurm, EmulatedGpus(hw)


def audit(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "state" / "audit.jsonl").read_text().splitlines()]


def diags(gpus: EmulatedGpus) -> list[str]:
    return [call for call in gpus.calls if call.startswith("diag")]


# ---- reading nvidia-smi ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,why", [
    ("0, Completed, Success, Enabled\n1, Completed, Success, Enabled\n", ""),
    ("0, Completed, Success, Enabled\n1, In Progress, N/A, Enabled\n", "fabric In Progress on GPU 1"),
    ("0, Not Started, N/A, Enabled\n", "fabric Not Started on GPU 0"),
    ("0, Completed, NV_ERR_GENERIC, Enabled\n", "fabric Completed with status NV_ERR_GENERIC on GPU 0"),
    ("0, Completed, Success, Disabled\n", "persistence mode Disabled on GPU 0"),
    ("0, [Not Supported], [Not Supported], Enabled\n", ""),  # a board with no NVSwitch fabric
    ("", "nvidia-smi listed no GPU"),
])
def test_what_is_not_ready_is_named(text, why):
    assert not_ready(text)[1] == why


def test_nvidia_smi_that_fails_while_the_driver_loads_is_not_ready_yet_and_the_wait_ends_at_its_bound():
    class DriverLoading(EmulatedGpus):
        def __call__(self, argv, **_):
            return subprocess.CompletedProcess(argv, 9, "", "NVIDIA-SMI has failed because it couldn't communicate "
                                               "with the NVIDIA driver.\n")

    clock = DriverLoading(NodeHardware(node="gpu007"))
    config = parse_config({"remediation": {"ready_timeout": 60, "ready_services": []}}, "t", {})
    ready = wait_ready(config, clock, clock)
    assert not ready.ready and ready.waited_s == 60 and clock.slept == 60
    assert ready.words() == ("not ready after 60s: nvidia-smi exited 9: NVIDIA-SMI has failed because it couldn't "
                             "communicate with the NVIDIA driver.")


# ---- the wait, on the emulated board --------------------------------------------------------------------------
def test_after_a_reset_the_diag_waits_for_the_fabric_and_the_wait_is_in_the_audit_record(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, "opsctl:reset gpu2 row-remap-pending row_remap_pending=1",
                                    "row-remap-pending")
    step = take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    # Without the wait the diag would meet an untrained fabric ("system not yet initialized") and fail the GPU.
    assert step.reason == "opsctl:validated-pass gpu2 row-remap-pending after-reset pass"
    assert FABRIC_TRAINING_S <= gpus.slept < FABRIC_TRAINING_S + 3
    assert diags(gpus) == ["diag -r 2 -j -i 2"]
    assert audit(tmp_path)[-1]["detail"] == f"pass; ready after {gpus.slept:.0f}s; diag on GPU 2"


def test_the_emulated_diag_fails_a_gpu_whose_fabric_is_not_trained(tmp_path):
    """The lab's twin, as the wait above relies on it: a diag run at the reset's moment fails the GPU."""
    config, hw, slurm, gpus = setup(tmp_path, "opsctl:reset gpu2 xid-48 xid=48 count=1")
    hw.reset_gpu(2, NOW)
    ran = gpus(["dcgmi", "diag", "-r", "2", "-j", "-i", "2"])
    assert ran.returncode != 0 and "system not yet initialized" in ran.stdout
    gpus.sleep(FABRIC_TRAINING_S)
    assert gpus(["dcgmi", "diag", "-r", "2", "-j", "-i", "2"]).returncode == 0


def test_a_fabric_stuck_after_a_reboot_is_unchecked_naming_it_and_the_head_leaves_it_to_a_person(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, "opsctl:reboot gpu2 xid-79 xid=79 count=1", "fabric-stuck",
                                    state="down", flags=(), booted=NOW - 30)
    step = take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    assert step.reason == ("opsctl:validated-unchecked gpu2 xid-79 after-reboot not ready after 300s: fabric In "
                           "Progress on GPU 2")
    assert diags(gpus) == []  # never a diag that would fail it
    plan = plan_ladder(slurm.nodes(), xid_catalog(), audit(tmp_path), set(), Budgets(), config, NOW)
    [decision] = plan.decisions
    assert decision.action == "unvalidated" and "fabric In Progress on GPU 2" in decision.reason


# ---- which GPUs ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reason,fault,state,flags,checked", [
    ("opsctl:reboot gpu2 xid-79 xid=79 count=1", None, "down", (), EVERY_GPU),
    ("opsctl:reset gpu2 xid-74 xid=74 count=1", None, "idle", ("DRAIN",), EVERY_GPU),  # NVIDIA: NVLink workflow
    ("opsctl:reset gpu2 xid-reset xid=74 count=1", None, "idle", ("DRAIN",), EVERY_GPU),
    ("opsctl:reset gpu2 row-remap-pending row_remap_pending=1", "row-remap-pending", "idle", ("DRAIN",), "2"),
    ("opsctl:reset gpu2 xid-48 xid=48 count=1", None, "idle", ("DRAIN",), "2"),
])
def test_a_reboot_or_an_nvlink_fault_checks_every_gpu_a_reset_of_another_the_gpu_alone(tmp_path, reason, fault,
                                                                                        state, flags, checked):
    config, hw, slurm, gpus = setup(tmp_path, reason, fault, state=state, flags=flags)
    step = take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    assert diags(gpus) == [f"diag -r 2 -j -i {checked}"], step.line


def test_a_gpu_that_did_not_come_back_from_the_reboot_is_still_checked_and_never_passes(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, "opsctl:reboot gpu2 xid-79 xid=79 count=1", "gpu-missing",
                                    state="down", flags=())
    step = take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    assert diags(gpus) == ["diag -r 2 -j -i 0,1,2,3,4,5,6,7"]  # nvidia-smi listed 7: the reason's GPU 2 joins them
    assert step.reason.startswith("opsctl:validated-unchecked gpu2 xid-79 after-reboot")
    assert "GPU is lost" in audit(tmp_path)[-1]["detail"]


def test_a_neighbour_that_fails_after_a_reboot_fails_the_step(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, "opsctl:reboot gpu2 xid-79 xid=79 count=1", state="down", flags=())
    hw.inject("row-remap-failure", gpu=5, now=NOW - 60)
    step = take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    assert step.reason.startswith("opsctl:validated-fail gpu2 xid-79 after-reboot") and "GPU 5" in step.reason


# ---- twice before RMA ------------------------------------------------------------------------------------------
class FailsOnce(EmulatedGpus):
    """The first diag meets a fault that is gone by the second (a transient one)."""

    def __call__(self, argv, **kwargs):
        if argv[1] == "diag" and not any(call.startswith("diag") for call in self.calls):
            self.hw.inject("row-remap-failure", gpu=2, now=self.now)
            try:
                return super().__call__(argv, **kwargs)
            finally:
                self.hw.clear(self.now)
        return super().__call__(argv, **kwargs)


def test_a_failure_after_a_reboot_fails_only_on_a_second_failing_run(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, "opsctl:reboot gpu2 row-remap-failure row_remap_failure=1",
                                    "row-remap-failure", state="down", flags=())
    step = take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    assert len(diags(gpus)) == 2 and "failed twice: " in step.reason
    assert step.reason.startswith("opsctl:validated-fail gpu2 row-remap-failure after-reboot serial=")


def test_a_failure_that_does_not_repeat_is_a_persons_never_rma(tmp_path):
    config, hw, slurm, _ = setup(tmp_path, "opsctl:reboot gpu2 xid-79 xid=79 count=1", state="down", flags=())
    gpus = FailsOnce(hw)
    step = take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    assert len(diags(gpus)) == 2
    assert step.reason.startswith("opsctl:validated-unchecked gpu2 xid-79 after-reboot serial=")
    assert "failed once, then pass on a second run" in step.reason
    [decision] = plan_ladder(slurm.nodes(), xid_catalog(), audit(tmp_path), set(), Budgets(), config, NOW).decisions
    assert decision.action == "unvalidated"


def test_a_failure_after_a_reset_runs_once_the_reboot_comes_next(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, "opsctl:reset gpu2 row-remap-failure row_remap_failure=1",
                                    "row-remap-failure")
    step = take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    assert len(diags(gpus)) == 1 and step.reason.startswith("opsctl:validated-fail")


def test_the_ready_timeout_is_bounded_by_what_the_units_allow():
    from opsctl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^config key remediation\.ready_timeout: must be more than 0 and at most"):
        parse_config({"remediation": {"ready_timeout": "11m"}}, "t", {})
    assert parse_config({"remediation": {"ready_timeout": "10m"}}, "t", {}).remediation.ready_timeout == 600


# ---- the reset: what holds the GPU first ---------------------------------------------------------------------
def test_the_monitoring_services_are_stopped_around_the_reset_and_started_again(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, "opsctl:reset gpu2 xid-48 xid=48 count=1")
    step = take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    assert step.reason == "opsctl:validated-pass gpu2 xid-48 after-reset pass"
    calls = gpus.calls
    stop, reset, start = (calls.index(c) for c in ("stop dcgm-exporter nvidia-dcgm", "-r -i 2",
                                                    "start dcgm-exporter nvidia-dcgm"))
    assert stop < reset < start  # the emulator saw no holder at the reset: it would have refused it
    assert hw.monitoring == {"nvidia-dcgm": True, "dcgm-exporter": True} and hw.exporter_serves()


def test_a_service_that_is_not_running_is_neither_stopped_nor_started(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, "opsctl:reset gpu2 xid-48 xid=48 count=1")
    hw.monitoring["dcgm-exporter"] = False  # a person stopped it: it stays so
    take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    assert "stop nvidia-dcgm" in gpus.calls and "start nvidia-dcgm" in gpus.calls
    assert hw.monitoring == {"nvidia-dcgm": True, "dcgm-exporter": False}


def test_a_process_that_holds_the_gpu_is_named_and_nothing_is_reset(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, "opsctl:reset gpu2 xid-48 xid=48 count=1", "gpu-leftover-memory")
    step = take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    assert step.reason.startswith("opsctl:validated-unchecked gpu2 xid-48 after-reset held by python3 (pid ")
    assert step.reason.endswith(") on GPU 2: not reset")
    assert not any(call.startswith("-r") for call in gpus.calls) and diags(gpus) == []
    assert hw.monitoring == {"nvidia-dcgm": True, "dcgm-exporter": True}  # started again after the refusal too


def test_a_service_that_cannot_be_stopped_is_a_refusal_naming_it(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, "opsctl:reset gpu2 xid-48 xid=48 count=1")

    class StopRefused(EmulatedGpus):
        def __call__(self, argv, **kwargs):
            if argv[:2] == ["systemctl", "stop"]:
                self.calls.append(" ".join(argv[1:]))
                return subprocess.CompletedProcess(argv, 1, "", "Failed to stop nvidia-dcgm.service: Access denied\n")
            return super().__call__(argv, **kwargs)

    gpus = StopRefused(hw)
    step = take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    assert step.reason.startswith("opsctl:validated-unchecked gpu2 xid-48 after-reset could not stop dcgm-exporter "
                                  "nvidia-dcgm: Failed to stop")  # capped at safety.reason_max_length
    assert audit(tmp_path)[-1]["detail"] == ("could not stop dcgm-exporter nvidia-dcgm: Failed to stop "
                                             "nvidia-dcgm.service: Access denied")
    assert not any(call.startswith("-r") for call in gpus.calls)


def test_a_service_that_does_not_start_again_is_in_the_audit_record(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, "opsctl:reset gpu2 xid-48 xid=48 count=1")

    class StartFails(EmulatedGpus):
        def __call__(self, argv, **kwargs):
            if argv[:2] == ["systemctl", "start"]:
                return subprocess.CompletedProcess(argv, 1, "", "Job for dcgm-exporter.service failed.\n")
            return super().__call__(argv, **kwargs)

    gpus = StartFails(hw)
    step = take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    assert step.reason == "opsctl:validated-pass gpu2 xid-48 after-reset pass"
    assert audit(tmp_path)[-1]["detail"].endswith(
        "; dcgm-exporter nvidia-dcgm did not start again: Job for dcgm-exporter.service failed.")


def test_the_nvidia_services_must_be_active_before_the_checks(tmp_path):
    """Fabric Manager down after a reboot: its GPUs' fabric stays In Progress and the unit is inactive; both are
    named, nothing is diagnosed."""
    config, hw, slurm, gpus = setup(tmp_path, "opsctl:reboot gpu2 xid-79 xid=79 count=1", state="down", flags=())
    hw.inject("fabricmanager-down", now=NOW - 60)
    config = replace(config, remediation=replace(config.remediation, ready_timeout=20))
    take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    detail = audit(tmp_path)[-1]["detail"]
    assert detail.startswith("not ready after 20s: fabric In Progress on GPU 0, ") and detail.endswith(
        ", nvidia-fabricmanager inactive")
    assert diags(gpus) == [] and "is-active nvidia-persistenced nvidia-fabricmanager" in gpus.calls


def test_a_service_left_out_of_ready_services_is_not_waited_for(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, "opsctl:reboot gpu2 xid-79 xid=79 count=1", state="down", flags=())
    config = replace(config, remediation=replace(config.remediation, ready_services=("nvidia-persistenced",)))
    step = take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    assert step.reason == "opsctl:validated-pass gpu2 xid-79 after-reboot pass"
    assert "is-active nvidia-persistenced" in gpus.calls
