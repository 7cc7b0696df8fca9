"""Where `opsctl ib check` gets its Snapshot: the live sysfs tree, or a capture a support engineer
copied from a node (`--from`: an `ibstat` or `ibv_devinfo` output, a sysfs listing, or a copied tree).

The sysfs root is a setting (config `ib.sysfs_root`, as node_exporter's --path.sysfs), so the lab's
emulated tree is read exactly as a real one. Live, each HCA's PCIe link comes from its `device`
link (class/infiniband/<hca>/device -> the PCI device directory) and the loaded modules from
<root>/module/.
"""

from pathlib import Path

from opsctl.errors import SourceUnavailable
from opsctl.ib.check import Port, Snapshot
from opsctl.ib.ibstat import parse_ibstat
from opsctl.ib.ibv_devinfo import parse_ibv_devinfo
from opsctl.ib.pcie import read_sysfs_pcie_link
from opsctl.ib.sysfs import (
    CLASS_DIR,
    SysfsHca,
    parse_sysfs_ib,
    parse_sysfs_listing,
    read_infiniband_dir,
    read_sysfs_tree,
)

# ibstat and ibv_devinfo word the port state each their own way; sysfs's words are the reference.
_IBSTAT_STATES = {"Active": "ACTIVE", "Down": "DOWN", "Initializing": "INIT", "Armed": "ARMED"}
_VERBS_STATES = {"PORT_ACTIVE": "ACTIVE", "PORT_DOWN": "DOWN", "PORT_INIT": "INIT", "PORT_ARMED": "ARMED",
                 "PORT_ACTIVE_DEFER": "ACTIVE_DEFER"}


def live_snapshot(sysfs_root: Path) -> Snapshot:
    root = Path(sysfs_root)
    hcas = parse_sysfs_ib(read_sysfs_tree(root))
    ports = _sysfs_ports(hcas)
    for port in ports:
        device = root / CLASS_DIR / port.device / "device"
        if device.exists():
            port.pcie = read_sysfs_pcie_link(device)
    modules_dir = root / "module"
    modules = {m.name for m in modules_dir.iterdir()} if modules_dir.is_dir() else set()
    return Snapshot(source=f"sysfs {root}", ports=ports, modules=modules, has_pcie=True)


def capture_snapshot(path: Path) -> Snapshot:
    """A capture: a directory is a copied sysfs tree (its root, or class/infiniband itself); a file is
    told apart by its first line (comment lines aside)."""
    path = Path(path)
    if path.is_dir():
        files = read_sysfs_tree(path) if (path / CLASS_DIR).is_dir() else read_infiniband_dir(path)
        return Snapshot(source=f"sysfs capture {path}", ports=_sysfs_ports(parse_sysfs_ib(files)))
    try:
        text = path.read_text()
    except OSError as err:
        raise SourceUnavailable(f"cannot read {path}: {err.strerror}") from err
    first = next((line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")), "")
    if first.startswith("CA '"):
        return Snapshot(source=f"ibstat capture {path}", ports=_ibstat_ports(text))
    if first.startswith("hca_id:"):
        return Snapshot(source=f"ibv_devinfo capture {path}", ports=_verbs_ports(text))
    if "/" in first.partition(": ")[0]:
        return Snapshot(source=f"sysfs capture {path}",
                        ports=_sysfs_ports(parse_sysfs_ib(parse_sysfs_listing(text))))
    raise SourceUnavailable(f"{path}: not an ibstat or ibv_devinfo output or a sysfs listing (first line {first!r})")


def _sysfs_ports(hcas: list[SysfsHca]) -> list[Port]:
    return [Port(device=hca.name, port=p.port, link_layer=p.link_layer or None, state=p.state or None,
                 phys_state=p.phys_state or None, rate_gbps=p.rate_gbps if p.rate else None,
                 rate_text=p.rate or None, firmware=hca.fw_ver or None, counters=dict(p.counters))
            for hca in hcas for p in hca.ports]


def _ibstat_ports(text: str) -> list[Port]:
    ports = []
    for ca in parse_ibstat(text):
        for p in ca.ports:
            if p.state not in _IBSTAT_STATES:
                raise SourceUnavailable(f"ibstat: {ca.name} port {p.port}: unknown state {p.state!r}")
            # ibstat's Rate is the number alone (400): the width and generation are not in it.
            ports.append(Port(device=ca.name, port=p.port, link_layer=p.link_layer or None,
                              state=_IBSTAT_STATES[p.state], phys_state=p.physical_state or None,
                              rate_gbps=float(p.rate), rate_text=None, firmware=ca.firmware or None))
    return ports


def _verbs_ports(text: str) -> list[Port]:
    ports = []
    for dev in parse_ibv_devinfo(text):
        for number, p in sorted(dev.ports.items()):
            if p.state not in _VERBS_STATES:
                raise SourceUnavailable(f"ibv_devinfo: {dev.hca_id} port {number}: unknown state {p.state!r}")
            # Plain ibv_devinfo has neither the physical state nor the rate (only `-v` prints them).
            phys = p.fields.get("phys_state", "").split(" (")[0] or None
            ports.append(Port(device=dev.hca_id, port=number, link_layer=p.link_layer or None,
                              state=_VERBS_STATES[p.state], phys_state=_verbs_phys(phys), rate_gbps=None,
                              rate_text=None, firmware=dev.fw_ver or None))
    return ports


def _verbs_phys(phys: str | None) -> str | None:
    # ibv_devinfo -v: "phys_state: LINK_UP (5)"; sysfs and ibstat say LinkUp.
    return {"LINK_UP": "LinkUp", "POLLING": "Polling", "DISABLED": "Disabled", "SLEEP": "Sleep",
            "LINK_ERROR_RECOVERY": "LinkErrorRecovery"}.get(phys, phys) if phys else None
