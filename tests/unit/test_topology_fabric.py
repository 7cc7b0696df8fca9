"""opsctl.topology.fabric and render over synthetic fabrics written here in ibnetdiscover's exact format (the
line shapes of tests/fixtures/infiniband/ibnetdiscover-topograph-ndr-rail-optimised.txt): the rail-optimised
fabric of the lab contract (64 nodes, 8 rails, 2 scalable units, a leaf per rail and SU, 2 spines per rail)
with its faults, and a one-fabric design. `RailFabric` is shared with tests/unit/test_topology_check.py."""

from dataclasses import dataclass, field

from opsctl.topology.fabric import build_fabric, shared_name
from opsctl.topology.ibnetdiscover import process_ibnetdiscover_output
from opsctl.topology.render import block_sizes, render_block, render_tree

RAILS = tuple(f"mlx5_{r}" for r in range(8))
NODES = [f"gpu{i:03d}" for i in range(1, 65)]


def switch_guid(kind: int, rail: int, index: int) -> str:
    return f"2c5eab03{kind:02x}{rail:02x}{index:04x}"


def hca_guid(node: str, hca: int) -> str:
    return f"e09d7303{int(node[3:]):04x}{hca:04x}"


@dataclass
class Switch:
    guid: str
    name: str
    lid: int
    ports: dict[int, tuple[str, int]] = field(default_factory=dict)  # port -> (peer GUID, peer port)


