"""The lab's InfiniBand fabric: what `ibnetdiscover` of each rail finds (opsctl_lab.hwtools.ibnetdiscover).

Rail-optimised, as an NVIDIA SuperPOD of H100/H200 nodes: each of the 8 rails is a fabric of its own (its
own subnet manager, leaves and spines), so the rail-r HCA (mlx5_r) of every node sees rail r only.

- Scalable units of 32 nodes, in the order the cluster lists them: SU1 = gpu001..gpu032, SU2 =
  gpu033..gpu064 (at least 2, at most 3: 96 nodes). Per rail and SU one leaf, a QM9700 (64 NDR ports plus
  port 65, its SHARP aggregation node, as a real one shows): node i of its SU on down port i (1-32), the
  up-links on ports 33-64.
- Per rail 2 spines (QM9700), each linked to every leaf of the rail by 16 ports: leaf port 33+j to spine 1
  port 16(s-1)+1+j, leaf port 49+j to spine 2 port 16(s-1)+1+j (j 0-15, s the leaf's SU).
- The head (the host that runs `opsctl ib topology`, as NVIDIA's topograph runs ibnetdiscover) has an HCA
  on every rail, mlx5_r on spine 1's port 64, as a fabric's management hosts hang off a spine.
- Names as a real fabric shows them: an HCA's node description is `<hostname> <hca>` (what rdma-core writes
  to /sys/class/infiniband/<hca>/node_desc); a switch's `MF0;<name>:MQM9700/U1` with names
  `rail<r>-su<s>-leaf` and `rail<r>-spine<k>`. GUIDs and LIDs are stable per device; an HCA's are those
  its sysfs tree (opsctl_lab.ib_sysfs) and ibstat show.

Faults. On a node (its hardware state, opsctl_lab.hardware): `recable-leaf:<r>` moves the rail-r HCA to
rail r's leaf of the next SU (the other one of 2), `recable-rail:<r>` to rail (r+1) % 8's leaf of its own
SU; either takes the first free down port there, and on a full leaf (32 nodes) the leaf's last up-link port,
whose spine cable was pulled to make room, as a technician would have to. An HCA whose port is not LinkUp
(`ib-down`) has no link: the fabric does not reach it. On the fabric (its state file, FabricState):
`uplink-down:<leaf>` takes down the leaf's last up-link (port 64, to spine 2).
"""

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from opsctl_lab.errors import LabError
from opsctl_lab.hardware import RAILS, NodeHardware, parse_fault, stable_int
from opsctl_lab.ib_sysfs import node_guid as sysfs_node_guid
from opsctl_lab.ib_sysfs import port_lid

SU_SIZE = 32
MIN_SUS = 2
MAX_SUS = 3  # 16 ports to each leaf of the rail and one to the head: 3 leaves fill a spine's 64 ports
LEAF_PORTS = 64
UPLINKS_PER_SPINE = 16
SPINES = 2
AN_PORT = 65  # the switch's SHARP aggregation node: `Switch 65`, its port 65 a CA
HEAD_SPINE_PORT = 64
HEAD = "head"
# Quantum-2 (QM9700) switch, its aggregation node and a ConnectX-7 HCA, as the real capture shows them
# (tests/fixtures/infiniband/ibnetdiscover-topograph-ndr-rail-optimised.txt).
VENDOR_ID = 0x2C9
SWITCH_DEVID = 0xD2F2
AN_DEVID = 0xCF09
HCA_DEVID = 0x1021
SWITCH_MODEL = "MQM9700/U1"
AN_DESC = "Mellanox Technologies Aggregation Node"
FABRIC_FAULTS = ("uplink-down",)


def leaf_name(rail: int, su: int) -> str:
    return f"rail{rail}-su{su}-leaf"


def spine_name(rail: int, k: int) -> str:
    return f"rail{rail}-spine{k}"


def switch_desc(name: str) -> str:
    return f"MF0;{name}:{SWITCH_MODEL}"


def switch_guid(name: str) -> int:
    """0x2c5eab0300xxxxx0-style, as the real QM97xx GUIDs (a multiple of 0x40: the aggregation node is +0x10)."""
    return (0x2C5EAB0300 << 24) | (stable_int("switch", name, "guid", modulo=1 << 18) << 6)


def switch_lid(name: str, what: str = "switch") -> int:
    return stable_int(name, what, "lid", modulo=0xBFFF) + 1


