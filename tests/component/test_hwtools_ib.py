"""The emulated ibstat and ibv_devinfo, run as real processes over a sysfs tree written from the
hardware state, checked against real ConnectX-7 output and against the sysfs tree itself."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from opsctl.ib.ibstat import parse_ibstat
from opsctl.ib.ibv_devinfo import parse_ibv_devinfo
from opsctl_lab.hardware import COMPUTE_HCAS, HCA_FW_MISMATCH, NodeHardware
from tests.conftest import FIXTURES

IB = FIXTURES / "infiniband"
# Real `ibstat` of one ConnectX-7 (MT4129) port: the first CA of gpud's all-active capture.
REAL_IBSTAT = "CA '" + (IB / "gpud_ibstat.47.0.h100.all.active.0.txt").read_text().split("CA '")[1]
# Real `ibv_devinfo` of a ConnectX-7 (vendor_part_id 4129, board MT_0000000838).
REAL_DEVINFO = (IB / "ibv_devinfo_cx7_roce_mlx5_0.txt").read_text()


@pytest.fixture
def node(tmp_path):
    state = tmp_path / "hardware.json"
    NodeHardware(node="gpu3").save(state)
    env = dict(os.environ, OPSCTL_HW_STATE=str(state), OPSCTL_HW_SYSFS_ROOT=str(tmp_path / "sys"))
    return state, env, tmp_path / "sys"


def tool(env, name, *args):
    return subprocess.run([sys.executable, "-m", f"opsctl_lab.hwtools.{name}", *args], env=env,
                          capture_output=True, text=True, timeout=30)


def inject(state, fault, **where):
    hw = NodeHardware.load(state, "gpu3")
    hw.inject(fault, **where)
    hw.save(state)


def _keys(text: str) -> list[str]:
    """Each line's indentation and key: the layout, whatever the values."""
    return [line.split(":")[0] for line in text.splitlines()]


def test_ibstat_lists_8_ndr_rails_and_the_storage_port(node):
    _, env, _ = node
    out = tool(env, "ibstat")
    assert out.returncode == 0, out.stderr
    cas = parse_ibstat(out.stdout)
    assert [ca.name for ca in cas] == COMPUTE_HCAS + ["mlx5_bond_0"]
    for ca in cas[:8]:
        assert (ca.ca_type, ca.firmware) == ("MT4129", "28.41.1000")
        assert [(p.state, p.physical_state, p.rate, p.link_layer) for p in ca.ports] == [
            ("Active", "LinkUp", 400, "InfiniBand")]
    assert (cas[8].ca_type, cas[8].ports[0].link_layer) == ("MT41692", "Ethernet")


def test_ibstat_layout_is_the_real_one(node):
    _, env, _ = node
    bond = tool(env, "ibstat", "mlx5_bond_0").stdout
    assert _keys(bond) == _keys(REAL_IBSTAT.replace("mlx5_0", "mlx5_bond_0"))
    # A RoCE port's GUID derives from the node GUID as on the real card (0xa088c203.. -> 0xa288c2fffe..).
    real = parse_ibstat(REAL_IBSTAT)[0]
    assert real.ports[0].port_guid == "0xa288c2fffee3142a"
    ca = parse_ibstat(bond)[0]
    assert ca.ports[0].port_guid == "0x" + f"{int(ca.node_guid[2:4], 16) | 2:02x}" + ca.node_guid[4:8] + \
        "fffe" + ca.node_guid[-6:]


def test_ibv_devinfo_layout_is_the_real_one_and_agrees_with_ibstat(node):
    _, env, _ = node
    out = tool(env, "ibv_devinfo")
    assert out.returncode == 0
    first = out.stdout.split("\n\n")[0] + "\n\n"
    assert _keys(first) == _keys(REAL_DEVINFO)
    devs = parse_ibv_devinfo(out.stdout)
    cas = parse_ibstat(tool(env, "ibstat").stdout)
    assert len(devs) == 9
    for dev, ca in zip(devs, cas, strict=True):
        assert dev.hca_id == ca.name and dev.fw_ver == ca.firmware
        assert "0x" + dev.node_guid.replace(":", "") == ca.node_guid
        assert dev.ports[1].link_layer == ca.ports[0].link_layer
    assert parse_ibv_devinfo(REAL_DEVINFO)[0].ports[1].state == "PORT_ACTIVE"


def test_tools_read_the_sysfs_tree(node):
    _, env, sysfs = node
    tool(env, "ibstat")
    port = Path(sysfs, "class/infiniband/mlx5_5/ports/1")
    assert (port / "state").read_text() == "4: ACTIVE\n"
    assert (port / "rate").read_text() == "400 Gb/sec (4X NDR)\n"


@pytest.mark.parametrize("fault,hca,check", [
    ("ib-down", 3, lambda p, ca: (p.state, p.physical_state) == ("Down", "Polling")),
    ("ib-degraded", 6, lambda p, ca: p.rate == 200),
    ("ib-fw-mismatch", 1, lambda p, ca: ca.firmware == HCA_FW_MISMATCH),
])
def test_port_faults_change_that_port_only(node, fault, hca, check):
    state, env, _ = node
    before = parse_ibstat(tool(env, "ibstat").stdout)
    inject(state, fault, hca=hca)
    after = parse_ibstat(tool(env, "ibstat").stdout)
    for i, (old, new) in enumerate(zip(before, after, strict=True)):
        if i == hca:
            assert check(new.ports[0], new) and not check(old.ports[0], old)
        else:
            assert old == new


def test_ib_down_shows_in_ibv_devinfo(node):
    state, env, _ = node
    inject(state, "ib-down", hca=2)
    devs = parse_ibv_devinfo(tool(env, "ibv_devinfo", "-d", "mlx5_2").stdout)
    assert devs[0].ports[1].state == "PORT_DOWN" and devs[0].ports[1].state_code == 1


def test_unknown_device(node):
    _, env, _ = node
    assert tool(env, "ibstat", "mlx5_9").returncode != 0
    assert tool(env, "ibv_devinfo", "-d", "mlx5_9").returncode != 0
