"""slurmd's ExecStartPre, the slurm_compute role's opsctl-gpus-ready, run as a real process against the lab's emulated
nvidia-smi and systemctl (the real tools' formats, lab/opsctl_lab/hwtools): it waits while the fabric trains, says
how long it waited, names what is not ready at its bound, and always exits 0 (slurmd starts, and its health check
drains the node with a reason)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opsctl_lab.hardware import NodeHardware

SCRIPT = Path(__file__).resolve().parents[2] / "playbooks/roles/slurm_compute/files/opsctl-gpus-ready"
UNITS = ("nvidia-persistenced", "nvidia-fabricmanager")


@pytest.fixture
def node(tmp_path):
    """A node's state file and an environment whose PATH has the emulated nvidia-smi and systemctl."""
    state = tmp_path / "hardware.json"
    tools = tmp_path / "bin"
    tools.mkdir()
    for name, module in (("nvidia-smi", "nvidia_smi"), ("systemctl", "systemctl")):
        (tools / name).write_text(f"#!/bin/sh\nexec {sys.executable} -m opsctl_lab.hwtools.{module} \"$@\"\n")
        (tools / name).chmod(0o755)
    env = dict(os.environ, OPSCTL_HW_STATE=str(state), OPSCTL_HW_SYSFS_ROOT=str(tmp_path / "sys"),
               PATH=f"{tools}:{os.environ['PATH']}")
    return state, env


def booted(state, training_s, faults=()):
    hw = NodeHardware(node="gpu7", fabric_training_s=training_s)
    hw.reboot(time.time())
    for fault, gpu in faults:
        hw.inject(fault, gpu=gpu)
    hw.save(state)


def gpus_ready(env, timeout_s):
    return subprocess.run([str(SCRIPT), str(timeout_s), *UNITS], env=env, capture_output=True, text=True,
                          timeout=timeout_s + 60)


def test_it_waits_for_the_fabric_to_train_and_says_how_long(node):
    state, env = node
    booted(state, training_s=6)
    done = gpus_ready(env, 60)
    waited = int(done.stdout.split("after ")[1].rstrip("s\n"))
    assert done.returncode == 0 and done.stdout.startswith("opsctl-gpus-ready: GPUs ready after ")
    assert 3 <= waited <= 20, done.stdout


def test_at_its_bound_it_names_what_is_not_ready_and_still_exits_0(node):
    state, env = node
    booted(state, training_s=1, faults=[("fabric-stuck", 2), ("persistence-off", 5)])
    done = gpus_ready(env, 4)
    assert done.returncode == 0
    assert "GPUs not ready after" in done.stdout
    assert "fabric In Progress on GPU 2" in done.stdout and "persistence mode Disabled on GPU 5" in done.stdout


def test_fabric_manager_down_is_named(node):
    state, env = node
    booted(state, training_s=1, faults=[("fabricmanager-down", None)])
    done = gpus_ready(env, 3)
    assert done.returncode == 0 and "nvidia-fabricmanager inactive" in done.stdout


def test_a_node_without_nvidia_smi_has_nothing_to_wait_for(tmp_path):
    env = dict(os.environ, PATH=f"{tmp_path}:/usr/bin:/bin")
    done = subprocess.run(["/bin/bash", str(SCRIPT), "300"], env=env, capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout) == (0, "opsctl-gpus-ready: no nvidia-smi: no GPUs to wait for\n")


def test_a_gpu_off_the_bus_is_not_waited_for(node):
    """nvidia-smi exits 15 and lists the GPUs that answer: no wait brings the lost one back, so the others are waited
    for and slurmd starts (its health check then drains the node for the lost GPU)."""
    state, env = node
    booted(state, training_s=3, faults=[("gpu-missing", 3)])
    done = gpus_ready(env, 60)
    assert done.returncode == 0 and done.stdout.startswith("opsctl-gpus-ready: GPUs ready after "), done.stdout
