"""The emulated ibnetdiscover run as a program: from the simulated lab's head (its bin/ibnetdiscover wrapper, which
the lab's opsctl config names as ib.ibnetdiscover) and from a lab machine (whose `opsctl-hw` publishes its
cabling to the fabric), for a healthy fabric and each fabric fault; the real tool's errors and exit codes."""

import os
import re
import subprocess
import sys

import pytest

from opsctl_lab import fabric_lab
from opsctl_lab import paths as lp
from opsctl_lab.fabric import FabricState
from opsctl_lab.hardware import NodeHardware
from tests.conftest import FIXTURES
from tests.unit.test_lab_ibnetdiscover import shape

REAL = (FIXTURES / "infiniband" / "ibnetdiscover-topograph-ndr-rail-optimised.txt").read_text()




def where(text: str, desc: str) -> tuple[str, int] | None:
    """The switch and port a CA's cable reaches, from the switch blocks."""
    switch = None
    for line in text.splitlines():
        head = re.match(r'Switch\t\d+ "S-[0-9a-f]+"\t\t# "MF0;([^:]+):', line)
        switch = head.group(1) if head else switch if line else None
        port = re.match(rf'\[(\d+)\]\t"H-[0-9a-f]+"\[1\]\([0-9a-f]+\) \t\t# "{desc}"', line)
        if port and switch:
            return switch, int(port.group(1))
    return None


def uplinks(text: str, leaf: str) -> int:
    block = text.split(f'# "MF0;{leaf}:MQM9700/U1" enhanced')[1].split("\n\n")[0]
    return len(re.findall(r'"S-[0-9a-f]+"\[\d+\]\t\t# "MF0;rail\d-spine', block))


@pytest.fixture
def lab(tmp_path):
    paths = lp.LabPaths(tmp_path)
    fabric_lab.write_fabric(paths, 64)
    return paths, fabric_lab.write_ibnetdiscover(paths)


def run(command, *args, env=None):
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=60, env=env)


def inject(paths, node, fault):
    hw = NodeHardware.load(paths.hardware(node), node)
    hw.inject(fault)
    hw.save(paths.hardware(node))


def test_the_heads_tool_shows_each_rail_as_designed_in_the_real_format(lab):
    paths, tool = lab
    for rail in (0, 3, 7):
        out = run([str(tool)], "-C", f"mlx5_{rail}", "-P", "1")
        assert out.returncode == 0, out.stderr
        assert {shape(line) for line in out.stdout.split("\n")} <= {shape(line) for line in REAL.split("\n")}
        assert where(out.stdout, f"gpu010 mlx5_{rail}") == (f"rail{rail}-su1-leaf", 10)
        assert where(out.stdout, f"gpu033 mlx5_{rail}") == (f"rail{rail}-su2-leaf", 1)
        assert where(out.stdout, f"head mlx5_{rail}") == (f"rail{rail}-spine1", 64)
        assert not re.search(rf'"gpu\d+ mlx5_{(rail + 1) % 8}"', out.stdout)


def test_each_fault_shows_in_the_heads_output(lab):
    paths, tool = lab
    inject(paths, "gpu010", "recable-rail:3")
    inject(paths, "gpu020", "recable-leaf:5")
    state = FabricState.load(paths.fabric)
    state.inject("uplink-down:rail6-su2-leaf")
    state.save(paths.fabric)
    rail = {r: run([str(tool)], "-C", f"mlx5_{r}", "-P", "1").stdout for r in (3, 4, 5, 6)}
    assert where(rail[3], "gpu010 mlx5_3") is None
    assert where(rail[4], "gpu010 mlx5_3") == ("rail4-su1-leaf", 64)
    assert where(rail[5], "gpu020 mlx5_5") == ("rail5-su2-leaf", 64)
    assert [uplinks(rail[6], leaf) for leaf in ("rail6-su1-leaf", "rail6-su2-leaf")] == [32, 31]
    out = run([str(tool)], "-C", "mlx5_6", "-P", "1", str(paths.root / "rail6.txt"))
    assert out.returncode == 0 and out.stdout == "" and (paths.root / "rail6.txt").read_text().startswith("#\n")


