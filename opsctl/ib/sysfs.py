"""Read the `/sys/class/infiniband` tree into one record per HCA port.

A real 8x ConnectX-7 NDR host (gpud's sys-class-infiniband-h100 fixture, see tests/fixtures/SOURCES.md),
one line per file:

    mlx5_0/board_id: MT_0000000838
    mlx5_0/fw_ver: 28.41.1000
    mlx5_0/hca_type: MT4129
    mlx5_0/ports/1/link_layer: InfiniBand
    mlx5_0/ports/1/phys_state: 5: LinkUp
    mlx5_0/ports/1/rate: 400 Gb/sec (4X NDR)
    mlx5_0/ports/1/state: 4: ACTIVE
    mlx5_0/ports/1/counters/symbol_error: 0
    mlx5_0/ports/1/counters/port_rcv_errors: 14
    ...
    mlx5_bond_0/ports/1/link_layer: Ethernet

The tree comes from a live sysfs root (`read_sysfs_tree`, the root is a setting as node_exporter's
--path.sysfs is), or from a capture: a copied tree, or a listing in the form above
(`parse_sysfs_listing`). Both become the same {relative path: content} mapping, which
`parse_sysfs_ib` turns into records. A value it does not know is an error naming the file.
"""

import re
from dataclasses import dataclass, field
from pathlib import Path

from opsctl.errors import SourceUnavailable

CLASS_DIR = Path("class") / "infiniband"
_STATE = re.compile(r"^(\d+): ([A-Z_]+)$")  # "4: ACTIVE"
_PHYS = re.compile(r"^(\d+): (\w[\w ]*)$")  # "5: LinkUp", "2: Polling"
_RATE = re.compile(r"^(\d+(?:\.\d+)?) Gb/sec(?: \((.+)\))?$")  # "400 Gb/sec (4X NDR)"
_DEVICE_FILES = {"fw_ver", "board_id", "hca_type", "node_guid", "node_type", "node_desc", "sys_image_guid"}


@dataclass
class SysfsPort:
    device: str
    port: int
    state: str = ""  # ACTIVE, DOWN, INIT, ARMED
    state_id: int = 0
    phys_state: str = ""  # LinkUp, Polling, Disabled, ...
    phys_state_id: int = 0
    rate: str = ""  # as sysfs words it: "400 Gb/sec (4X NDR)"
    rate_gbps: float = 0.0
    link_layer: str = ""  # InfiniBand or Ethernet
    counters: dict[str, int] = field(default_factory=dict)  # ports/N/counters/*


@dataclass
class SysfsHca:
    name: str
    fw_ver: str = ""
    board_id: str = ""
    hca_type: str = ""
    ports: list[SysfsPort] = field(default_factory=list)


def read_sysfs_tree(sysfs_root: Path) -> dict[str, str]:
    """Every file under <sysfs_root>/class/infiniband that the records use, as {path: content}."""
    return read_infiniband_dir(Path(sysfs_root) / CLASS_DIR)


def read_infiniband_dir(base: Path) -> dict[str, str]:
    """The same for the class/infiniband directory itself, or a copy of it under any name."""
    if not base.is_dir():
        raise SourceUnavailable(f"no InfiniBand devices: {base} does not exist")
    files: dict[str, str] = {}
    for device in sorted(base.iterdir()):
        for name in _DEVICE_FILES:
            _read_into(files, base, device / name)
        ports = device / "ports"
        for port in sorted(ports.iterdir()) if ports.is_dir() else []:
            for name in ("state", "phys_state", "rate", "link_layer"):
                _read_into(files, base, port / name)
            counters = port / "counters"
            for counter in sorted(counters.iterdir()) if counters.is_dir() else []:
                _read_into(files, base, counter)
    return files


def _read_into(files: dict[str, str], base: Path, path: Path) -> None:
    try:
        files[str(path.relative_to(base))] = path.read_text().strip()
    except FileNotFoundError:
        return
    except OSError as err:  # some counters refuse reads on some firmware: say which
        raise SourceUnavailable(f"cannot read {path}: {err.strerror}") from err


def parse_sysfs_listing(text: str) -> dict[str, str]:
    """A listing of `<device>/<path>: <content>` lines ('#' lines are comments) as {path: content}."""
    files: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        path, sep, content = line.partition(": ")
        if not sep or "/" not in path or " " in path:
            raise SourceUnavailable(f"sysfs listing line {number}: expected '<device>/<file>: <value>', got {raw!r}")
        files[path] = content.strip()
    return files


def parse_sysfs_ib(files: dict[str, str]) -> list[SysfsHca]:
    """The records of a {path relative to class/infiniband: content} mapping, sorted by device."""
    hcas: dict[str, SysfsHca] = {}
    ports: dict[tuple[str, int], SysfsPort] = {}
    for path, content in sorted(files.items()):
        parts = path.split("/")
        hca = hcas.setdefault(parts[0], SysfsHca(name=parts[0]))
        if len(parts) == 2 and parts[1] in _DEVICE_FILES:
            if parts[1] in ("fw_ver", "board_id", "hca_type"):
                setattr(hca, parts[1], content)
            continue
        if len(parts) < 4 or parts[1] != "ports" or not parts[2].isdigit():
            continue  # a file the checks do not use (hw_counters, gids, ...)
        key = (parts[0], int(parts[2]))
        if key not in ports:
            ports[key] = SysfsPort(device=parts[0], port=int(parts[2]))
            hca.ports.append(ports[key])
        _set_port_file(ports[key], path, parts[3:], content)
    if not hcas:
        raise SourceUnavailable("no InfiniBand devices in the sysfs tree")
    return [hcas[name] for name in sorted(hcas)]


def _set_port_file(port: SysfsPort, path: str, rest: list[str], content: str) -> None:
    if rest == ["state"]:
        match = _STATE.match(content)
        if not match:
            raise SourceUnavailable(f"{path}: unknown port state {content!r}")
        port.state_id, port.state = int(match[1]), match[2]
    elif rest == ["phys_state"]:
        match = _PHYS.match(content)
        if not match:
            raise SourceUnavailable(f"{path}: unknown physical state {content!r}")
        port.phys_state_id, port.phys_state = int(match[1]), match[2]
    elif rest == ["rate"]:
        match = _RATE.match(content)
        if not match:
            raise SourceUnavailable(f"{path}: unknown rate {content!r}")
        port.rate, port.rate_gbps = content, float(match[1])
    elif rest == ["link_layer"]:
        if content not in ("InfiniBand", "Ethernet"):
            raise SourceUnavailable(f"{path}: unknown link layer {content!r}")
        port.link_layer = content
    elif len(rest) == 2 and rest[0] == "counters":
        if not content.isdigit():
            raise SourceUnavailable(f"{path}: counter is not a number: {content!r}")
        port.counters[rest[1]] = int(content)
