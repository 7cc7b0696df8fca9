"""The fabric as Slurm's placement needs it, from the subnets `ibnetdiscover` saw (opsctl/topology/ibnetdiscover.py):
each Slurm node's HCAs on their leaf switches, the leaves grouped into leaf groups (scalable units), the
switches above them, and a record of it all that a later check compares with.

- An HCA is a CA whose node description is `<host> <hca>` (what rdma-core writes to node_desc, `gpu010
  mlx5_3`) with `<host>` a Slurm node (or its short name). Other CAs (a SHARP aggregation node, an HCA
  without a description, a management host) are counted and left out.
- A leaf is a switch with a Slurm node's HCA on it. Its rail is the HCA name most of its HCAs share (more
  than half): in a rail-optimised fabric every leaf belongs to one rail; a leaf that holds all of its nodes'
  HCAs has none.
- Leaf group: leaves that share most of their nodes, each with more than half of the other's nodes: the
  leaves of one scalable unit, one per rail (NVIDIA's topograph merges switches whose node sets are equal
  in the same way; the majority lets one recabled HCA not split a group). In a one-fabric design where a
  node's HCAs all sit on one leaf, each leaf is its own group.
- A node's home group is the group that holds most of its HCAs (ties: the first by name). Slurm's
  topology/tree wants each node under one leaf switch (22.05 and later warn "Multiple leaf switches
  contain nodes" otherwise), so topology.conf lists each node once, under its home group.
- Above the leaves, level by level: the switches linked to the groups of the level below, merged when
  they link to the same groups (the spines of every rail over the same scalable units are one switch for
  Slurm). A leaf's up-links are its links to switches above the leaves.

Names: a switch's name is the part of its description between `;` and `:` (`MF0;rail3-su1-leaf:MQM9700/U1`
-> `rail3-su1-leaf`, as the switch's firmware writes it), a group's the name parts its members share
(`rail0-su1-leaf` .. `rail7-su1-leaf` -> `su1-leaf`), else `leaf1`, `spine1`, `core1`.
"""

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from opsctl.topology.ibnetdiscover import CA, SWITCH, IbNode, Subnet

