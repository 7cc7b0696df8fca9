"""What a GPU reset and a reboot do to the emulated hardware (FaultSpec.survives_reset / survives_reboot), the
emulated `nvidia-smi -r` in-process, and the xid-kernel fault's record in the node's kernel log."""

import re
import time

import pytest

from opsctl_lab import paths as lp
from opsctl_lab.errors import LabError
from opsctl_lab.hardware import (
    FABRIC_IN_PROGRESS,
    FABRIC_NOT_STARTED,
    FABRIC_SUCCESS,
    FAULTS,
    NodeHardware,
    describe_faults,
    fault_label,
    kernel_log_path,
    parse_fault,
    write_kernel_log,
)
from opsctl_lab.hwtools.nvidia_smi import bus_id, query_gpu, render_q
from opsctl_lab.hwtools.nvidia_smi_reset import RC_IN_USE, gpu_reset, monitoring_holders
from opsctl_lab.hwtools.systemctl import systemctl
from tests.conftest import FIXTURES

VOLATILE = {"xid", "xid-kernel", "dbe", "sbe-storm", "nvlink-errors", "nvlink-crc", "pcie-replays", "pcie-aer",
            "row-remap-pending"}
# A /dev/kmsg record (Documentation/ABI/testing/dev-kmsg) holding the driver's XID line with its process.
RECORD = re.compile(r"(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),-;(?P<message>.*)")
XID_LINE = re.compile(r"NVRM: Xid \(PCI:0000:(?P<bus>[0-9a-f]{2}):00\): (?P<code>\d+), "
                      r"pid=(?P<pid>'<unknown>'|\d+), name=(?P<name>\S+), (?P<text>.+)")


def gpu_faults(hw, gpu):
    return {fault_label(f).split(" ")[0] for f in hw.active if f.gpu == gpu}


def test_the_volatile_faults_are_what_a_reset_and_a_reboot_end():
    assert {name for name, spec in FAULTS.items() if not spec.survives_reset} == VOLATILE
    # the SXid faults are the node's kernel log, which a reboot starts again and a GPU reset keeps; a hung reboot
    # ends with the power cycle that boots the node
    assert {name for name, spec in FAULTS.items() if not spec.survives_reboot} == VOLATILE | {
        "gpu-leftover-memory", "gpu-hang", "sxid-fatal", "sxid-nonfatal", "reboot-hang"}


def test_a_reset_ends_the_gpus_volatile_faults_and_keeps_the_sticky_ones():
    hw = NodeHardware(node="gpu1")
    for fault in ("xid:48", "xid-kernel:62", "dbe", "sbe-storm", "nvlink-errors", "nvlink-crc", "pcie-replays",
                  "pcie-aer", "row-remap-pending", "row-remap-failure", "remapped-rows", "thermal"):
        hw.inject(fault, gpu=3, now=100.0)
    hw.inject("dbe", gpu=4, now=100.0)
    rows = hw.counter(3, "uncorrectable_remapped_rows", 0.0, now=150.0)
    dbe = hw.counter(3, "ecc_dbe_vol", 0.0, now=150.0)
    ended = hw.reset_gpu(3, now=150.0)
    assert {fault_label(f).split(" ")[0] for f in ended} == VOLATILE - {"xid", "xid-kernel"} | {"xid:48",
                                                                                                  "xid-kernel:62"}
    assert gpu_faults(hw, 3) == {"row-remap-failure", "remapped-rows", "thermal"}
    assert gpu_faults(hw, 4) == {"dbe"}  # another GPU's faults are not touched
    # The pending remap is applied, not undone: the remapped rows stay counted; the counters keep their values
    # and stop rising; DCGM's last XID stays, as DCGM keeps it.
    assert hw.counter(3, "uncorrectable_remapped_rows", 0.0, now=999.0) == rows == 1 + 1 + 9
    assert hw.counter(3, "ecc_dbe_vol", 0.0, now=999.0) == dbe
    assert hw.last_xid == {"3": 48}


