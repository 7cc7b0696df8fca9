"""`ibnetdiscover`'s topology file (rdma-core infiniband-diags, ibnetdiscover.c out_switch/out_ca and their
port lines) as switches, CAs and their links. A sample (tests/fixtures/infiniband/, SOURCES.md):

    vendid=0x2c9
    devid=0xd2f2
    sysimgguid=0x2c5eab0300b87b40
    switchguid=0x2c5eab0300b87b40(2c5eab0300b87b40)
    Switch	65 "S-2c5eab0300b87b40"		# "MF0;A09-P1-IBLEAF-04-04:MQM9701/U1" enhanced port 0 lid 73 lmc 0
    [1]	"H-e09d7303007a4bd8"[1](e09d7303007a4bd8) 		# "a08-p1-dgx-04-c01 mlx5_5" lid 647 4xNDR
    [35]	"S-2c5eab0300c26280"[32]		# "MF0;A10-P1-IBSPINE-02:MQM9701/U1" lid 236 4xNDR

and a CA's section, from rdma-core's man page (its spaces are tabs in a real output):

    caguid=0x8f10403960984
    Ca      2 "H-0008f10403960984"          # "MT23108 InfiniHost Mellanox Technologies"
    [1](8f10403960985)     "S-0008f10400410015"[6]         # lid 16 lmc 1 "SW-6IB4 Voltaire" lid 3 4xSDR

A node line names the node's kind (Switch, Ca, Rt), its port count, `"<S|H|R>-<node GUID>"` and, after `#`,
its node description; each port line below it names the peer's node and port, the link's active width
(1x 2x 4x 8x 12x) and speed (SDR ... NDR, XDR). `-g` adds chassis lines and `[ext N]` ports, `-f` adds
` s=N w=N v=N`: both are read. A link shows on both of its ends and is kept once, as first read (the switch's
side: ibnetdiscover prints the switches first). A line that is none of these is an error
that names it: the parser never guesses.
"""

import re
from dataclasses import dataclass, field

from opsctl.errors import SourceUnavailable

SWITCH, CA, ROUTER = "switch", "ca", "router"
_KIND = {"Switch": SWITCH, "Ca": CA, "Rt": ROUTER}
_PREFIX_KIND = {"S": SWITCH, "H": CA, "R": ROUTER}
_GUID = r"([SHR])-([0-9a-fA-F]{1,16})"
_RATE = r"(1x|2x|4x|8x|12x|\?\?)(SDR|DDR|QDR|FDR10|FDR|EDR|HDR|NDR|XDR|\?\?\?)"
_TAIL = r"(?:\s+s=\d+ w=\d+ v=\d+)?(?:\s+slot \d+|\s+\(scp\))?\s*$"
_SWITCH_LINE = re.compile(r"^Switch\s+(\d+)\s+\"" + _GUID + r"\"\s+#\s+\"(.*)\"\s+(?:enhanced|base) port 0 lid (\d+) "
                          r"lmc \d+\s*$")
_CA_LINE = re.compile(r"^(Ca|Rt)\s+(\d+)\s+\"" + _GUID + r"\"\s+#\s+\"(.*)\"(?:\s+\(scp\))?\s*$")
# A switch's port: [port][ext N]  "<peer>"[peer port][ext N](peer port GUID)  # "<peer desc>" lid N 4xNDR
_SWITCH_PORT = re.compile(r"^\[(\d+)\](?:\[ext \d+\])?\s+\"" + _GUID + r"\"\[(\d+)\](?:\[ext \d+\])?"
                          r"(?:\([0-9a-fA-F]+\))?\s*#\s+\"(.*)\"\s+lid \d+ " + _RATE + _TAIL)
