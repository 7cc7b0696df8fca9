"""PCIe link speed and width of a device, from sysfs, `lspci -vv` and the kernel's dmesg line.

sysfs, /sys/bus/pci/devices/<bdf>/{current,max}_link_{speed,width}: the speed files hold the kernel's
pci_speed_string() (drivers/pci/probe.c), the width files "%u\\n" (drivers/pci/pci-sysfs.c):

    $ cat current_link_speed current_link_width max_link_speed max_link_width
    32.0 GT/s PCIe
    16
    32.0 GT/s PCIe
    16

pci_speed_string() writes "2.5 GT/s PCIe", "5.0 GT/s PCIe", "8.0 GT/s PCIe", "16.0 GT/s PCIe",
"32.0 GT/s PCIe", "64.0 GT/s PCIe", or "Unknown" outside its table (an error here). Kernels before the
2020 change "PCI: Use pci_speed_string() for all PCI/PCI-X/PCIe strings" wrote "2.5 GT/s", "5 GT/s",
"8 GT/s", "16 GT/s", "32 GT/s" or "Unknown speed" in sysfs and in the dmesg line; both forms are read.

`lspci -vvv` (pciutils ls-caps.c; tests/fixtures/infiniband/lspci-vvv_connectx7_block.txt, shortened):

    1a:00.0 Ethernet controller: Mellanox Technologies MT2910 Family [ConnectX-7]
    \tSubsystem: Mellanox Technologies MT2910 Family [ConnectX-7]
    ...
    \tCapabilities: [60] Express (v2) Endpoint, MSI 00
    ...
    \t\tLnkCap:\tPort #0, Speed 32GT/s, Width x16, ASPM not supported
    ...
    \t\tLnkSta:\tSpeed 32GT/s (ok), Width x16 (ok)
    \t\t\tTrErr- Train- SlotClk+ DLActive- BWMgmt- ABWMgmt-

The LnkSta qualifier depends on the pciutils version: " (ok)"/" (downgraded)"/" (strange)"; newer
releases print nothing when the link is at its capability, " (downgraded)" or " (overdriven)"
otherwise, and nothing on root and downstream ports; old releases print the flags on the same line
("Speed 8GT/s, Width x16, TrErr- Train- ..."). lspci's speeds are "2.5GT/s" ... "64GT/s" or "unknown"
(an error here). A device without an Express capability has no link and is skipped, as is a Root
Complex Integrated Endpoint or Event Collector; any other Express device must show LnkCap and LnkSta
(without them the text is `lspci -v`, or cut short). Run it as root: otherwise lspci prints
"Capabilities: <access denied>", which is an error here.

The kernel's line when a driver (mlx5_core) calls pcie_print_link_status() (drivers/pci/pci.c;
tests/fixtures/infiniband/imbue_dmesg_mlx5_pcie_limited_line.txt):

    [   18.617069] mlx5_core 0000:9c:00.0: 252.056 Gb/s available PCIe bandwidth, limited by 32.0 GT/s
    PCIe x8 link at 0000:97:01.0 (capable of 504.112 Gb/s with 32.0 GT/s PCIe x16 link)

(one line), or, when nothing limits the link, "... 504.112 Gb/s available PCIe bandwidth (32.0 GT/s
PCIe x16 link)". The kernel writes "<unknown>" for a limiting device it could not name.
"""

import re
from dataclasses import dataclass
from pathlib import Path

from opsctl.errors import SourceUnavailable

# pci_speed_string() (drivers/pci/probe.c), and the strings of kernels before it was used in sysfs
_KERNEL_SPEEDS = {"2.5 GT/s PCIe": 2.5, "5.0 GT/s PCIe": 5.0, "8.0 GT/s PCIe": 8.0, "16.0 GT/s PCIe": 16.0,
                  "32.0 GT/s PCIe": 32.0, "64.0 GT/s PCIe": 64.0,
                  "2.5 GT/s": 2.5, "5 GT/s": 5.0, "8 GT/s": 8.0, "16 GT/s": 16.0, "32 GT/s": 32.0}
# link_speed() of pciutils ls-caps.c
_LSPCI_SPEEDS = {"2.5GT/s": 2.5, "5GT/s": 5.0, "8GT/s": 8.0, "16GT/s": 16.0, "32GT/s": 32.0, "64GT/s": 64.0}
_LSPCI_QUALIFIERS = {None, "ok", "downgraded", "strange", "overdriven"}
_BDF = r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]"

_HEADER = re.compile(r"^((?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) (.+)$")
_EXPRESS = re.compile(r"^Capabilities: \[[0-9a-f]+\] Express (?:\(v\d+\) )?(.+), MSI [0-9a-f]{2}$")
_NO_LINK_TYPES = ("Root Complex Integrated Endpoint", "Root Complex Event Collector")
_LNKCAP = re.compile(r"^LnkCap:\tPort #\d+, Speed (\S+), Width x(\d+), ")
_LNKSTA = re.compile(r"^LnkSta:\tSpeed (\S+?)(?: \((\w+)\))?, Width x(\d+)(?: \((\w+)\))?(?:, TrErr[+-] .*)?$")
_BANDWIDTH = re.compile(
    rf"(?:^|\s)([\w-]+) ({_BDF}): (\d+\.\d{{3}}) Gb/s available PCIe bandwidth"
    r"(?:, limited by (.+?) x(\d+) link at (\S+) \(capable of (\d+\.\d{3}) Gb/s with (.+?) x(\d+) link\)"
    r"| \((.+?) x(\d+) link\))$")