def test_an_xid_ended_by_a_reset_stays_in_the_windowed_count_until_a_reboot_or_clear():
    """dcgm-exporter's XID window lives in the exporter, which a GPU reset does not restart: the same XID after
    the reset counts 2, the third 3; another GPU's count is its own; the window still ends it."""
    hw = NodeHardware(node="gpu1")
    hw.inject("xid:48", gpu=3, now=100.0)
    hw.reset_gpu(3, now=110.0)
    assert hw.xid_window(3, now=120.0) == {48: 1} and hw.xid_window(2, now=120.0) == {}
    hw.inject("xid:48", gpu=3, now=130.0)
    hw.reset_gpu(3, now=140.0)
    hw.inject("xid:48", gpu=3, now=150.0)
    assert hw.xid_window(3, now=160.0) == {48: 3}
    assert hw.xid_window(3, now=100.0 + 300 + 1) == {48: 2}  # the first has left the 5-minute window
    hw.reboot(now=170.0)
    assert hw.xid_window(3, now=180.0) == {}
    hw.inject("xid:48", gpu=3, now=190.0)
    hw.reset_gpu(3, now=195.0)
    hw.clear(now=200.0)
    assert hw.xid_window(3, now=210.0) == {}


def test_a_reboot_ends_processes_and_volatile_faults_and_starts_a_new_kernel_log():
    hw = NodeHardware(node="gpu1")
    for fault, gpu in (("gpu-leftover-memory", 0), ("xid:79", 1), ("xid-kernel:62", 2), ("remapped-rows", 2),
                       ("persistence-off", 5)):
        hw.inject(fault, gpu=gpu, now=100.0)
    hw.inject("ib-down", hca=2, now=100.0)
    hw.reboot(now=500.0)
    assert {fault_label(f) for f in hw.active} == {"remapped-rows gpu2", "persistence-off gpu5", "ib-down mlx5_2"}
    assert (hw.booted, hw.kernel_log, hw.last_xid) == (500.0, [], {})
    hw.inject("xid-kernel:62", gpu=2, now=502.5)
    assert (hw.kernel_log[0]["seq"], hw.kernel_log[0]["usec"]) == (0, 2_500_000)


def test_reset_refused_while_anything_holds_the_gpu():
    hw = NodeHardware(node="gpu1")
    hw.inject("dbe", gpu=3, now=100.0)
    text, rc = gpu_reset(hw, {3: bus_id(3)}, now=110.0)  # the persistence daemon holds it
    assert rc == RC_IN_USE == 255 and hw.has("dbe", gpu=3)
    assert text.splitlines() == [
        "The following GPUs could not be reset:", "  GPU 00000000:5D:00.0: In use by another client", "",
        "1 device is currently being used by one or more other processes (e.g., Fabric Manager, CUDA application, "
        "graphics application such as an X server, or a monitoring application such as another instance of "
        "nvidia-smi). Please first kill all processes using this device and all compute applications running in "
        "the system."]
    hw.set_persistence_mode(3, False)
    assert gpu_reset(hw, {3: bus_id(3)}, now=120.0) == ("GPU 00000000:5D:00.0 was successfully reset.\n", 0)
    assert not hw.has("dbe", gpu=3)
    hw.inject("gpu-leftover-memory", gpu=3, now=130.0)
    assert gpu_reset(hw, {3: bus_id(3)}, now=140.0)[1] == RC_IN_USE


def test_of_several_gpus_those_free_are_reset_and_the_held_ones_listed():
    hw = NodeHardware(node="gpu1")
    hw.inject("xid:48", gpu=0, now=1.0)
    hw.inject("xid:48", gpu=1, now=1.0)
    hw.set_persistence_mode(0, False)
    text, rc = gpu_reset(hw, {0: bus_id(0), 1: bus_id(1), 2: bus_id(2)}, now=2.0)
    assert rc == 255 and text.startswith("GPU 00000000:18:00.0 was successfully reset.\nThe following GPUs could not")
    assert "  GPU 00000000:2A:00.0: In use by another client\n  GPU 00000000:3A:00.0: In use" in text
    assert "\n\n2 devices are currently being used" in text
    assert not hw.has("xid", gpu=0) and hw.has("xid", gpu=1)