def test_a_lab_machines_cabling_reaches_every_other_machine(tmp_path):
    """As in the machines tier: each machine's opsctl-hw publishes its state to the fabric's directory, and
    ibnetdiscover in another machine reads it."""
    root = tmp_path / "opsctl-hw"
    (root / "fabric").mkdir(parents=True)
    FabricState(nodes=["gpu1", "gpu2", "gpu3"], state_pattern=str(root / "fabric/nodes/{node}.json")).save(
        root / "fabric/fabric.json")
    env = dict(os.environ, OPSCTL_HW_STATE=str(root / "hardware.json"), OPSCTL_HW_SYSFS_ROOT=str(root / "sys"),
               OPSCTL_HW_FABRIC=str(root / "fabric/fabric.json"))
    NodeHardware(node="gpu2").save(root / "hardware.json")
    admin = run([sys.executable, "-m", "opsctl_lab.hwtools.admin"], "inject", "recable-leaf:2", env=env)
    assert admin.returncode == 0, admin.stderr
    assert (root / "fabric/nodes/gpu2.json").exists()
    ibnd = [sys.executable, "-m", "opsctl_lab.hwtools.ibnetdiscover"]
    out = run(ibnd, "-C", "mlx5_2", "-P", "1", env={**env, "OPSCTL_HW_NODE": "gpu1"})
    assert out.returncode == 0, out.stderr
    assert where(out.stdout, "gpu2 mlx5_2") == ("rail2-su2-leaf", 1)
    assert where(out.stdout, "gpu1 mlx5_2") == ("rail2-su1-leaf", 1)
    assert re.search(r'\nCa\t1 "H-[0-9a-f]+"\t\t# "gpu1 mlx5_2"\n\[1\]\([0-9a-f]+\) \t"S-[0-9a-f]+"\[1\]\t\t# lid \d+ '
                     r'lmc 0 "MF0;rail2-su1-leaf:MQM9700/U1" lid \d+ 4xNDR\n$', out.stdout)  # the local CA last
    admin = run([sys.executable, "-m", "opsctl_lab.hwtools.admin"], "clear", env=env)
    out = run(ibnd, "-C", "mlx5_2", "-P", "1", env={**env, "OPSCTL_HW_NODE": "gpu1"})
    assert where(out.stdout, "gpu2 mlx5_2") == ("rail2-su1-leaf", 2)


def test_a_down_port_finds_only_itself(lab):
    paths, _ = lab
    hw = NodeHardware(node="gpu005")
    hw.inject("ib-down", hca=1)
    hw.save(paths.hardware("gpu005"))
    env = dict(os.environ, OPSCTL_HW_FABRIC=str(paths.fabric), OPSCTL_HW_NODE="gpu005",
               PYTHONPATH=os.pathsep.join(sys.path))
    out = run([sys.executable, "-m", "opsctl_lab.hwtools.ibnetdiscover"], "-C", "mlx5_1", "-P", "1", env=env)
    assert out.returncode == 0
    guid = re.search(r"# Initiated from node ([0-9a-f]{16}) ", out.stdout).group(1)
    # as the real lone-CA capture: the header, the CA's block, no port line
    assert out.stdout.split("\n")[4:] == ["", "vendid=0x2c9", "devid=0x1021", f"sysimgguid=0x{int(guid, 16):x}",
                                          f"caguid=0x{int(guid, 16):x}", f'Ca\t1 "H-{guid}"\t\t# "gpu005 mlx5_1"', ""]


def test_the_real_tools_errors(lab):
    _, tool = lab
    out = run([str(tool)], "-x")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("ibnetdiscover: invalid option -- 'x'\n\nUsage: ibnetdiscover [options]")
    out = run([str(tool)], "--bogus")
    assert out.returncode == 2 and out.stderr.startswith("ibnetdiscover: unrecognized option '--bogus'\n")
    out = run([str(tool)], "-C", "mlx5_9", "-P", "1")
    assert out.returncode == 255
    assert out.stdout == "ibnetdiscover: iberror: failed: discover failed\n\n"
    assert re.match(r"ibwarn: \[\d+\] mad_rpc_open_port2: can't open UMAD port \(mlx5_9:1\)\n", out.stderr)
    out = run([str(tool)], "-p")
    assert out.returncode == 2 and "not emulated" in out.stderr
