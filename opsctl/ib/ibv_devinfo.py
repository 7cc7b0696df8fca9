"""Parse `ibv_devinfo` output (rdma-core, tab-indented) into one record per device.

    hca_id:    mlx5_0
        transport:            InfiniBand (0)
        fw_ver:                28.41.1000
        node_guid:            a088:c203:00e3:142a
        ...
        phys_port_cnt:            1
            port:    1
                state:            PORT_ACTIVE (4)
                ...
                link_layer:        InfiniBand
"""

from dataclasses import dataclass, field

from opsctl.errors import SourceUnavailable


@dataclass
class VerbsPort:
    state: str = ""  # PORT_ACTIVE, PORT_DOWN, PORT_INIT, ...
    state_code: int = 0
    link_layer: str = ""  # InfiniBand or Ethernet
    fields: dict[str, str] = field(default_factory=dict)  # every other `key: value` of the port block


@dataclass
class VerbsDevice:
    hca_id: str
    fw_ver: str = ""
    node_guid: str = ""
    vendor_part_id: int = 0
    board_id: str = ""
    ports: dict[int, VerbsPort] = field(default_factory=dict)


def parse_ibv_devinfo(text: str) -> list[VerbsDevice]:
    devices: list[VerbsDevice] = []
    port: VerbsPort | None = None
    for raw in text.splitlines():
        if not raw.strip():
            continue
        key, _, value = (part.strip() for part in raw.strip().partition(":"))
        if key == "hca_id":
            devices.append(VerbsDevice(hca_id=value))
            port = None
            continue
        if not devices:
            raise SourceUnavailable(f"ibv_devinfo output does not start with hca_id: {raw!r}")
        dev = devices[-1]
        if key == "port":
            port = dev.ports.setdefault(int(value), VerbsPort())
        elif port is not None:
            if key == "state":
                name, _, code = value.partition(" (")
                port.state, port.state_code = name, int(code.rstrip(")") or 0)
            elif key == "link_layer":
                port.link_layer = value
            else:
                port.fields[key] = value
        elif key in ("fw_ver", "node_guid", "board_id"):
            setattr(dev, key, value)
        elif key == "vendor_part_id":
            dev.vendor_part_id = int(value)
    return devices