def test_xid_kernel_parses_like_xid_and_is_listed():
    assert parse_fault("xid-kernel:62") == (FAULTS["xid-kernel"], 62)
    assert "xid-kernel:<code>" in describe_faults()
    for bad in ("xid-kernel", "xid-kernel:", "xid-kernel:0", "xid-kernel:x62"):
        with pytest.raises(LabError, match="fault|XID"):
            parse_fault(bad)


def test_xid_kernel_writes_the_drivers_line_to_the_kernel_log_only(tmp_path):
    hw = NodeHardware(node="gpu1")
    hw.inject("xid-kernel:62", gpu=3, now=hw.booted + 12.5)
    hw.inject("gpu-leftover-memory", gpu=5, now=hw.booted + 13.0)
    hw.inject("xid-kernel:13", gpu=5, now=hw.booted + 14.0)
    assert hw.last_xid == {} and hw.xid_window(3, now=hw.booted + 20.0) == {}  # DCGM never saw it
    write_kernel_log(tmp_path / "kmsg", hw)
    records = [RECORD.fullmatch(line) for line in (tmp_path / "kmsg").read_text().splitlines()]
    assert [(r["prio"], int(r["seq"]), int(r["usec"])) for r in records] == [("3", 0, 12_500_000),
                                                                             ("3", 1, 14_000_000)]
    lines = [XID_LINE.fullmatch(r["message"]) for r in records]
    assert [(x["bus"], int(x["code"]), x["pid"], x["name"]) for x in lines] == [
        ("5d", 62, "'<unknown>'", "<unknown>"), ("ab", 13, str(41000 + 97 * 5), "python3")]
    # The buses are nvidia-smi's, in the driver's lower case.
    assert [f"00000000:{x['bus'].upper()}:00.0" for x in lines] == [bus_id(3), bus_id(5)]


def test_the_regex_is_the_real_driver_lines_format():
    real = [line.split("] ", 1)[-1] for name in ("gpud_xid_kmsg_test_lines.txt", "h100_dmesg_xid13_31_119_154.txt")
            for line in (FIXTURES / "kmsg" / name).read_text().splitlines() if "pid=" in line and "Xid (PCI:" in line]
    assert len(real) >= 4 and all(XID_LINE.fullmatch(line) for line in real)
    own = (FIXTURES / "kmsg" / "kmsg_h200_node.txt").read_text().splitlines()
    assert all(RECORD.fullmatch(line) for line in own if line and not line.startswith(" "))


def test_the_kernel_log_is_next_to_the_state_file_in_both_tiers(tmp_path):
    paths = lp.LabPaths(tmp_path)
    assert kernel_log_path(paths.hardware("gpu007")) == paths.kernel_log("gpu007") == tmp_path / "nodes/gpu007/kmsg"
    from opsctl_lab.machines.settings import HW_KERNEL_LOG, HW_STATE

    assert str(kernel_log_path(HW_STATE)) == HW_KERNEL_LOG


# ---- the board's fabric and its holders (issue: boot, reset and power as an HGX H200 does them) ------------------
def test_the_fabric_trains_again_after_a_reset_and_after_a_boot_not_started_then_in_progress_then_completed():
    hw = NodeHardware(node="gpu007", fabric_training_s=8.0)
    now = 1_800_000_000.0
    assert hw.fabric_status(2, now) == FABRIC_SUCCESS  # booted long ago
    hw.reset_gpu(2, now)
    assert [hw.fabric_status(2, now + t) for t in (0, 1.9, 2, 7.9, 8)] == \
        [FABRIC_NOT_STARTED, FABRIC_NOT_STARTED, FABRIC_IN_PROGRESS, FABRIC_IN_PROGRESS, FABRIC_SUCCESS]
    assert hw.fabric_status(3, now) == FABRIC_SUCCESS  # only the GPU reset retrains
    hw.reboot(now + 100)
    assert {hw.fabric_status(g, now + 104) for g in range(8)} == {FABRIC_IN_PROGRESS}
    assert {hw.fabric_status(g, now + 108) for g in range(8)} == {FABRIC_SUCCESS}
    hw.inject("fabric-stuck", gpu=5, now=now + 108)
    assert hw.fabric_status(5, now + 10_000) == FABRIC_IN_PROGRESS