@dataclass(frozen=True)
class PcieLink:
    speed_gts: float
    width: int


@dataclass(frozen=True)
class PcieLinkStatus:
    address: str  # as the source names it: "0000:8e:00.0" (sysfs, lspci -D) or "1a:00.0" (lspci)
    current: PcieLink
    maximum: PcieLink  # the device's capability: max_link_* in sysfs, LnkCap in lspci
    description: str = ""  # lspci: the rest of the device's header line; sysfs: ""


@dataclass(frozen=True)
class Mlx5PcieLimit:
    device: str
    available_gbps: float
    limited_by: PcieLink | None  # None: the kernel found nothing slower than the device itself
    limiting_address: str | None  # None when not limited, or when the kernel wrote "<unknown>"
    capable_gbps: float
    capable: PcieLink


def parse_link_speed(text: str) -> float:
    """GT/s of a sysfs *_link_speed file (or a speed in the kernel's dmesg line)."""
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


def _lspci_link(line: str, speed: str, width: str) -> PcieLink:
    if speed not in _LSPCI_SPEEDS:
        raise SourceUnavailable(f"lspci: unknown link speed in {line!r}")
    return PcieLink(_LSPCI_SPEEDS[speed], int(width))


def process_lspci_vv_output(text: str) -> list[PcieLinkStatus]:
    """One record per device with a PCIe link in `lspci -vv`/`-vvv` output, in the text's order."""
    records: list[PcieLinkStatus] = []
    blocks: list[tuple[str, str, list[str]]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("\t"):
            if not blocks:
                raise SourceUnavailable(f"lspci: line before any device header: {line!r}")
            blocks[-1][2].append(line.lstrip("\t"))
        elif match := _HEADER.match(line):
            blocks.append((match[1], match[2], []))
        else:
            raise SourceUnavailable(f"lspci: unknown line {line!r}")
    for address, description, lines in blocks:
        express = cap = sta = None
        for line in lines:
            if line.startswith("Capabilities: <access denied>"):
                raise SourceUnavailable(f"lspci: {address}: capabilities not readable (run lspci as root): {line!r}")
            if match := _EXPRESS.match(line):
                express = match[1]
            elif line.startswith("LnkCap:"):
                if not (match := _LNKCAP.match(line)):
                    raise SourceUnavailable(f"lspci: unknown LnkCap line {line!r}")
                cap = _lspci_link(line, match[1], match[2])
            elif line.startswith("LnkSta:"):
                match = _LNKSTA.match(line)
                if not match or {match[2], match[4]} - _LSPCI_QUALIFIERS:
                    raise SourceUnavailable(f"lspci: unknown LnkSta line {line!r}")
                sta = _lspci_link(line, match[1], match[3])
        if cap is None and sta is None:
            if express is not None and not express.startswith(_NO_LINK_TYPES):
                raise SourceUnavailable(f"lspci: {address}: Express {express!r} without LnkCap/LnkSta "
                                        "(not -vv output, or cut short)")
            continue
        if cap is None or sta is None:
            raise SourceUnavailable(f"lspci: {address}: {'LnkSta' if sta is None else 'LnkCap'} missing "
                                    "(output cut short?)")
        records.append(PcieLinkStatus(address=address, current=sta, maximum=cap, description=description))
    return records


def _dmesg_link(line: str, speed: str, width: str) -> PcieLink:
    if speed not in _KERNEL_SPEEDS:
        raise SourceUnavailable(f"dmesg: unknown link speed {speed!r} in {line!r}")
    return PcieLink(_KERNEL_SPEEDS[speed], int(width))


def process_mlx5_pcie_dmesg(text: str) -> list[Mlx5PcieLimit]:
    """mlx5_core's PCIe bandwidth lines in dmesg/journal text; every other kernel line is ignored."""
    limits: list[Mlx5PcieLimit] = []
    for line in text.splitlines():
        if "available PCIe bandwidth" not in line:
            continue
        match = _BANDWIDTH.search(line.rstrip())
        if not match:
            raise SourceUnavailable(f"dmesg: unknown PCIe bandwidth line {line!r}")
        if match[1] != "mlx5_core":
            continue
        available = float(match[3])
        if match[4] is not None:  # limited by a slower link upstream
            at = None if match[6] == "<unknown>" else match[6]
            limits.append(Mlx5PcieLimit(
                device=match[2], available_gbps=available,
                limited_by=_dmesg_link(line, match[4], match[5]), limiting_address=at,
                capable_gbps=float(match[7]), capable=_dmesg_link(line, match[8], match[9])))
        else:
            limits.append(Mlx5PcieLimit(
                device=match[2], available_gbps=available, limited_by=None, limiting_address=None,
                capable_gbps=available, capable=_dmesg_link(line, match[10], match[11])))
    return limits