RECORD_SCHEMA = 1
_SWITCH_NAME = re.compile(r"^[^;:]+;([^;:]+):[^;:]+$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_TIERS = ("leaf", "spine", "core")


@dataclass(frozen=True)
class Hca:
    node: str
    hca: str  # mlx5_3
    guid: str
    switch: str  # the switch GUID its port 1 is linked to ("" when it has no link)
    port: int = 0
    rate: str = ""  # 4xNDR

    @property
    def key(self) -> str:
        return f"{self.node} {self.hca}"


@dataclass
class Switch:
    guid: str
    name: str
    level: int = -1  # 0 leaf, 1 spine, 2 core ...; -1: not above any leaf
    group: str = ""
    rail: str = ""  # a leaf's rail: the HCA name most of its HCAs share
    uplinks: int = 0  # a leaf's links to switches above the leaves


@dataclass
class Group:
    name: str
    level: int
    switches: list[str]  # member switch GUIDs
    children: list[str] = field(default_factory=list)  # the groups below (level 1 and up)
    nodes: list[str] = field(default_factory=list)  # the nodes whose home it is (leaf groups)


@dataclass
class Fabric:
    switches: dict[str, Switch]
    hcas: dict[str, Hca]  # "node hca" -> its placement
    groups: dict[str, Group]
    home: dict[str, str]  # node -> its leaf group
    others: int = 0  # CAs that are no Slurm node's HCA

    @property
    def nodes(self) -> list[str]:
        return sorted(self.home)

    def leaf_groups(self) -> list[Group]:
        return [g for g in self.groups.values() if g.level == 0 and g.nodes]

    def record(self) -> dict[str, Any]:
        """The fabric as the accepted-fabric store and a --design file hold it (JSON)."""
        return {"schema": RECORD_SCHEMA,
                "switches": {s.guid: {"name": s.name, "level": s.level, "group": s.group, "rail": s.rail,
                                      "uplinks": s.uplinks} for s in sorted(self.switches.values(), key=_by_name)},
                "hcas": {k: {"guid": h.guid, "switch": h.switch, "port": h.port, "rate": h.rate}
                         for k, h in sorted(self.hcas.items())},
                "groups": {g.name: {"level": g.level, "switches": g.switches, "children": g.children,
                                    "nodes": g.nodes} for g in self.groups.values()},
                "home": dict(sorted(self.home.items()))}


def _by_name(switch: Switch) -> tuple[int, str]:
    return (switch.level, switch.name)


def switch_name(node: IbNode) -> str:
    match = _SWITCH_NAME.match(node.description)
    name = match.group(1) if match else node.description
    return _UNSAFE.sub("_", name).strip("_")[:64] or f"S-{node.guid}"


def host_and_hca(description: str, slurm_nodes: set[str]) -> tuple[str, str] | None:
    """(node, hca) of an HCA's description `<host> <hca>` whose host (or its short name) is a Slurm node."""
    words = description.split()
    if len(words) != 2:
        return None
    host, hca = words
    for name in (host, host.split(".", 1)[0]):
        if name in slurm_nodes:
            return name, hca
    return None


def build_fabric(subnets: list[Subnet], slurm_nodes: set[str]) -> Fabric:
    """The fabric of `subnets` (one per rail, or one for all: nodes and links are merged by GUID)."""
    nodes: dict[str, IbNode] = {}
    links = {}
    for subnet in subnets:
        nodes.update({g: n for g, n in subnet.nodes.items() if g not in nodes or n.ports})
        links.update({frozenset({(k.guid, k.port), (k.peer_guid, k.peer_port)}): k for k in subnet.links})
    switches = {g: Switch(g, switch_name(n)) for g, n in nodes.items() if n.kind == SWITCH}
    _unique_names(switches)
    hcas, others = _hcas(nodes, links.values(), slurm_nodes)
    neighbours = _switch_neighbours(links.values(), switches)
    groups = _leaf_groups(switches, hcas)
    home = _homes(hcas, switches)
    for group in groups.values():
        group.nodes = sorted(n for n, g in home.items() if g == group.name)
    _upper_levels(switches, neighbours, groups)
    for guid in (g for g, s in switches.items() if s.level == 0):
        switches[guid].uplinks = sum(count for peer, count in neighbours[guid].items() if switches[peer].level > 0)
    return Fabric(switches, hcas, groups, home, others)


def _unique_names(switches: dict[str, Switch]) -> None:
    counts = Counter(s.name for s in switches.values())
    for switch in switches.values():
        if counts[switch.name] > 1:
            switch.name = f"{switch.name}-{switch.guid[-4:]}"


def _hcas(nodes: dict[str, IbNode], links: Any, slurm_nodes: set[str]) -> tuple[dict[str, Hca], int]:
    ends: dict[str, tuple[str, int, str]] = {}  # CA GUID -> (switch GUID, port, rate)
    for link in links:
        for mine, theirs, port in ((link.guid, link.peer_guid, link.peer_port), (link.peer_guid, link.guid, link.port)):
            if nodes[mine].kind == CA and nodes[theirs].kind == SWITCH:
                ends[mine] = (theirs, port, link.rate)
    hcas, others = {}, 0
    for guid, node in nodes.items():
        named = host_and_hca(node.description, slurm_nodes) if node.kind == CA else None
        if named is None:
            others += node.kind == CA
            continue
        switch, port, rate = ends.get(guid, ("", 0, ""))
        hca = Hca(named[0], named[1], guid, switch, port, rate)
        hcas[hca.key] = hca
    return hcas, others


def _switch_neighbours(links: Any, switches: dict[str, Switch]) -> dict[str, Counter[str]]:
    """switch GUID -> the switches it links to, with the number of links to each."""
    out: dict[str, Counter[str]] = {g: Counter() for g in switches}
    for link in links:
        if link.guid in switches and link.peer_guid in switches and link.guid != link.peer_guid:
            out[link.guid][link.peer_guid] += 1
            out[link.peer_guid][link.guid] += 1
    return out


def _leaf_groups(switches: dict[str, Switch], hcas: dict[str, Hca]) -> dict[str, Group]:
    on_leaf: dict[str, list[Hca]] = {}
    for hca in hcas.values():
        if hca.switch:
            on_leaf.setdefault(hca.switch, []).append(hca)
    for guid, placed in on_leaf.items():
        switches[guid].level = 0
        name, count = Counter(h.hca for h in placed).most_common(1)[0]
        switches[guid].rail = name if count * 2 > len(placed) else ""
    parent = {g: g for g in on_leaf}

    def root(guid: str) -> str:
        while parent[guid] != guid:
            parent[guid] = parent[parent[guid]]
            guid = parent[guid]
        return guid

    node_sets = {g: {h.node for h in placed} for g, placed in on_leaf.items()}
    for a, b, shared in _shared_nodes(on_leaf):
        if shared * 2 > len(node_sets[a]) and shared * 2 > len(node_sets[b]):
            parent[root(a)] = root(b)
    members: dict[str, list[str]] = {}
    for guid in on_leaf:
        members.setdefault(root(guid), []).append(guid)
    return _named_groups([sorted(m, key=lambda g: switches[g].name) for m in members.values()], switches, 0, set())


def _shared_nodes(on_leaf: dict[str, list[Hca]]) -> list[tuple[str, str, int]]:
    """(leaf a, leaf b, how many nodes have an HCA on both) for each pair of leaves that share a node."""
    leaves_of: dict[str, set[str]] = {}
    for guid, placed in on_leaf.items():
        for hca in placed:
            leaves_of.setdefault(hca.node, set()).add(guid)
    pairs: Counter[tuple[str, str]] = Counter()
    for leaves in leaves_of.values():
        ordered = sorted(leaves)
        pairs.update((a, b) for i, a in enumerate(ordered) for b in ordered[i + 1:])
    return [(a, b, n) for (a, b), n in sorted(pairs.items())]


def _named_groups(member_lists: list[list[str]], switches: dict[str, Switch], level: int,
                  taken: set[str]) -> dict[str, Group]:
    groups: dict[str, Group] = {}
    for index, members in enumerate(sorted(member_lists, key=lambda m: switches[m[0]].name), 1):
        name = shared_name([switches[g].name for g in members]) or f"{_TIERS[min(level, 2)]}{index}"
        while name in groups or name in taken:
            name = f"{name}-{index}"
        groups[name] = Group(name, level, members)
        for guid in members:
            switches[guid].group, switches[guid].level = name, level
    return groups


def shared_name(names: list[str]) -> str:
    """The name parts (split at - _ .) that every name has at the same place: rail0-su1-leaf, rail1-su1-leaf ->
    su1-leaf; one name is its own; "" when the names share no part or differ in their number of parts."""
    if len(names) == 1:
        return names[0]
    split = [re.split(r"[-_.]", n) for n in names]
    if len({len(s) for s in split}) != 1:
        return ""
    return "-".join(part for i, part in enumerate(split[0]) if all(s[i] == part for s in split))


def _homes(hcas: dict[str, Hca], switches: dict[str, Switch]) -> dict[str, str]:
    groups_of: dict[str, Counter[str]] = {}
    for hca in hcas.values():
        if hca.switch and switches[hca.switch].group:
            groups_of.setdefault(hca.node, Counter())[switches[hca.switch].group] += 1
    return {node: min(counts, key=lambda g: (-counts[g], g)) for node, counts in groups_of.items()}


def _upper_levels(switches: dict[str, Switch], neighbours: dict[str, Counter[str]], groups: dict[str, Group]) -> None:
    """Level 1 (spines) are the switches linked to leaves, level 2 those linked to level 1, and so on; the
    switches of a level that link to the same groups below are one group."""
    level = 0
    while True:
        children: dict[str, frozenset[str]] = {}
        for guid, switch in switches.items():
            if switch.level >= 0:
                continue
            below = frozenset(switches[p].group for p in neighbours[guid] if switches[p].level == level)
            if below:
                children[guid] = below
        if not children:
            return
        level += 1
        by_children: dict[frozenset[str], list[str]] = {}
        for guid, below in children.items():
            by_children.setdefault(below, []).append(guid)
        made = _named_groups([sorted(m, key=lambda g: switches[g].name) for m in by_children.values()], switches,
                             level, set(groups))
        for group in made.values():
            group.children = sorted(children[group.switches[0]])
        groups.update(made)
