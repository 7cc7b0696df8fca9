"""The lab's `sm-down` fault: the subnet manager is gone, so every InfiniBand port of the node trained
(phys LinkUp) but sits in INIT with no LID, in the sysfs tree and so in ibstat and ibv_devinfo, and
`opsctl ib check` fails each compute HCA on port-state while the Ethernet storage port is untouched."""

import pytest

from opsctl.ib.check import h200_ndr, judge
from opsctl.ib.collect import live_snapshot
from opsctl_lab.errors import LabError
from opsctl_lab.hardware import COMPUTE_HCAS, FAULTS, NodeHardware
from opsctl_lab.hwtools.ibstat import render_ca
from opsctl_lab.hwtools.ibv_devinfo import render_dev
from opsctl_lab.hwtools.sysfs_read import devices
from opsctl_lab.ib_sysfs import write_tree


def _read(root, rel):
    return (root / "class" / "infiniband" / rel).read_text().strip()


def test_sm_down_is_a_node_fault_taking_no_device():
    assert FAULTS["sm-down"].target == "node"
    hw = NodeHardware(node="gpu001")
    fault = hw.inject("sm-down", now=0.0)
    assert (fault.gpu, fault.hca) == (None, None)
    with pytest.raises(LabError):
        NodeHardware(node="gpu001").inject("sm-down:1")


def test_every_compute_port_is_init_with_no_lid_and_the_storage_port_is_untouched(tmp_path):
    hw = NodeHardware(node="gpu001")
    hw.inject("sm-down", now=0.0)
    write_tree(tmp_path, hw, now=0.0)
    for hca in COMPUTE_HCAS:
        assert _read(tmp_path, f"{hca}/ports/1/state") == "2: INIT"
        assert _read(tmp_path, f"{hca}/ports/1/phys_state") == "5: LinkUp"
        assert (_read(tmp_path, f"{hca}/ports/1/lid"), _read(tmp_path, f"{hca}/ports/1/sm_lid")) == ("0x0", "0x0")
    assert _read(tmp_path, "mlx5_bond_0/ports/1/state") == "4: ACTIVE"


def test_ibstat_and_ibv_devinfo_say_init(tmp_path):
    hw = NodeHardware(node="gpu001")
    hw.inject("sm-down", now=0.0)
    write_tree(tmp_path, hw, now=0.0)
    devs = {d["name"]: d for d in devices(tmp_path)}
    assert "State: Initializing" in render_ca(devs["mlx5_3"]) and "Physical state: LinkUp" in render_ca(devs["mlx5_3"])
    assert "PORT_INIT (2)" in render_dev(devs["mlx5_3"])
    assert "PORT_ACTIVE (4)" in render_dev(devs["mlx5_bond_0"])


def test_opsctl_ib_check_fails_every_compute_hca_on_port_state_and_clear_restores_it(tmp_path):
    hw = NodeHardware(node="gpu001")
    hw.inject("sm-down", now=0.0)
    write_tree(tmp_path, hw, now=0.0)
    report = judge(live_snapshot(tmp_path), h200_ndr())
    assert not report.passed
    assert {(f.check, f.device) for f in report.findings} == {("port-state", h) for h in COMPUTE_HCAS}
    assert {p.state for p in report.ports} == {"INIT"}
    hw.clear(now=1.0)
    write_tree(tmp_path, hw, now=1.0)
    assert {p.state for p in judge(live_snapshot(tmp_path), h200_ndr()).ports} == {"ACTIVE"}
