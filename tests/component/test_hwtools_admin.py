"""`opsctl-hw` (what `opsctl lab machines inject/clear` runs in a machine): it changes the state file
and the sysfs tree together, and rejects bad input with one line."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opsctl_lab.hardware import NodeHardware


@pytest.fixture
def env(tmp_path):
    NodeHardware(node="gpu1").save(tmp_path / "hw.json")
    return dict(os.environ, OPSCTL_HW_STATE=str(tmp_path / "hw.json"), OPSCTL_HW_SYSFS_ROOT=str(tmp_path / "sys"))


def admin(env, *args):
    return subprocess.run([sys.executable, "-m", "opsctl_lab.hwtools.admin", *args], env=env,
                          capture_output=True, text=True, timeout=30)


def test_inject_then_clear(env):
    out = admin(env, "inject", "ib-down", "--hca", "2")
    assert out.returncode == 0 and out.stdout == "gpu1: injected ib-down mlx5_2\n"
    state = json.loads(Path(env["OPSCTL_HW_STATE"]).read_text())
    assert [(f["fault"], f["hca"]) for f in state["active"]] == [("ib-down", "mlx5_2")]
    port = Path(env["OPSCTL_HW_SYSFS_ROOT"], "class/infiniband/mlx5_2/ports/1")
    assert (port / "state").read_text() == "1: DOWN\n"
    assert admin(env, "clear").stdout == "gpu1: cleared 1 fault(s)\n"
    assert (port / "state").read_text() == "4: ACTIVE\n"
    assert json.loads(Path(env["OPSCTL_HW_STATE"]).read_text())["active"] == []


@pytest.mark.parametrize("args", [["inject", "bogus"], ["inject", "dbe", "--gpu", "9"], ["inject", "ib-down",
                                                                                        "--hca", "mlx5_12"]])
def test_bad_input_is_one_line_and_nonzero(env, args):
    out = admin(env, *args)
    assert out.returncode != 0 and len(out.stderr.strip().splitlines()) == 1


def test_sysfs_link_host_keeps_the_emulated_infiniband(env, tmp_path):
    host = tmp_path / "hostsys"
    for d in ("class/net/eth0", "class/infiniband/real0", "devices/system", "kernel"):
        (host / d).mkdir(parents=True)
    from opsctl_lab.hwtools.admin import link_host_sysfs

    assert admin(env, "sysfs").returncode == 0
    root = Path(env["OPSCTL_HW_SYSFS_ROOT"])
    link_host_sysfs(root, host)
    assert (root / "class/net").resolve() == host / "class/net" and (root / "kernel").is_symlink()
    assert not (root / "class/infiniband").is_symlink()
    assert sorted(p.name for p in (root / "class/infiniband").iterdir())[-1] == "mlx5_bond_0"


def fabric_states(env) -> set[str]:
    """Every GPU's fabric state, as the emulated nvidia-smi prints it."""
    out = subprocess.run([sys.executable, "-m", "opsctl_lab.hwtools.nvidia_smi", "--query-gpu=fabric.state",
                          "--format=csv,noheader"], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.splitlines())


def boot(env, tmp_path):
    """`opsctl-hw boot` in an empty machine root: no driver installed, no module to load."""
    (tmp_path / "root").mkdir(exist_ok=True)
    out = admin(dict(env, OPSCTL_HW_MACHINE_ROOT=str(tmp_path / "root")), "boot")
    assert out.returncode == 0, out.stderr
    return out


def test_a_boot_leaves_the_fabric_not_started_until_fabric_manager_starts(env, tmp_path):
    boot(env, tmp_path)
    assert fabric_states(env) == {"Not Started"}
    assert admin(env, "fabric-training", "1").stdout == "gpu1: the fabric trains for 1 s\n"
    time.sleep(1.2)
    assert fabric_states(env) == {"Not Started"}  # nothing trains it before Fabric Manager starts
    started = admin(env, "fabricmanager")
    assert started.returncode == 0 and started.stdout == "gpu1: Fabric Manager started; the fabric trains for 1 s\n"
    deadline = time.monotonic() + 5
    while fabric_states(env) != {"Completed"}:
        assert time.monotonic() < deadline, fabric_states(env)
        time.sleep(0.1)


def test_a_bad_training_time_is_refused(env):
    out = admin(env, "fabric-training", "soon")
    assert out.returncode != 0 and "number of seconds" in out.stderr


def test_a_boot_after_a_reboot_ends_an_xid_and_a_boot_without_one_keeps_it(env, tmp_path):
    state = Path(env["OPSCTL_HW_STATE"])
    assert admin(env, "inject", "xid:79", "--gpu", "2").returncode == 0
    assert admin(env, "inject", "remapped-rows", "--gpu", "4").returncode == 0
    boot(env, tmp_path)  # the lab stopped and started the machine: no reboot
    assert [f["fault"] for f in json.loads(state.read_text())["active"]] == ["xid", "remapped-rows"]
    marker = state.parent / "rebooted"  # what the machine's supervisor leaves after a reboot
    marker.write_text("1800000000.000\n")
    out = boot(env, tmp_path)
    assert "gpu1: rebooted; faults ended: xid:79 gpu2\n" in out.stdout
    assert [f["fault"] for f in json.loads(state.read_text())["active"]] == ["remapped-rows"]
    assert not marker.exists()
