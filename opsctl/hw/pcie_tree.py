"""A node's PCIe tree as sysfs lays it out, and which devices share a PCIe switch with a GPU.

One copy serves both callers: `opsctl ib check` (opsctl/ib/rails.py imports it) and the hardware
discovery module that Ansible runs on each node (playbooks/library/opsctl_hw_facts.py imports it as
ansible.module_utils.opsctl_pcie_tree, which AnsiballZ ships with the module). So it imports only the
standard library, nothing of opsctl, and runs on the nodes' system python, 3.10 and later (Ubuntu 22.04).

/sys/bus/pci/devices/<bdf> links to the device's directory under /sys/devices, whose path names every
bridge above it, and class/infiniband/<hca>/device links there too:

    bus/pci/devices/0000:18:00.0 -> ../../../devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0
    0000:15:01.0  the root port (a CPU's)    0000:16:00.0  the PCIe switch's upstream port
    0000:17:00.0  a downstream port          0000:18:00.0  the device

Two devices share a switch when their paths share a bridge below the root port: the GPU-affinity that
`nvidia-smi topo -m` shows as PIX or PXB, the short path of GPUDirect RDMA. A GPU is a device of vendor
0x10de (NVIDIA) whose class is a 3D controller (0x0302xx, as SXM boards show them) or a VGA controller
(0x0300xx, a PCIe card in display mode); the NVSwitches, vendor 0x10de too, are bridges (0x0680xx).
"""

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0302", "0x0300")  # base class and subclass: 3D controller, VGA controller
BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
PCI_DEVICES = Path("bus") / "pci" / "devices"
INFINIBAND_CLASS = Path("class") / "infiniband"


@dataclass(frozen=True)
class PciTree:
    """Each PCI device of a node as the bdfs of its path, root port first, the device last."""

    paths: dict[str, tuple[str, ...]]
    gpus: tuple[str, ...]  # the bdfs of the GPUs
    hcas: dict[str, str] = field(default_factory=dict)  # HCA name -> its bdf


def pci_path(device_dir: str | os.PathLike[str]) -> tuple[str, ...]:
    """The bdfs on the resolved path of a PCI device directory, root port first."""
    return tuple(part for part in Path(device_dir).resolve().parts if BDF.fullmatch(part))


def read_pci_tree(sysfs_root: str | os.PathLike[str]) -> PciTree:
    """The PCI devices under <root>/bus/pci/devices and the devices behind <root>/class/infiniband;
    a tree without them is empty (the caller decides whether that is an error)."""
    root = Path(sysfs_root)
    devices = root / PCI_DEVICES
    paths: dict[str, tuple[str, ...]] = {}
    gpus = []
    for entry in sorted(devices.iterdir()) if devices.is_dir() else []:
        paths[entry.name] = pci_path(entry)
        if _read(entry / "vendor") == NVIDIA_VENDOR and _read(entry / "class").startswith(GPU_CLASSES):
            gpus.append(entry.name)
    hcas = {}
    for hca in sorted((root / INFINIBAND_CLASS).iterdir()) if (root / INFINIBAND_CLASS).is_dir() else []:
        path = pci_path(hca / "device") if (hca / "device").exists() else ()
        if path:
            hcas[hca.name], paths[path[-1]] = path[-1], path
    return PciTree(paths=paths, gpus=tuple(gpus), hcas=hcas)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip().lower()
    except OSError:
        return ""


def share_switch(first: tuple[str, ...], second: tuple[str, ...]) -> bool:
    """Whether two PCI paths (root port first) meet below the root port: behind one PCIe switch."""
    common = 0
    for a, b in zip(first[:-1], second[:-1], strict=False):
        if a != b:
            break
        common += 1
    return common >= 2


def near_gpu(hca: str, tree: PciTree) -> bool:
    """Whether the HCA sits behind the same PCIe switch as one of the tree's GPUs."""
    bdf = tree.hcas.get(hca)
    return bdf is not None and any(share_switch(tree.paths[bdf], tree.paths[gpu]) for gpu in tree.gpus)
