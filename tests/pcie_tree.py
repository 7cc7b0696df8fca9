"""A sysfs tree built from a PCIe tree description (tests/fixtures/ib/dgx-h100-pcie-tree.txt), laid out
as the kernel does: devices/<path>, bus/pci/devices/<bdf> linking there, and for each HCA
class/infiniband/<hca> linking to devices/<path>/infiniband/<hca>, whose `device` links back."""

import os
from pathlib import Path

PORT_FILES = {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": "400 Gb/sec (4X NDR)"}
LINK_FILES = {"current_link_speed": "32.0 GT/s PCIe", "current_link_width": "16",
              "max_link_speed": "32.0 GT/s PCIe", "max_link_width": "16"}


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def link(path: Path, target: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(os.path.relpath(target, path.parent))


def build_sysfs(description: str, root: Path) -> Path:
    """The tree of `description` (lines `path class vendor [hca link_layer]`) under `root`."""
    for line in description.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        path, pci_class, vendor, *hca = line.split()
        device = root / "devices" / path
        write(device / "class", pci_class)
        write(device / "vendor", vendor)
        for name, value in LINK_FILES.items():
            write(device / name, value)
        link(root / "bus" / "pci" / "devices" / device.name, device)
        if hca:
            name, layer = hca
            ib = device / "infiniband" / name
            write(ib / "fw_ver", "28.41.1000")
            for file, value in {**PORT_FILES, "link_layer": layer}.items():
                write(ib / "ports" / "1" / file, value)
            link(ib / "device", device)
            link(root / "class" / "infiniband" / name, ib)
    return root