class RailFabric:
    """The lab contract's fabric: rail r's leaves `rail<r>-su<s>-leaf` (node i of SU s on down port i, up ports
    33-64: 16 to each spine) and spines `rail<r>-spine<k>`; each rail its own subnet. Faults move an HCA
    (`recable_leaf`, `recable_rail`) or take a leaf's up-link down (`uplink_down`). `one_fabric`: every rail in one
    subnet, as a site with one fabric sees it."""

    def __init__(self, nodes: list[str] = NODES, sus: int = 2, rails: int = 8):
        self.nodes, self.sus, self.rails = nodes, sus, rails
        self.per_su = len(nodes) // sus
        self.switches: dict[str, Switch] = {}
        self.descs: dict[str, str] = {}
        self.hca_port: dict[str, tuple[str, int]] = {}  # HCA GUID -> (switch GUID, port)
        lid = 1
        for rail in range(rails):
            for su in range(1, sus + 1):
                self._add(switch_guid(1, rail, su), f"rail{rail}-su{su}-leaf", lid := lid + 1)
            for spine in (1, 2):
                self._add(switch_guid(2, rail, spine), f"rail{rail}-spine{spine}", lid := lid + 1)
            for su in range(1, sus + 1):
                leaf = switch_guid(1, rail, su)
                for spine in (1, 2):
                    for k in range(1, 17):
                        self.link(leaf, 32 + (spine - 1) * 16 + k, switch_guid(2, rail, spine), (su - 1) * 16 + k)
        for index, node in enumerate(nodes):
            for rail in range(rails):
                self.plug(node, rail, switch_guid(1, rail, index // self.per_su + 1), index % self.per_su + 1)

    def _add(self, guid: str, name: str, lid: int) -> None:
        self.switches[guid] = Switch(guid, name, lid)

    def link(self, a: str, a_port: int, b: str, b_port: int) -> None:
        self.switches[a].ports[a_port] = (b, b_port)
        self.switches[b].ports[b_port] = (a, a_port)

    def plug(self, node: str, hca: int, leaf: str, port: int) -> None:
        guid = hca_guid(node, hca)
        if guid in self.hca_port:
            old, old_port = self.hca_port[guid]
            del self.switches[old].ports[old_port]
        self.descs[guid] = f"{node} mlx5_{hca}"
        self.switches[leaf].ports[port] = (guid, 1)
        self.hca_port[guid] = (leaf, port)

    def su_of(self, node: str) -> int:
        return self.nodes.index(node) // self.per_su + 1

    def recable_leaf(self, node: str, rail: int) -> None:
        """That rail's HCA to the leaf of the other SU, same rail, a free down port (as lab faults do)."""
        other = self.su_of(node) % self.sus + 1
        self.plug(node, rail, switch_guid(1, rail, other), self._free(switch_guid(1, rail, other)))

    def recable_rail(self, node: str, rail: int) -> None:
        """That rail's HCA to the leaf of rail (r+1) % 8 of its own SU."""
        leaf = switch_guid(1, (rail + 1) % self.rails, self.su_of(node))
        self.plug(node, rail, leaf, self._free(leaf))

    def swap_rails(self, node: str, a: int, b: int) -> None:
        """Rails a and b of the node cabled to each other's leaf, as the real NDR capture has one node."""
        (leaf_a, port_a), (leaf_b, port_b) = self.hca_port[hca_guid(node, a)], self.hca_port[hca_guid(node, b)]
        for hca, leaf, port in ((a, leaf_b, port_b), (b, leaf_a, port_a)):
            self.switches[leaf].ports[port] = (hca_guid(node, hca), 1)
            self.hca_port[hca_guid(node, hca)] = (leaf, port)

    def uplink_down(self, leaf_name: str) -> None:
        leaf = next(s for s in self.switches.values() if s.name == leaf_name)
        port = max(p for p, (peer, _) in leaf.ports.items() if peer in self.switches)
        peer, peer_port = leaf.ports.pop(port)
        del self.switches[peer].ports[peer_port]

    def _free(self, leaf: str) -> int:
        return next(p for p in range(1, 66) if p not in self.switches[leaf].ports)

    # ---- ibnetdiscover's output ------------------------------------------------------------------------
    def _desc(self, guid: str) -> str:
        return f"MF0;{self.switches[guid].name}:MQM9700/U1" if guid in self.switches else self.descs[guid]

    def _switch_text(self, sw: Switch) -> str:
        lines = ["", "vendid=0x2c9", "devid=0xd2f2", f"sysimgguid=0x{sw.guid}", f"switchguid=0x{sw.guid}({sw.guid})",
                 f'Switch\t65 "S-{sw.guid}"\t\t# "MF0;{sw.name}:MQM9700/U1" enhanced port 0 lid {sw.lid} lmc 0']
        for port, (peer, peer_port) in sorted(sw.ports.items()):
            if peer in self.switches:
                lines.append(f'[{port}]\t"S-{peer}"[{peer_port}]\t\t# "{self._desc(peer)}" '
                             f"lid {self.switches[peer].lid} 4xNDR")
            else:
                lines.append(f'[{port}]\t"H-{peer}"[1]({peer}) \t\t# "{self._desc(peer)}" lid {port + 100} 4xNDR')
        return "\n".join(lines)

    def _ca_text(self, guid: str) -> str:
        leaf, port = self.hca_port[guid]
        return "\n".join(["", "vendid=0x2c9", "devid=0x1021", f"sysimgguid=0x{guid}", f"caguid=0x{guid}",
                          f'Ca\t1 "H-{guid}"\t\t# "{self.descs[guid]}"',
                          f'[1]({guid}) \t"S-{leaf}"[{port}]\t\t# lid {port + 100} lmc 0 "{self._desc(leaf)}" '
                          f"lid {self.switches[leaf].lid} 4xNDR"])

    def _subnet(self, switches: list[Switch]) -> str:
        guids = {s.guid for s in switches}
        header = "#\n# Topology file: generated on Mon Dec  7 10:00:00 2026\n#\n# Initiated from node 0 port 0"
        cas = [g for g, (leaf, _) in sorted(self.hca_port.items()) if leaf in guids]
        return "\n".join([header, *(self._switch_text(s) for s in switches), *(self._ca_text(g) for g in cas)]) + "\n"

    def outputs(self) -> dict[str, str]:
        """hca -> `ibnetdiscover -C <hca>` of that rail's subnet."""
        return {f"mlx5_{r}": self._subnet([s for s in self.switches.values() if s.name.startswith(f"rail{r}-")])
                for r in range(self.rails)}

    def one_output(self) -> str:
        return self._subnet(list(self.switches.values()))


def fabric_of(texts: dict[str, str], nodes=NODES):
    return build_fabric([process_ibnetdiscover_output(t, hca) for hca, t in texts.items()], set(nodes))


def test_the_rail_optimised_fabric_has_two_leaf_groups_of_32_nodes_under_one_spine_switch():
    fabric = fabric_of(RailFabric().outputs())
    assert [(g.name, len(g.switches), g.nodes) for g in fabric.leaf_groups()] == [
        ("su1-leaf", 8, NODES[:32]), ("su2-leaf", 8, NODES[32:])]
    spines = [g for g in fabric.groups.values() if g.level == 1]
    assert [(len(g.switches), g.children) for g in spines] == [(16, ["su1-leaf", "su2-leaf"])]
    leaves = [s for s in fabric.switches.values() if s.level == 0]
    assert len(leaves) == 16 and {s.uplinks for s in leaves} == {32}
    assert {s.name: s.rail for s in leaves}["rail3-su2-leaf"] == "mlx5_3"
    assert len(fabric.hcas) == 64 * 8 and fabric.home["gpu033"] == "su2-leaf"


def test_tree_lists_every_node_once_under_its_leaf_group_and_the_spines_above():
    text = render_tree(fabric_of(RailFabric().outputs()), "test")
    assert [line for line in text.splitlines() if not line.startswith("#")] == [
        "SwitchName=su1-leaf Nodes=gpu[001-032]", "SwitchName=su2-leaf Nodes=gpu[033-064]",
        "SwitchName=spine1 Switches=su1-leaf,su2-leaf"]


def test_block_makes_one_block_per_scalable_unit_with_block_sizes():
    text = render_block(fabric_of(RailFabric().outputs()), "test")
    assert [line for line in text.splitlines() if not line.startswith("#")] == [
        "BlockName=su1-leaf Nodes=gpu[001-032]", "BlockName=su2-leaf Nodes=gpu[033-064]", "BlockSizes=32,64"]


def test_block_sizes_start_at_the_smallest_block_and_double_while_blocks_last():
    assert block_sizes([32, 32]) == [32, 64]
    assert block_sizes([18, 17, 18, 16, 18]) == [16, 32, 64]
    assert block_sizes([]) == []


def test_one_fabric_gives_the_same_groups_as_a_subnet_per_rail():
    per_rail, one = RailFabric().outputs(), RailFabric().one_output()
    assert render_tree(fabric_of({"fabric": one}), "x") == render_tree(fabric_of(per_rail), "x")


def test_a_recabled_hca_keeps_its_node_under_its_own_group():
    lab = RailFabric()
    lab.recable_leaf("gpu010", 3)
    fabric = fabric_of(lab.outputs())
    assert fabric.home["gpu010"] == "su1-leaf"
    assert [g.nodes for g in fabric.leaf_groups()] == [NODES[:32], NODES[32:]]
    assert fabric.switches[fabric.hcas["gpu010 mlx5_3"].switch].name == "rail3-su2-leaf"


def test_a_one_fabric_design_with_a_node_per_leaf_port_group_is_a_leaf_per_group():
    """Not rail-optimised: each leaf holds all 8 HCAs of 4 nodes; no leaf has a rail, each is its own group."""
    lab = RailFabric(nodes=NODES[:8], sus=2, rails=8)
    for index, node in enumerate(lab.nodes):  # every HCA of a node onto its SU's rail-0 leaf
        leaf = switch_guid(1, 0, index // 4 + 1)
        for hca in range(8):
            lab.plug(node, hca, leaf, (index % 4) * 8 + hca + 1)
    fabric = fabric_of({"fabric": lab.one_output()}, NODES[:8])
    assert [(g.name, g.nodes) for g in fabric.leaf_groups()] == [("rail0-su1-leaf", NODES[:4]),
                                                                ("rail0-su2-leaf", NODES[4:8])]
    assert {s.rail for s in fabric.switches.values() if s.level == 0} == {""}


def test_nodes_outside_slurm_and_unnamed_hcas_are_left_out():
    fabric = fabric_of(RailFabric().outputs(), nodes=NODES[:40])
    assert fabric.nodes == NODES[:40] and fabric.others == 24 * 8


def test_shared_name_keeps_the_parts_every_member_has():
    assert shared_name(["rail0-su1-leaf", "rail7-su1-leaf"]) == "su1-leaf"
    assert shared_name(["A09-P1-IBLEAF-01-04", "A09-P1-IBLEAF-02-04"]) == "A09-P1-IBLEAF-04"
    assert shared_name(["rail0-spine1", "rail1-spine2"]) == ""
    assert shared_name(["leaf-a", "leaf_b_c"]) == ""