# A CA's port: [port](port GUID)  "<peer>"[peer port][ext N] (peer port GUID)  # lid N lmc N "<peer desc>" lid N 4xNDR
_CA_PORT = re.compile(r"^\[(\d+)\]\([0-9a-fA-F]+\)\s+\"" + _GUID + r"\"\[(\d+)\](?:\[ext \d+\])?"
                      r"(?:\s*\([0-9a-fA-F]+\))?\s*#\s+lid \d+ lmc \d+ \"(.*)\"\s+lid \d+ " + _RATE + _TAIL)
# What carries nothing the model needs: the header, ids, and the chassis grouping of -g.
_IGNORED = re.compile(r"^(#.*|\s*|vendid=.*|devid=.*|sysimgguid=.*|switchguid=.*|caguid=.*|rtguid=.*|"
                      r"Non-Chassis Nodes|Chassis \d+.*|Hostname: .*)$")


@dataclass(frozen=True)
class Link:
    """One cable as ibnetdiscover saw it: (node GUID, port) at each end, the active width and speed."""

    guid: str
    port: int
    peer_guid: str
    peer_port: int
    width: str  # 4x
    speed: str  # NDR

    @property
    def rate(self) -> str:
        return f"{self.width}{self.speed}"


@dataclass
class IbNode:
    kind: str  # switch | ca | router
    guid: str  # 16 hex digits, lower case
    ports: int
    description: str  # the node description: "gpu010 mlx5_3", "MF0;rail3-su1-leaf:MQM9700/U1"
    lid: int | None = None  # a switch's port 0 LID


@dataclass
class Subnet:
    """One ibnetdiscover output: its nodes by GUID and its links, each once."""

    source: str
    nodes: dict[str, IbNode] = field(default_factory=dict)
    links: list[Link] = field(default_factory=list)


def _guid(text: str) -> str:
    return text.lower().rjust(16, "0")


def _node(line: str) -> IbNode | None:
    if match := _SWITCH_LINE.match(line):
        ports, _, guid, desc, lid = match.groups()
        return IbNode(SWITCH, _guid(guid), int(ports), desc, int(lid))
    if match := _CA_LINE.match(line):
        kind, ports, _, guid, desc = match.groups()
        return IbNode(_KIND[kind], _guid(guid), int(ports), desc)
    return None


def _link(line: str, owner: IbNode) -> tuple[Link, IbNode] | None:
    """The link of a port line under `owner`, and the peer as the line describes it."""
    match = (_SWITCH_PORT if owner.kind == SWITCH else _CA_PORT).match(line)
    if match is None:
        return None
    port, prefix, guid, peer_port, desc, width, speed = match.groups()
    peer = IbNode(_PREFIX_KIND[prefix], _guid(guid), 0, desc)
    return Link(owner.guid, int(port), peer.guid, int(peer_port), width, speed), peer


def process_ibnetdiscover_output(text: str, source: str) -> Subnet:
    """The subnet of one `ibnetdiscover` output; SourceUnavailable naming `source` and the line it cannot read."""
    subnet = Subnet(source)
    owner: IbNode | None = None
    seen: set[tuple[str, int]] = set()
    for number, line in enumerate(text.splitlines(), 1):
        node = _node(line)
        if node is not None:
            owner = subnet.nodes.setdefault(node.guid, node)
            owner.kind, owner.ports, owner.description, owner.lid = node.kind, node.ports, node.description, node.lid
            continue
        if line.startswith("["):
            found = _link(line, owner) if owner is not None else None
            if found is None:
                raise SourceUnavailable(f"{source} line {number}: not a port line of ibnetdiscover: {line.strip()!r}")
            link, peer = found
            subnet.nodes.setdefault(peer.guid, peer)
            ends = {(link.guid, link.port), (link.peer_guid, link.peer_port)}
            if not ends & seen:
                subnet.links.append(link)
                seen |= ends
            continue
        if not _IGNORED.match(line):
            raise SourceUnavailable(f"{source} line {number}: not ibnetdiscover output: {line.strip()[:120]!r}")
        if not line.strip():
            owner = None
    if not subnet.nodes:
        raise SourceUnavailable(f"{source}: no switch or CA in it (not ibnetdiscover output?)")
    return subnet
