"""`opsctl-hw` (what `opsctl lab machines inject/clear` runs in a machine): it changes the state file
and the sysfs tree together, and rejects bad input with one line."""

import json
import os
import subprocess
import sys
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
