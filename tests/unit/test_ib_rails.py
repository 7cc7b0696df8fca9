"""Compute rails by what they are (opsctl.ib.rails): InfiniBand and behind a GPU's PCIe switch, on a
sysfs tree built from the DGX H100/H200 layout (tests/fixtures/ib, sources in its README.md), on the
lab's HGX tree, and on captures that have no PCIe tree."""

import pytest

from opsctl.hw.pcie_tree import share_switch
from opsctl.ib.collect import capture_snapshot, live_snapshot
from opsctl.ib.rails import discover_rails, natural_key, read_pci_tree
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.ib_sysfs import write_tree
from tests.conftest import FIXTURES
from tests.pcie_tree import build_sysfs

DGX_TREE = (FIXTURES / "ib" / "dgx-h100-pcie-tree.txt").read_text()
DGX_RAILS = ("mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11")
IBSTAT_DGX = FIXTURES / "infiniband" / "gpud_ibstat.47.0.h100.some.down.0.txt"


def discovered(root):
    return discover_rails(live_snapshot(root).ports, read_pci_tree(root))


def test_dgx_naming_finds_the_eight_rails_between_the_storage_ports(tmp_path):
    rails = discovered(build_sysfs(DGX_TREE, tmp_path))
    assert rails.devices == DGX_RAILS
    assert rails.not_rails == {"mlx5_1": "no GPU behind its PCIe switch", "mlx5_2": "link layer Ethernet",
                               "mlx5_7": "no GPU behind its PCIe switch", "mlx5_8": "link layer Ethernet"}
    assert rails.source == "discovered" and rails.basis == "link layer and PCIe tree"


def test_the_dgx_gpus_are_the_3d_controllers_not_the_nvswitches(tmp_path):
    tree = read_pci_tree(build_sysfs(DGX_TREE, tmp_path))
    assert tree.gpus == ("0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0",
                         "0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0")
    assert tree.hcas["mlx5_0"] == "0000:18:00.0" and tree.paths["0000:18:00.0"][:2] == ("0000:15:01.0",
                                                                                        "0000:16:00.0")


def test_an_infiniband_hca_beside_an_nvswitch_is_no_rail(tmp_path):
    """An NVIDIA device that is a bridge (an NVSwitch) gives no GPU-affinity; a 3D controller does."""
    switch = "pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0 {} 0x10de"
    hca = "pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0 0x020700 0x15b3 mlx5_0 InfiniBand"
    beside_bridge = discovered(build_sysfs(f"{hca}\n{switch.format('0x068000')}", tmp_path / "bridge"))
    assert beside_bridge.devices == () and beside_bridge.not_rails == {"mlx5_0": "no GPU in the PCI tree"}
    assert discovered(build_sysfs(f"{hca}\n{switch.format('0x030200')}", tmp_path / "gpu")).devices == ("mlx5_0",)


@pytest.mark.parametrize("gpu_path,near", [
    ("pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0", True),  # the same switch
    ("pci0000:15/0000:15:02.0/0000:1c:00.0", False),  # another root port of the same host bridge
    ("pci0000:15/0000:15:01.0/0000:1d:00.0", False),  # the same root port, no switch: not a switch's
    ("pci0000:97/0000:97:01.0/0000:98:00.0/0000:99:00.0/0000:9a:00.0", False),  # the other socket
])
def test_sharing_a_switch_means_a_common_bridge_below_the_root_port(gpu_path, near):
    hca = ("0000:15:01.0", "0000:16:00.0", "0000:17:00.0", "0000:18:00.0")
    gpu = tuple(part for part in gpu_path.split("/")[1:])
    assert share_switch(hca, gpu) is near


def test_the_lab_hgx_node_has_its_eight_rails_and_not_the_storage_port(tmp_path):
    write_tree(tmp_path, NodeHardware(node="gpu001"), now=0.0)
    rails = discovered(tmp_path)
    assert rails.devices == tuple(f"mlx5_{i}" for i in range(8))
    assert rails.not_rails == {"mlx5_bond_0": "link layer Ethernet"}


def test_a_capture_without_a_pcie_tree_is_judged_by_its_link_layer():
    rails = discover_rails(capture_snapshot(IBSTAT_DGX).ports, None)
    assert rails.devices == DGX_RAILS
    assert set(rails.not_rails) == {"mlx5_1", "mlx5_2", "mlx5_7", "mlx5_8"}
    assert rails.basis.startswith("link layer only")


def test_names_sort_by_their_numbers():
    assert sorted(["mlx5_10", "mlx5_2", "mlx5_bond_0", "mlx5_1"], key=natural_key) == [
        "mlx5_1", "mlx5_2", "mlx5_10", "mlx5_bond_0"]
