"""Fabric Manager in the emulated hardware: a lab machine's boot leaves the NVSwitch fabric Not Started until its
Fabric Manager starts, which then trains it; the simulated lab, which runs none, trains from the boot. A reboot
(the supervisor's marker) ends the faults that a reboot ends; the lab stopping and starting a machine ends none."""

import json
from pathlib import Path

from opsctl_lab.hardware import (
    FABRIC_IN_PROGRESS,
    FABRIC_NOT_STARTED,
    FABRIC_SUCCESS,
    FABRIC_TRAINING_S,
    NodeHardware,
    fault_label,
)
from opsctl_lab.machines import boot
from opsctl_lab.machines.hwinstall import FABRICMANAGER_UNIT_TEXT, SYSFS_UNIT
from opsctl_lab.machines.settings import Settings

BOOT = 1_800_000_000.0


def statuses(hw: NodeHardware, now: float) -> set[int]:
    return {hw.fabric_status(gpu, now) for gpu in range(8)}


def lab_machine(training_s: float = 60.0) -> NodeHardware:
    """A GPU machine's hardware, just booted at BOOT (after a reboot: its boot time is the reboot's)."""
    hw = NodeHardware(node="gpu1", fabric_training_s=training_s)
    boot.start_board(hw, rebooted=True, now=BOOT)
    return hw


def test_a_boot_leaves_the_fabric_not_started_until_fabric_manager_starts_then_it_trains():
    hw = lab_machine()
    assert statuses(hw, BOOT + 600) == {FABRIC_NOT_STARTED}  # no Fabric Manager, no training, however long
    hw.start_fabric_manager(now=BOOT + 700)
    assert statuses(hw, BOOT + 700 + 10) == {FABRIC_NOT_STARTED}  # the first quarter
    assert statuses(hw, BOOT + 700 + 20) == {FABRIC_IN_PROGRESS}
    assert statuses(hw, BOOT + 700 + 60) == {FABRIC_SUCCESS}


def test_a_reset_while_the_fabric_trains_trains_that_gpu_again_from_the_reset():
    hw = lab_machine()
    hw.start_fabric_manager(now=BOOT + 5)
    hw.reset_gpu(3, now=BOOT + 40)
    assert hw.fabric_status(3, BOOT + 70) == FABRIC_IN_PROGRESS and hw.fabric_status(2, BOOT + 70) == FABRIC_SUCCESS
    assert hw.fabric_status(3, BOOT + 100) == FABRIC_SUCCESS


def test_a_reset_before_fabric_manager_starts_trains_nothing():
    hw = lab_machine()
    hw.reset_gpu(3, now=BOOT + 5)
    assert hw.fabric_status(3, BOOT + 600) == FABRIC_NOT_STARTED


def test_the_faults_that_hold_the_fabric_still_hold_it_after_fabric_manager_starts():
    hw = lab_machine()
    hw.inject("fabric-stuck", gpu=1, now=BOOT)
    hw.start_fabric_manager(now=BOOT + 5)
    assert hw.fabric_status(1, BOOT + 600) == FABRIC_IN_PROGRESS and hw.fabric_status(0, BOOT + 600) == FABRIC_SUCCESS


def test_the_simulated_lab_runs_no_fabric_manager_and_trains_from_the_boot():
    hw = NodeHardware(node="gpu001", booted=BOOT)
    assert hw.fabric_training_s == FABRIC_TRAINING_S == 4.0
    assert statuses(hw, BOOT + 0.5) == {FABRIC_NOT_STARTED}
    assert statuses(hw, BOOT + 2) == {FABRIC_IN_PROGRESS}
    assert statuses(hw, BOOT + 4) == {FABRIC_SUCCESS}
    hw.reboot(now=BOOT + 100)  # the simulated lab's reboot program: still no Fabric Manager to wait for
    assert statuses(hw, BOOT + 101.5) == {FABRIC_IN_PROGRESS} and statuses(hw, BOOT + 104) == {FABRIC_SUCCESS}


def test_a_state_file_from_before_fabric_manager_loads_and_trains_from_the_boot(tmp_path):
    state = tmp_path / "hardware.json"
    state.write_text(json.dumps({"node": "gpu1", "booted": BOOT, "active": [], "fabric_training_s": 4.0}))
    hw = NodeHardware.load(state, "gpu1")
    assert statuses(hw, BOOT + 2) == {FABRIC_IN_PROGRESS} and statuses(hw, BOOT + 4) == {FABRIC_SUCCESS}


def test_fabric_manager_not_started_and_its_start_survive_the_state_file(tmp_path):
    state = tmp_path / "hardware.json"
    hw = lab_machine()
    hw.save(state)
    assert statuses(NodeHardware.load(state, "gpu1"), BOOT + 600) == {FABRIC_NOT_STARTED}
    hw.start_fabric_manager(now=BOOT + 10)
    hw.save(state)
    assert statuses(NodeHardware.load(state, "gpu1"), BOOT + 70) == {FABRIC_SUCCESS}


