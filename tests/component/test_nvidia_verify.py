"""The nvidia role's persistence-mode check (tasks/verify.yml) against the lab's emulated nvidia-smi.

Its script (files/gpus-without-persistence-mode.sh) runs as verify.yml runs it (sh -c), with the emulated
nvidia-smi first on PATH; then the check's two tasks, taken from verify.yml, run under ansible-playbook on
this machine for two nodes, one with every GPU in persistence mode and one with GPUs where it is Disabled
(fault persistence-off, and `nvidia-smi -pm 0`): the first passes, the second fails naming those GPUs.
"""

import json
import os
import subprocess
import sys

import pytest
import yaml

from opsctl_lab.hardware import NodeHardware
from tests.component.test_slurm_render import BIN, PLAYBOOKS, REPO, ROLES

ROLE = ROLES / "nvidia"
SCRIPT = ROLE / "files" / "gpus-without-persistence-mode.sh"


def emulated_node(tmp, name: str) -> dict:
    """A state file of 8 healthy GPUs and the environment that puts the emulated nvidia-smi first on PATH."""
    state = tmp / name / "hardware.json"
    NodeHardware(node=name).save(state)
    tools = tmp / "bin"
    tools.mkdir(exist_ok=True)
    smi = tools / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nexec {sys.executable} -m opsctl_lab.hwtools.nvidia_smi "$@"\n')
    smi.chmod(0o755)
    return {"OPSCTL_HW_STATE": str(state), "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}


def change(env: dict, action, **where) -> None:
    hw = NodeHardware.load(env["OPSCTL_HW_STATE"], "node")
    action(hw, **where)
    hw.save(env["OPSCTL_HW_STATE"])


def smi(env: dict, *args) -> subprocess.CompletedProcess:
    return subprocess.run(["nvidia-smi", *args], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=30)


def run_check(env: dict) -> subprocess.CompletedProcess:
    """The script as verify.yml runs it: /bin/sh -c with the file's text (the file lookup strips the final
    newline)."""
    return subprocess.run(["/bin/sh", "-c", SCRIPT.read_text().rstrip()], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def node(tmp_path):
    return emulated_node(tmp_path, "gpu7")


def test_nothing_is_printed_when_every_gpu_has_persistence_mode(node):
    out = run_check(node)
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")


def test_each_gpu_without_persistence_mode_is_named(node):
    change(node, NodeHardware.inject, text="persistence-off", gpu=3)
    assert smi(node, "-pm", "0", "-i", "6").returncode == 0
    out = run_check(node)
    assert out.returncode == 0 and out.stdout == "GPU 3 (Disabled)\nGPU 6 (Disabled)\n"
    assert smi(node, "-pm", "1").returncode == 0  # as the persistence daemon does at its start
    assert run_check(node).stdout == ""


def test_a_failed_query_fails_the_check(node):
    change(node, NodeHardware.inject, text="gpu-missing", gpu=2)
    assert run_check(node).returncode == 15  # nvidia-smi's own: a GPU has fallen off the bus


def persistence_tasks() -> list[dict]:
    """verify.yml's tasks of the check: the one task that runs the script, and the asserts on its result."""
    tasks = yaml.safe_load((ROLE / "tasks" / "verify.yml").read_text())
    runs = [t for t in tasks if SCRIPT.name in str(t.get("ansible.builtin.command", ""))]
    assert len(runs) == 1, "verify.yml runs the script in one task"
    register = runs[0]["register"]
    asserts = [t for t in tasks if "ansible.builtin.assert" in t and register in str(t["ansible.builtin.assert"])]
    assert asserts, f"verify.yml asserts on {register}"
    return runs + asserts


def test_the_role_check_passes_on_enabled_gpus_and_fails_naming_the_disabled_ones(tmp_path):
    """Two nodes of one run, each with its own emulated GPUs (the task environment points nvidia-smi at them)."""
    nodes = {"healthy": emulated_node(tmp_path, "healthy"), "pm-off": emulated_node(tmp_path, "pm-off")}
    change(nodes["pm-off"], NodeHardware.inject, text="persistence-off", gpu=1)
    assert smi(nodes["pm-off"], "-pm", "0", "-i", "4").returncode == 0
    role = tmp_path / "roles" / "nvidia_persistence_check"
    (role / "tasks").mkdir(parents=True)
    (role / "files").mkdir()
    (role / "files" / SCRIPT.name).write_text(SCRIPT.read_text())
    (role / "tasks" / "main.yml").write_text(yaml.safe_dump(persistence_tasks(), sort_keys=False))
    playbook = tmp_path / "check.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "all", "gather_facts": False, "environment": "{{ node_environment }}",
        "vars": {"nvidia_persistence_mode": True}, "roles": ["nvidia_persistence_check"]}]))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {
        name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
               "node_environment": env} for name, env in nodes.items()}}}))
    env = {**os.environ, "ANSIBLE_CONFIG": str(PLAYBOOKS / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_ROLES_PATH": str(tmp_path / "roles")}
    run = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(playbook),
                          "-e", json.dumps({"ansible_become": False})],
                         capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert run.returncode == 2, run.stdout + run.stderr  # a host failed
    recap = {line.split()[0]: line for line in run.stdout.split("PLAY RECAP")[1].splitlines() if ":" in line}
    assert "failed=0" in recap["healthy"] and "failed=1" in recap["pm-off"], recap
    assert "pm-off: persistence mode is not Enabled on GPU 1 (Disabled), GPU 4 (Disabled);" in run.stdout
