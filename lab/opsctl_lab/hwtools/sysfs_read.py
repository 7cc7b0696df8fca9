"""Read a sysfs-format InfiniBand tree (`<root>/class/infiniband/<dev>/...`) the way ibstat and
ibv_devinfo read /sys/class/infiniband on a real host."""

from pathlib import Path
from typing import TypedDict


class PortInfo(TypedDict):
    port: int
    state: str
    phys_state: str
    rate: str
    link_layer: str
    lid: int
    sm_lid: int
    cap_mask: str


class DeviceInfo(TypedDict):
    name: str
    hca_type: str
    fw_ver: str
    board_id: str
    node_guid: str
    ports: list[PortInfo]


def _read(path: Path, default: str = "") -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return default


def devices(root: Path) -> list[DeviceInfo]:
    """One dict per device, sorted by name as umad lists them."""
    base = Path(root) / "class" / "infiniband"
    out: list[DeviceInfo] = []
    for dev in sorted(base.iterdir()) if base.is_dir() else []:
        ports: list[PortInfo] = []
        for port in sorted((dev / "ports").iterdir(), key=lambda p: int(p.name)):
            ports.append({
                "port": int(port.name),
                "state": _read(port / "state", "1: DOWN"),
                "phys_state": _read(port / "phys_state", "3: Disabled"),
                "rate": _read(port / "rate", "0 Gb/sec"),
                "link_layer": _read(port / "link_layer", "InfiniBand"),
                "lid": int(_read(port / "lid", "0x0"), 16),
                "sm_lid": int(_read(port / "sm_lid", "0x0"), 16),
                "cap_mask": _read(port / "cap_mask", "0x00000000"),
            })
        out.append({
            "name": dev.name,
            "hca_type": _read(dev / "hca_type"),
            "fw_ver": _read(dev / "fw_ver"),
            "board_id": _read(dev / "board_id"),
            "node_guid": _read(dev / "node_guid", "0000:0000:0000:0000"),
            "ports": ports,
        })
    return out


def guid_hex(sysfs_guid: str) -> str:
    """'a088:c203:00e3:142a' -> '0xa088c20300e3142a' (ibstat's spelling)."""
    return "0x" + sysfs_guid.replace(":", "")
