"""The lab's emulated ibnetdiscover (opsctl_lab.fabric, hwtools/ibnetdiscover) read by opsctl.topology: the two
sides of the lab contract agree. The design gives the 2 scalable units under one spine switch; recable-rail:3
and recable-leaf:3 on gpu010 are named and would drain; uplink-down is a switch's change only."""

import pytest

from opsctl.topology.drift import find_drift
from opsctl.topology.fabric import build_fabric
from opsctl.topology.ibnetdiscover import process_ibnetdiscover_output
from opsctl.topology.render import render_tree
from tests.unit.test_lab_ibnetdiscover import NODES, hardware, output

RAILS = tuple(f"mlx5_{r}" for r in range(8))


def lab_fabric(faults=None, uplinks_down=frozenset()):
    hw = hardware(faults)
    return build_fabric([process_ibnetdiscover_output(output(r, hw, uplinks_down), f"mlx5_{r}") for r in range(8)],
                        set(NODES))


@pytest.fixture(scope="module")
def design():
    return lab_fabric()


def test_the_lab_design_is_two_blocks_under_one_spine_switch(design):
    assert [line for line in render_tree(design, "lab").splitlines() if not line.startswith("#")] == [
        "SwitchName=su1-leaf Nodes=gpu[001-032]", "SwitchName=su2-leaf Nodes=gpu[033-064]",
        "SwitchName=spine1 Switches=su1-leaf,su2-leaf"]


@pytest.mark.parametrize(("fault", "kind", "switch"), [("recable-rail:3", "cross-rail", "rail4-su1-leaf"),
                                                       ("recable-leaf:3", "left-leaf-group", "rail3-su2-leaf")])
def test_a_recabled_hca_of_the_lab_is_named_and_drains(design, fault, kind, switch):
    drift = find_drift(lab_fabric({"gpu010": [fault]}), design.record(), RAILS)
    drains = [(d.kind, d.node, d.hca, d.rail, d.switch) for d in drift if d.drains]
    assert drains == [(kind, "gpu010", "mlx5_3", "rail 3", switch)]


def test_the_labs_uplink_down_is_a_warning(design):
    drift = find_drift(lab_fabric(uplinks_down=frozenset({"rail2-su1-leaf"})), design.record(), RAILS)
    assert [(d.kind, d.switch, d.drains) for d in drift] == [("fewer-uplinks", "rail2-su1-leaf", False)]
