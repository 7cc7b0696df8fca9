"""PCIe link speed and width of a device from sysfs (the HCA's link that `opsctl ib check` judges).

/sys/bus/pci/devices/<bdf>/{current,max}_link_{speed,width}: the speed files hold the kernel's
pci_speed_string() (drivers/pci/probe.c), the width files "%u\\n" (drivers/pci/pci-sysfs.c):

    $ cat current_link_speed current_link_width max_link_speed max_link_width
    32.0 GT/s PCIe
    16
    32.0 GT/s PCIe
    16

pci_speed_string() writes "2.5 GT/s PCIe", "5.0 GT/s PCIe", "8.0 GT/s PCIe", "16.0 GT/s PCIe",
"32.0 GT/s PCIe", "64.0 GT/s PCIe", or "Unknown" outside its table (an error here). Kernels before the
2020 change "PCI: Use pci_speed_string() for all PCI/PCI-X/PCIe strings" wrote "2.5 GT/s", "5 GT/s",
"8 GT/s", "16 GT/s", "32 GT/s" or "Unknown speed"; both forms are read.
"""

import re
from dataclasses import dataclass
from pathlib import Path

from opsctl.errors import SourceUnavailable

# pci_speed_string() (drivers/pci/probe.c), and the strings of kernels before it was used in sysfs
_KERNEL_SPEEDS = {"2.5 GT/s PCIe": 2.5, "5.0 GT/s PCIe": 5.0, "8.0 GT/s PCIe": 8.0, "16.0 GT/s PCIe": 16.0,
                  "32.0 GT/s PCIe": 32.0, "64.0 GT/s PCIe": 64.0,
                  "2.5 GT/s": 2.5, "5 GT/s": 5.0, "8 GT/s": 8.0, "16 GT/s": 16.0, "32 GT/s": 32.0}
_BDF = r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]"


@dataclass(frozen=True)
class PcieLink:
    speed_gts: float
    width: int


@dataclass(frozen=True)
class PcieLinkStatus:
    address: str  # the device's bdf, "0000:8e:00.0"
    current: PcieLink
    maximum: PcieLink  # the device's capability: max_link_* in sysfs


def parse_link_speed(text: str) -> float:
    """GT/s of a sysfs *_link_speed file."""
    speed = _KERNEL_SPEEDS.get(text.rstrip("\n"))
    if speed is None:
        raise SourceUnavailable(f"PCIe: unknown link speed {text!r}")
    return speed


def parse_link_width(text: str) -> int:
    """Lanes in a sysfs *_link_width file ("16\\n"); 0 is what the kernel reads for an untrained link."""
    value = text.rstrip("\n")
    if not value.isascii() or not value.isdigit():
        raise SourceUnavailable(f"PCIe: unknown link width {text!r}")
    return int(value)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError as exc:
        raise SourceUnavailable(f"sysfs: {path} is missing (not a PCIe device?)") from exc
    except OSError as exc:  # EINVAL when the capability cannot be read (device powered off)
        raise SourceUnavailable(f"sysfs: cannot read {path}: {exc.strerror or exc}") from exc


def read_sysfs_pcie_link(device_dir: Path) -> PcieLinkStatus:
    """Current and maximum link of /sys/bus/pci/devices/<bdf> (a symlink there, resolved for the bdf)."""
    address = (device_dir.resolve() if device_dir.is_symlink() else device_dir).name
    if not re.fullmatch(_BDF, address):
        raise SourceUnavailable(f"sysfs: {device_dir} is not a PCI device directory ({address!r} is no bdf)")
    current = PcieLink(parse_link_speed(_read(device_dir / "current_link_speed")),
                       parse_link_width(_read(device_dir / "current_link_width")))
    maximum = PcieLink(parse_link_speed(_read(device_dir / "max_link_speed")),
                       parse_link_width(_read(device_dir / "max_link_width")))
    return PcieLinkStatus(address=address, current=current, maximum=maximum)
