"""Which HCAs of a node are compute rails, found by what they are rather than by their names.

A compute rail is an HCA whose ports are InfiniBand (class/infiniband/<hca>/ports/<n>/link_layer) and
that sits behind the same PCIe switch as a GPU, so that GPUDirect RDMA takes the short path: the
GPU-affinity that `nvidia-smi topo -m` shows as PIX or PXB. Names do not say it: on an NVIDIA DGX
H100/H200 the rails are mlx5_0,3,4,5,6,9,10,11 and the in-band and storage ConnectX-7 ports
(mlx5_1,2,7,8, InfiniBand or Ethernet) sit on root ports of their own, between them in the numbering.

The PCIe tree, and which devices share a switch, is read by opsctl/hw/pcie_tree.py, the same code
that the hardware discovery module runs on each node (playbooks/library/opsctl_hw_facts.py).
"""

import re
from pathlib import Path

from opsctl.errors import SourceUnavailable
from opsctl.hw.pcie_tree import PCI_DEVICES, PciTree, near_gpu
from opsctl.hw.pcie_tree import read_pci_tree as read_sysfs_pci_tree
from opsctl.ib.check import Port, RailChoice


def read_pci_tree(sysfs_root: Path) -> PciTree:
    """The PCI devices under <root>/bus/pci/devices and the devices behind <root>/class/infiniband;
    a root without PCI devices is a source that cannot say."""
    devices = Path(sysfs_root) / PCI_DEVICES
    if not devices.is_dir():
        raise SourceUnavailable(f"no PCI devices: {devices} does not exist")
    return read_sysfs_pci_tree(sysfs_root)


def discover_rails(ports: list[Port], tree: PciTree | None) -> RailChoice:
    """The compute rails among the HCAs of `ports`: InfiniBand and, when the PCIe tree is known, behind
    a GPU's PCIe switch. Without a tree (a capture) the link layer alone decides, and `basis` says so."""
    layers: dict[str, set[str | None]] = {}
    for port in ports:
        layers.setdefault(port.device, set()).add(port.link_layer)
    rails, not_rails = [], {}
    for hca in sorted(layers, key=natural_key):
        if layers[hca] != {"InfiniBand"}:
            shown = ", ".join(sorted(layer or "unknown" for layer in layers[hca]))
            not_rails[hca] = f"link layer {shown}"
        elif tree is not None and not near_gpu(hca, tree):
            not_rails[hca] = ("no GPU in the PCI tree" if not tree.gpus else
                              "not in the PCI tree" if hca not in tree.hcas else
                              "no GPU behind its PCIe switch")
        else:
            rails.append(hca)
    basis = "link layer and PCIe tree" if tree is not None else "link layer only (the source has no PCIe tree)"
    return RailChoice(source="discovered", devices=tuple(rails), not_rails=not_rails, basis=basis)


def natural_key(name: str) -> tuple[object, ...]:
    """mlx5_2 before mlx5_10: the digit runs compare as numbers."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))
