"""`nvidia-smi -r` of the emulated node run as a real process: refused while the persistence daemon or a process
holds the GPU (rc 255), a reset after `-pm 0` that ends the GPU's volatile faults (rc 0), a lost GPU (rc 15);
and `opsctl-hw inject xid-kernel:N` writing the driver's XID line to the node's kernel log."""

import os
import subprocess
import sys

import pytest

from opsctl.gpu.kmsg import parse_records, parse_xid
from opsctl_lab.hardware import NodeHardware

IN_USE = ("The following GPUs could not be reset:\n"
          "  GPU 00000000:5D:00.0: In use by another client\n\n"
          "1 device is currently being used by one or more other processes (e.g., Fabric Manager, CUDA application, "
          "graphics application such as an X server, or a monitoring application such as another instance of "
          "nvidia-smi). Please first kill all processes using this device and all compute applications running in "
          "the system.\n")


@pytest.fixture
def node(tmp_path):
    state = tmp_path / "hardware.json"
    hw = NodeHardware(node="gpu7")
    for fault in ("dbe", "xid:48", "row-remap-pending", "remapped-rows"):
        hw.inject(fault, gpu=3)
    hw.save(state)
    return state, dict(os.environ, OPSCTL_HW_STATE=str(state), OPSCTL_HW_SYSFS_ROOT=str(tmp_path / "sys"))


def run(env, module, *args):
    return subprocess.run([sys.executable, "-m", f"opsctl_lab.hwtools.{module}", *args], env=env,
                          capture_output=True, text=True, timeout=30)


def faults(state, gpu):
    return sorted(f.fault for f in NodeHardware.load(state, "gpu7").active if f.gpu == gpu)


def test_reset_is_refused_while_persistence_mode_holds_the_gpu_then_done_after_pm_0(node):
    state, env = node
    refused = run(env, "nvidia_smi", "-r", "-i", "3")
    assert (refused.returncode, refused.stdout) == (255, IN_USE)
    assert faults(state, 3) == ["dbe", "remapped-rows", "row-remap-pending", "xid"]
    assert run(env, "nvidia_smi", "-pm", "0", "-i", "3").returncode == 0
    done = run(env, "nvidia_smi", "--gpu-reset", "-i", "3")
    assert (done.returncode, done.stdout) == (0, "GPU 00000000:5D:00.0 was successfully reset.\n")
    assert faults(state, 3) == ["persistence-off", "remapped-rows"]
    # The applied remap stays counted and nvidia-smi no longer shows it pending.
    query = run(env, "nvidia_smi", "--query-gpu=remapped_rows.uncorrectable,remapped_rows.pending",
                "--format=csv,noheader", "-i", "3")
    assert query.stdout == "10, No\n"


def test_a_leftover_process_blocks_the_reset(node):
    state, env = node
    hw = NodeHardware.load(state, "gpu7")
    hw.inject("gpu-leftover-memory", gpu=3)
    hw.set_persistence_mode(3, False)
    hw.save(state)
    out = run(env, "nvidia_smi", "-r", "-i", "3")
    assert (out.returncode, out.stdout) == (255, IN_USE) and "dbe" in faults(state, 3)


def test_a_lost_gpu_cannot_be_reset(node):
    state, env = node
    hw = NodeHardware.load(state, "gpu7")
    hw.inject("gpu-missing", gpu=3)
    hw.save(state)
    out = run(env, "nvidia_smi", "-r", "-i", "3")
    assert out.returncode == 15 and out.stdout.startswith("Unable to determine the device handle for GPU")


def test_xid_kernel_writes_the_drivers_line_next_to_the_state(node):
    state, env = node
    out = run(env, "admin", "inject", "xid-kernel:62", "--gpu", "3")
    assert out.returncode == 0, out.stderr
    run(env, "admin", "inject", "xid-kernel:62", "--gpu", "3")
    records = parse_records((state.parent / "kmsg").read_text())
    assert [r.seq for r in records] == [0, 1] and records[0].usec < records[1].usec
    xid = parse_xid(records[0].message)
    assert (xid.pci, xid.code, xid.pid, xid.process) == ("00000000:5D:00.0", 62, None, None)
    assert NodeHardware.load(state, "gpu7").last_xid == {"3": 48}  # DCGM saw XID 48, never 62
