"""Which HCAs of a node are compute rails, found by what they are rather than by their names.

A compute rail is an HCA whose ports are InfiniBand (class/infiniband/<hca>/ports/<n>/link_layer) and
that sits behind the same PCIe switch as a GPU, so that GPUDirect RDMA takes the short path: the
GPU-affinity that `nvidia-smi topo -m` shows as PIX or PXB. Names do not say it: on an NVIDIA DGX
H100/H200 the rails are mlx5_0,3,4,5,6,9,10,11 and the in-band and storage ConnectX-7 ports
(mlx5_1,2,7,8, InfiniBand or Ethernet) sit on root ports of their own, between them in the numbering.

The PCIe tree is read as sysfs lays it out: /sys/bus/pci/devices/<bdf> links to the device's directory
under /sys/devices, whose path names every bridge above it, and class/infiniband/<hca>/device links
there too:

    bus/pci/devices/0000:18:00.0 -> ../../../devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0
    0000:15:01.0  the root port (a CPU's)    0000:16:00.0  the PCIe switch's upstream port
    0000:17:00.0  a downstream port          0000:18:00.0  the device

Two devices share a switch when their paths share a bridge below the root port. A GPU is a device of
vendor 0x10de (NVIDIA) whose class is a 3D controller (0x0302xx, as SXM boards show them) or a VGA
controller (0x0300xx, a PCIe card in display mode); the NVSwitches, vendor 0x10de too, are bridges.
"""

import re
from dataclasses import dataclass, field
from pathlib import Path

from opsctl.errors import SourceUnavailable
from opsctl.ib.check import Port, RailChoice
from opsctl.ib.sysfs import CLASS_DIR

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0302", "0x0300")  # base class and subclass: 3D controller, VGA controller
_BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
PCI_DEVICES = Path("bus") / "pci" / "devices"


@dataclass(frozen=True)
class PciTree:
    """Each PCI device of a node as the bdfs of its path, root port first, the device last."""

    paths: dict[str, tuple[str, ...]]
    gpus: tuple[str, ...]  # the bdfs of the GPUs
    hcas: dict[str, str] = field(default_factory=dict)  # HCA name -> its bdf


def pci_path(device_dir: Path) -> tuple[str, ...]:
    """The bdfs on the resolved path of a PCI device directory, root port first."""
    return tuple(part for part in device_dir.resolve().parts if _BDF.fullmatch(part))


def read_pci_tree(sysfs_root: Path) -> PciTree:
    """The PCI devices under <root>/bus/pci/devices and the devices behind <root>/class/infiniband."""
    root = Path(sysfs_root)
    devices = root / PCI_DEVICES
    if not devices.is_dir():
        raise SourceUnavailable(f"no PCI devices: {devices} does not exist")
    paths: dict[str, tuple[str, ...]] = {}
    gpus = []
    for entry in sorted(devices.iterdir()):
        paths[entry.name] = pci_path(entry)
        if _read(entry / "vendor") == NVIDIA_VENDOR and _read(entry / "class").startswith(GPU_CLASSES):
            gpus.append(entry.name)
    hcas = {}
    for hca in sorted((root / CLASS_DIR).iterdir()) if (root / CLASS_DIR).is_dir() else []:
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
        elif tree is not None and not _near_gpu(hca, tree):
            not_rails[hca] = ("no GPU in the PCI tree" if not tree.gpus else
                              "not in the PCI tree" if hca not in tree.hcas else
                              "no GPU behind its PCIe switch")
        else:
            rails.append(hca)
    basis = "link layer and PCIe tree" if tree is not None else "link layer only (the source has no PCIe tree)"
    return RailChoice(source="discovered", devices=tuple(rails), not_rails=not_rails, basis=basis)


def _near_gpu(hca: str, tree: PciTree) -> bool:
    bdf = tree.hcas.get(hca)
    return bdf is not None and any(share_switch(tree.paths[bdf], tree.paths[gpu]) for gpu in tree.gpus)


def natural_key(name: str) -> tuple[object, ...]:
    """mlx5_2 before mlx5_10: the digit runs compare as numbers."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))
