"""Parse `ibstat` output (infiniband-diags) into one record per port.

    CA 'mlx5_0'
        CA type: MT4129
        Number of ports: 1
        Firmware version: 28.41.1000
        Hardware version: 0
        Node GUID: 0xa088c20300e3142a
        System image GUID: 0xa088c20300e3142a
        Port 1:
            State: Active
            Physical state: LinkUp
            Rate: 400
            ...
            Link layer: InfiniBand

(the real file is tab-indented; see tests/fixtures/infiniband/gpud_ibstat.*). A CA with no port
block is kept with no ports.
"""

from dataclasses import dataclass, field

from opsctl.errors import SourceUnavailable


@dataclass
class IbPort:
    port: int
    state: str = ""
    physical_state: str = ""
    rate: int = 0
    base_lid: int = 0
    sm_lid: int = 0
    port_guid: str = ""
    link_layer: str = ""


@dataclass
class IbCa:
    name: str
    ca_type: str = ""
    firmware: str = ""
    node_guid: str = ""
    ports: list[IbPort] = field(default_factory=list)


def parse_ibstat(text: str) -> list[IbCa]:
    cas: list[IbCa] = []
    port: IbPort | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("CA '") and line.endswith("'"):
            cas.append(IbCa(name=line[4:-1]))
            port = None
            continue
        if not cas:
            raise SourceUnavailable(f"ibstat output does not start with a CA line: {line!r}")
        key, _, value = (part.strip() for part in line.partition(":"))
        if key.startswith("Port ") and not value:
            port = IbPort(port=int(key.split()[1]))
            cas[-1].ports.append(port)
        elif port is not None and key in _PORT_KEYS:
            setattr(port, _PORT_KEYS[key][0], _PORT_KEYS[key][1](value))
        elif key in _CA_KEYS:
            setattr(cas[-1], _CA_KEYS[key], value)
    return cas


_CA_KEYS = {"CA type": "ca_type", "Firmware version": "firmware", "Node GUID": "node_guid"}
_PORT_KEYS = {
    "State": ("state", str),
    "Physical state": ("physical_state", str),
    "Rate": ("rate", int),
    "Base lid": ("base_lid", int),
    "SM lid": ("sm_lid", int),
    "Port GUID": ("port_guid", str),
    "Link layer": ("link_layer", str),
}