def test_a_boot_after_a_reboot_ends_the_faults_a_reboot_ends_and_starts_the_kernel_log_again():
    hw = NodeHardware(node="gpu1")
    hw.inject("xid-kernel:79", gpu=2, now=BOOT - 100)
    hw.inject("row-remap-failure", gpu=4, now=BOOT - 100)
    ended = boot.start_board(hw, rebooted=True, now=BOOT)
    assert [fault_label(f) for f in ended] == ["xid-kernel:79 gpu2"]
    assert [fault_label(f) for f in hw.active] == ["row-remap-failure gpu4"]
    assert hw.kernel_log == [] and hw.booted == BOOT


def test_a_boot_after_the_lab_stopped_the_machine_keeps_every_fault_and_still_waits_for_fabric_manager():
    hw = NodeHardware(node="gpu1")
    hw.inject("xid-kernel:79", gpu=2, now=BOOT - 100)
    booted = hw.booted
    assert boot.start_board(hw, rebooted=False, now=BOOT) == []
    assert [fault_label(f) for f in hw.active] == ["xid-kernel:79 gpu2"] and len(hw.kernel_log) == 1
    assert hw.booted == booted and statuses(hw, BOOT + 600) == {FABRIC_NOT_STARTED}


def test_the_reboot_marker_is_next_to_the_state_file(tmp_path):
    marker = boot.reboot_marker(tmp_path / "hardware.json")
    assert marker == tmp_path / boot.REBOOT_MARKER_NAME
    marker.write_text("1\n")
    boot.forget_reboot(marker)
    boot.forget_reboot(marker)  # a boot without one
    assert not marker.exists()


def test_the_fabric_manager_unit_records_its_start_after_the_boot_time_unit():
    lines = FABRICMANAGER_UNIT_TEXT.splitlines()
    assert f"After={SYSFS_UNIT}" in lines
    assert "ExecStartPre=/usr/local/sbin/opsctl-hw fabricmanager" in lines


def test_the_lab_machines_train_for_a_minute_unless_the_environment_says_otherwise(monkeypatch):
    monkeypatch.delenv("OPSCTL_LAB_FABRIC_TRAINING_S", raising=False)
    assert Settings().fabric_training_s == 60.0
    monkeypatch.setenv("OPSCTL_LAB_FABRIC_TRAINING_S", "10")
    assert Settings().fabric_training_s == 10.0


def test_up_writes_the_labs_training_time_into_each_gpu_machines_state(tmp_path):
    from opsctl_lab.installed_tools import HW_STATE
    from opsctl_lab.machines import hwinstall

    upper = tmp_path / "upper"
    hwinstall.install(upper, "gpu1", "10.213.1.11")
    state = upper / HW_STATE.lstrip("/")
    assert hwinstall.set_fabric_training(state, "gpu1", 20.0).fabric_training_s == 20.0
    assert NodeHardware.load(state, "gpu1").fabric_training_s == 20.0
    hwinstall.install(upper, "gpu1", "10.213.1.11")  # the next `up` keeps it, unless the setting changed
    assert NodeHardware.load(state, "gpu1").fabric_training_s == 20.0
    hwinstall.set_fabric_training(state, "gpu1", 10.0)
    assert NodeHardware.load(state, "gpu1").fabric_training_s == 10.0


def test_the_supervisor_marks_a_reboot_next_to_a_gpu_machines_state_only(tmp_path):
    from opsctl_lab.installed_tools import HW_STATE
    from opsctl_lab.machines import nspawn

    settings = Settings(net=7, state_dir=tmp_path, inventory_dir=tmp_path, apt_cache_dir=tmp_path)
    state = nspawn.upper(settings, "gpu1") / HW_STATE.lstrip("/")
    assert nspawn.reboot_marker(settings, "gpu1") == boot.reboot_marker(state)
    assert nspawn.reboot_marker(settings, "head") is None and nspawn.reboot_marker(settings, "stor1") is None


def test_up_gives_the_slurmds_the_fabric_training_on_top_of_their_registration():
    from opsctl_lab.machines.labstate import SETTLE_S, settle_timeout

    assert settle_timeout(Settings(fabric_training_s=60.0)) == SETTLE_S + 60.0
    assert settle_timeout(Settings(fabric_training_s=10.0)) == SETTLE_S + 10.0


def test_the_supervisors_marker_comes_before_the_command():
    from opsctl_lab.machines.supervise import split_marker

    assert split_marker(["--reboot-marker", "/m", "systemd-nspawn", "-b"]) == (Path("/m"), ["systemd-nspawn", "-b"])
    assert split_marker(["systemd-nspawn", "-b"]) == (None, ["systemd-nspawn", "-b"])
