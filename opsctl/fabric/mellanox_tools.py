"""Parse the NVIDIA (Mellanox) firmware tools: `mlxup --query` (or mlxfwmanager) and `mlxlink --show_mo`.

`mlxup -d 0000:8e:00.0` (tests/fixtures/infiniband/cx7_ndr_lspci_mlxup_mlxlink_b2b.txt, shortened):

    Querying Mellanox devices firmware ...

    Device #1:
    ----------

      Device Type:      ConnectX7
      Part Number:      MCX75310AAS-NEA_Ax
      Description:      NVIDIA ConnectX-7 HHHL Adapter card; 400GbE / NDR IB (default mode); ...
      PSID:             MT_0000000838
      PCI Device Name:  0000:8e:00.0
      Base GUID:        9c63c00300abed5a
      Base MAC:         9c63c0abed5a
      Versions:         Current        Available
         FW             28.47.1026     28.47.1026
         FW (Running)   28.46.3048     N/A
         PXE            3.8.0100       N/A
         UEFI           14.39.0014     N/A

      Status:           Up to date

The "FW (Running)" row is there only when the running firmware differs from the one on flash (a reset
is pending; the MFT source adds it only then), so without it the running firmware is the current one.
Other "Key: value" lines (Port1 GUID on older cards, ...) are kept in `fields`. Run it with --query
(or -d <device> as above): what an update run prints after the devices is not parsed, and is an error.

`mlxlink -d /dev/mst/mt4129_pciconf0 --show_mo` (same file):

    Operational Info
    ----------------
    State                              : Active
    Physical state                     : LinkUp
    Speed                              : IB-NDR
    Width                              : 4x
    FEC                                : Ethernet_Consortium_LL_50G_RS_FEC_PLR -(272,257+1)
    Loopback Mode                      : No Loopback
    Auto Negotiation                   : ON

    Supported Info
    --------------
    Enabled Link Speed                 : 0x000000f1 (NDR,HDR,EDR,FDR,SDR)
    ...

(values are followed by a space; on a terminal they may be coloured, and the colour codes are removed).
"""

import re
from dataclasses import dataclass, field

from opsctl.errors import SourceUnavailable

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_MLXUP_KEY = re.compile(r"^\s*([A-Za-z][A-Za-z0-9 ]*?):\s+(.*?)\s*$")
_MLXUP_VERSION = re.compile(r"^\s+(\S.*?)\s{2,}(\S+)\s+(\S+)\s*$")
_MLXLINK_KEY = re.compile(r"^([^:\s][^:]*?)\s+:\s?(.*?)\s*$")
_MLXLINK_TITLE = re.compile(r"^[A-Z][A-Za-z ]*[a-z]$")


@dataclass
class MlxupDevice:
    device_type: str
    part_number: str
    description: str
    psid: str
    pci_device_name: str
    base_guid: str | None  # None on an Ethernet-only device
    firmware_current: str  # on flash
    firmware_available: str | None  # None: "N/A", no image for this PSID in this mlxup
    firmware_running: str
    status: str | None
    versions: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # FW, PXE, UEFI, ...
    fields: dict[str, str] = field(default_factory=dict)  # every "Key: value" line, as printed


@dataclass
class MlxlinkInfo:
    state: str
    physical_state: str
    speed: str  # "IB-NDR", ...
    width: int  # lanes: "4x" is 4
    fec: str
    sections: dict[str, dict[str, str]] = field(default_factory=dict)  # every section, as printed


def _device(number: str, fields: dict[str, str], versions: dict[str, tuple[str, str | None]]) -> MlxupDevice:
    for key in ("Device Type", "Part Number", "PSID", "PCI Device Name"):
        if key not in fields:
            raise SourceUnavailable(f"mlxup: device #{number} has no {key!r} line (output cut short?)")
    if "FW" not in versions:
        raise SourceUnavailable(f"mlxup: device #{number} has no FW version row (output cut short?)")
    current, available = versions["FW"]
    running = versions["FW (Running)"][0] if "FW (Running)" in versions else current
    return MlxupDevice(device_type=fields["Device Type"], part_number=fields["Part Number"],
                       description=fields.get("Description", ""), psid=fields["PSID"],
                       pci_device_name=fields["PCI Device Name"], base_guid=fields.get("Base GUID"),
                       firmware_current=current, firmware_available=available, firmware_running=running,
                       status=fields.get("Status"), versions=versions, fields=fields)


def process_mlxup_output(text: str) -> list[MlxupDevice]:
    parsed: list[tuple[str, dict[str, str], dict[str, tuple[str, str | None]]]] = []
    in_versions = after_title = False
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line or line == "Querying Mellanox devices firmware ...":
            continue
        if match := re.fullmatch(r"Device #(\d+):", line):
            parsed.append((match[1], {}, {}))
            in_versions, after_title = False, True
            continue
        if after_title and re.fullmatch(r"-+", line):  # the title's underline
            after_title = False
            continue
        after_title = False
        if parsed and (match := _MLXUP_KEY.match(line)):
            key, value = match[1], match[2]
            if key in parsed[-1][1]:
                raise SourceUnavailable(f"mlxup: {key!r} twice for device #{parsed[-1][0]}: {line!r}")
            in_versions = key == "Versions"
            if in_versions and value.split() != ["Current", "Available"]:
                raise SourceUnavailable(f"mlxup: unknown Versions header {line!r}")
            parsed[-1][1][key] = value
        elif in_versions and (match := _MLXUP_VERSION.match(line)):
            parsed[-1][2][match[1]] = (match[2], None if match[3] == "N/A" else match[3])
        else:
            raise SourceUnavailable(f"mlxup: unknown line {line!r}")
    if not parsed:
        raise SourceUnavailable("mlxup: no 'Device #' in output")
    return [_device(number, fields, versions) for number, fields, versions in parsed]


def process_mlxlink_output(text: str) -> MlxlinkInfo:
    sections: dict[str, dict[str, str]] = {}
    lines = [_ANSI.sub("", raw).rstrip() for raw in text.splitlines()]
    current: dict[str, str] | None = None
    index = 0
    while index < len(lines):
        line = lines[index]
        underline = lines[index + 1] if index + 1 < len(lines) else ""
        if _MLXLINK_TITLE.match(line) and re.fullmatch(r"-+", underline):
            current = sections.setdefault(line, {})
            index += 1  # the underline
        elif line and current is not None and (match := _MLXLINK_KEY.match(line)):
            current[match[1]] = match[2]
        elif line:
            raise SourceUnavailable(f"mlxlink: unknown line {line!r}")
        index += 1
    operational = sections.get("Operational Info")
    if operational is None:
        raise SourceUnavailable("mlxlink: no 'Operational Info' section (not --show_mo output?)")
    for key in ("State", "Physical state", "Speed", "Width", "FEC"):
        if key not in operational:
            raise SourceUnavailable(f"mlxlink: Operational Info has no {key!r} line (output cut short?)")
    if not (match := re.fullmatch(r"(\d+)x", operational["Width"])):
        raise SourceUnavailable(f"mlxlink: unknown Width {operational['Width']!r}")
    return MlxlinkInfo(state=operational["State"], physical_state=operational["Physical state"],
                       speed=operational["Speed"], width=int(match[1]), fec=operational["FEC"], sections=sections)