def test_nvidia_smi_prints_the_fabric_state_as_the_real_one_does():
    hw = NodeHardware(node="gpu007")
    now = 1_800_000_000.0
    hw.reset_gpu(1, now)
    row = query_gpu(hw, now + hw.fabric_training_s / 2, ["index", "fabric.state", "fabric.status"], {"noheader"}, [1])
    assert row == "1, In Progress, N/A\n"
    q = render_q(hw, now + hw.fabric_training_s, [1])
    assert re.search(r"Fabric\n\s+State\s+: Completed\n\s+Status\s+: Success\n", q)


def test_the_monitoring_services_hold_every_gpu_until_the_emulated_systemctl_stops_them():
    hw = NodeHardware(node="gpu007", monitoring={"nvidia-dcgm": True, "dcgm-exporter": True})
    hw.set_persistence_mode(2, False)
    text, rc = gpu_reset(hw, {2: bus_id(2)})
    assert rc == RC_IN_USE and "In use by another client" in text
    assert systemctl(hw, ["is-active", "dcgm-exporter", "nvidia-dcgm"]) == ("active\nactive\n", "", 0)
    assert systemctl(hw, ["stop", "dcgm-exporter.service", "nvidia-dcgm"])[2] == 0
    assert not hw.exporter_serves()
    assert systemctl(hw, ["is-active", "dcgm-exporter"]) == ("inactive\n", "", 3)
    assert gpu_reset(hw, {2: bus_id(2)})[1] == 0
    assert systemctl(hw, ["start", "nvidia-dcgm", "dcgm-exporter"])[2] == 0 and hw.exporter_serves()
    assert systemctl(hw, ["stop", "nvidia-imex"]) == (
        "", "Failed to stop nvidia-imex.service: Unit nvidia-imex.service not loaded.\n", 5)
    assert systemctl(hw, ["is-active", "nvidia-imex"]) == ("inactive\n", "", 3)
    # The NVIDIA services answer as the hardware state says: Fabric Manager is down under its fault.
    assert systemctl(hw, ["is-active", "nvidia-persistenced", "nvidia-fabricmanager"]) == ("active\nactive\n", "", 0)
    hw.inject("fabricmanager-down")
    assert systemctl(hw, ["is-active", "nvidia-fabricmanager"]) == ("inactive\n", "", 3)


def test_all_reduce_perf_fails_as_nccl_tests_does_before_the_fabric_is_trained(tmp_path, monkeypatch, capsys):
    from opsctl_lab.hwtools import all_reduce_perf

    hw = NodeHardware(node="gpu007")
    hw.reset_gpu(0, time.time())
    hw.save(tmp_path / "hw.json")
    monkeypatch.setenv("OPSCTL_HW_STATE", str(tmp_path / "hw.json"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    assert all_reduce_perf.main(["-b", "8", "-e", "8M", "-f", "2", "-g", "8"]) == 1
    assert "Test CUDA failure common.cu:941 'system not yet initialized'" in capsys.readouterr().out


def test_the_holders_are_the_emulated_services_of_the_state_and_none_without_systemd(tmp_path):
    """A lab machine asks its real systemd (tests/integration/provision/test_provision_9_ladder.py proves it); a
    node whose state emulates the services answers from the state, and no systemd means no unit holds anything."""
    hw = NodeHardware(node="gpu1", monitoring={"nvidia-dcgm": True, "dcgm-exporter": False})
    assert monitoring_holders(hw, booted=tmp_path) == ["nvidia-dcgm"]
    assert monitoring_holders(NodeHardware(node="gpu1"), booted=tmp_path / "no-systemd") == []