@dataclass
class FabricNode:
    """A switch or a CA as ibnetdiscover prints it; `links` maps a port to the (GUID, port) at the cable's
    other end."""

    kind: str  # "switch" or "ca"
    guid: int
    desc: str
    lid: int
    ports: int
    devid: int
    sysimgguid: int
    links: dict[int, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class HostHca:
    """One host's HCA as the fabric sees it: where its cable should go, and whether the link is up."""

    host: str
    hca: str
    rail: int  # the rail it belongs to (its index among the host's rails)
    guid: int
    lid: int  # 0 where no subnet manager configured the port
    up: bool  # physical link up (LinkUp)
    to_other_su: bool = False  # recable-leaf
    to_next_rail: bool = False  # recable-rail


def host_hcas(hw: NodeHardware) -> list[HostHca]:
    """The rails of a lab node, as its hardware state has them (names, link, LIDs and its rail faults)."""
    leaf_moves, rail_moves = hw.recabled("recable-leaf"), hw.recabled("recable-rail")
    found = []
    for rail, hca in enumerate(hw.hca_layout().rails):
        port = hw.hca_port(hca)
        guid = int(sysfs_node_guid(hw.node, hca).replace(":", ""), 16)
        found.append(HostHca(host=hw.node, hca=hca, rail=rail, guid=guid, lid=port_lid(hw, hca, port),
                             up=port["phys_state"].startswith("5"),
                             to_other_su=rail in leaf_moves, to_next_rail=rail in rail_moves))
    return found


def head_hcas(host: str = HEAD) -> list[HostHca]:
    """The head's HCAs: mlx5_0..mlx5_7, always up."""
    return host_hcas(NodeHardware(node=host))


def scalable_units(nodes: int) -> int:
    sus = max(MIN_SUS, math.ceil(nodes / SU_SIZE))
    if sus > MAX_SUS:
        raise LabError(f"the lab fabric holds at most {MAX_SUS * SU_SIZE} nodes ({MAX_SUS} scalable units of "
                       f"{SU_SIZE}); this cluster has {nodes}")
    return sus


class RailFabric:
    """One rail's fabric: its switches, the HCAs cabled to it, and every cable."""

    def __init__(self, rail: int) -> None:
        self.rail = rail
        self.nodes: dict[int, FabricNode] = {}

    def add(self, node: FabricNode) -> FabricNode:
        self.nodes[node.guid] = node
        return node

    def connect(self, a: FabricNode, a_port: int, b: FabricNode, b_port: int) -> None:
        a.links[a_port] = (b.guid, b_port)
        b.links[b_port] = (a.guid, a_port)

    def find(self, desc: str) -> FabricNode:
        return next(n for n in self.nodes.values() if n.desc == desc)

    def disconnect(self, node: FabricNode, port: int) -> None:
        peer, peer_port = node.links.pop(port)
        del self.nodes[peer].links[peer_port]


def _switch(fabric: RailFabric, name: str) -> FabricNode:
    guid = switch_guid(name)
    switch = fabric.add(FabricNode("switch", guid, switch_desc(name), switch_lid(name), AN_PORT, SWITCH_DEVID, guid))
    aggregation = fabric.add(FabricNode("ca", guid + 0x10, AN_DESC, switch_lid(name, "an"), 1, AN_DEVID, guid))
    fabric.connect(switch, AN_PORT, aggregation, 1)
    return switch


def _ca(fabric: RailFabric, hca: HostHca) -> FabricNode:
    return fabric.add(FabricNode("ca", hca.guid, f"{hca.host} {hca.hca}", hca.lid, 1, HCA_DEVID, hca.guid))


def build_rail(rail: int, nodes: list[list[HostHca]], head: list[HostHca] | None,
               uplinks_down: set[str] | frozenset[str] = frozenset()) -> RailFabric:
    """Rail `rail`'s fabric with the cluster's nodes (each node's HCAs, in the cluster's order), the head's
    HCAs (None: no head on the fabric) and the leaves whose last up-link is down."""
    sus = scalable_units(len(nodes))
    fabric = RailFabric(rail)
    spines = [_switch(fabric, spine_name(rail, k)) for k in range(1, SPINES + 1)]
    leaves = [_switch(fabric, leaf_name(rail, su)) for su in range(1, sus + 1)]
    for su, leaf in enumerate(leaves, start=1):
        for k, spine in enumerate(spines):
            for j in range(UPLINKS_PER_SPINE):
                fabric.connect(leaf, SU_SIZE + 1 + k * UPLINKS_PER_SPINE + j, spine,
                               (su - 1) * UPLINKS_PER_SPINE + 1 + j)
    moved: list[tuple[HostHca, FabricNode]] = []
    for index, hcas in enumerate(nodes):
        for hca in hcas:
            home_su = index // SU_SIZE + 1
            target_su = home_su % sus + 1 if hca.to_other_su else home_su
            on_rail = (hca.rail + 1) % RAILS if hca.to_next_rail else hca.rail
            if on_rail != rail or not hca.up:
                continue
            if hca.to_other_su or hca.to_next_rail:
                moved.append((hca, leaves[target_su - 1]))
            else:
                fabric.connect(leaves[home_su - 1], index % SU_SIZE + 1, _ca(fabric, hca), 1)
    for hca, leaf in moved:  # after every HCA in its place: a moved cable takes a port left free
        fabric.connect(leaf, _free_port(fabric, leaf), _ca(fabric, hca), 1)
    for leaf in leaves:
        name = leaf.desc.split(";")[1].split(":")[0]
        if name in uplinks_down and LEAF_PORTS in leaf.links:
            fabric.disconnect(leaf, LEAF_PORTS)
    for head_hca in head or []:
        if head_hca.rail == rail and head_hca.up:
            fabric.connect(spines[0], HEAD_SPINE_PORT, _ca(fabric, head_hca), 1)
    return fabric


def _free_port(fabric: RailFabric, leaf: FabricNode) -> int:
    """The first free down port; on a full leaf its last up-link port, that spine cable pulled."""
    free = [p for p in range(1, SU_SIZE + 1) if p not in leaf.links]
    if free:
        return free[0]
    for port in range(LEAF_PORTS, SU_SIZE, -1):
        peer, _ = leaf.links.get(port, (0, 0))
        if peer and fabric.nodes[peer].kind == "switch":
            fabric.disconnect(leaf, port)
            return port
    raise LabError(f"no port left on {leaf.desc} for a recabled HCA")


def leaf_names(nodes: int) -> list[str]:
    return [leaf_name(rail, su) for rail in range(RAILS) for su in range(1, scalable_units(nodes) + 1)]


# ---- the fabric's own state: its members and its faults ------------------------------------------


@dataclass
class FabricState:
    """What the fabric holds besides the nodes' own states: who is on it (the cluster's GPU nodes in order,
    the head), where each node's hardware state is (`state_pattern`, a path with {node}), and the faults of
    the fabric itself (`uplink-down:<leaf>`)."""

    nodes: list[str]
    state_pattern: str
    head: str | None = HEAD
    faults: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> "FabricState":
        try:
            raw = json.loads(Path(path).read_text())
        except FileNotFoundError as err:
            raise LabError(f"no lab fabric at {path}: the lab writes it when it starts") from err
        except (OSError, ValueError) as err:
            raise LabError(f"cannot read the lab fabric {path}: {err}") from err
        return cls(nodes=list(raw["nodes"]), state_pattern=raw["state_pattern"], head=raw.get("head"),
                   faults=list(raw.get("faults", [])))

    def save(self, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"nodes": self.nodes, "state_pattern": self.state_pattern, "head": self.head,
                                   "faults": self.faults}, indent=1))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)

    def inject(self, text: str) -> str:
        """Add a fabric fault (`uplink-down:rail3-su1-leaf`); returns its label. Raises LabError on a fault
        that is not the fabric's or a leaf that is not on it."""
        spec, _ = parse_fault(text)
        if spec.name not in FABRIC_FAULTS:
            raise LabError(f"{text} is not a fault of the fabric; the fabric takes {', '.join(FABRIC_FAULTS)}")
        leaf = text.partition(":")[2]
        if leaf not in leaf_names(len(self.nodes)):
            raise LabError(f"no leaf {leaf!r} on the lab fabric: leaves are rail<0-{RAILS - 1}>-su<1-"
                           f"{scalable_units(len(self.nodes))}>-leaf")
        if text not in self.faults:
            self.faults.append(text)
        return text

    def uplinks_down(self) -> set[str]:
        return {fault.partition(":")[2] for fault in self.faults if fault.startswith("uplink-down:")}

    def node_states(self) -> list[NodeHardware]:
        return [NodeHardware.load(Path(self.state_pattern.format(node=name)), name) for name in self.nodes]


def rail_fabric(state: FabricState, rail: int, nodes: list[NodeHardware] | None = None) -> RailFabric:
    """Rail `rail` of the fabric `state` describes, from each node's hardware state."""
    hardware = state.node_states() if nodes is None else nodes
    return build_rail(rail, [host_hcas(hw) for hw in hardware], head_hcas(state.head) if state.head else None,
                      state.uplinks_down())
