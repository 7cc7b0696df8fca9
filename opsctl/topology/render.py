"""topology.conf from the fabric (opsctl/topology/fabric.py), for one of Slurm's two topology plugins:

- `topology/tree` (every release from 22.05): a `SwitchName=<leaf group> Nodes=<its nodes>` line per leaf
  group, then a `SwitchName=<group> Switches=<groups below>` line per group of each level above. Each node
  is listed once, under its home group (fabric.py says why): a rail-optimised node sits under a leaf of
  every rail, and Slurm wants one leaf switch per node. This is what NVIDIA's topograph writes for such a
  fabric (pkg/topology/merger.go: switches with the same children become one).
- `topology/block` (24.05 and later): a `BlockName=<leaf group> Nodes=<its nodes>` line per scalable unit,
  then `BlockSizes=`: the smallest block's node count (Slurm's base block; every block must have at least
  that many, topology.conf(5)) and each power-of-two multiple of it up to the number of blocks, so that a
  job of one, two, four ... scalable units is placed in contiguous blocks.

A file holds one plugin's lines: a 22.05 to 26.05 slurmctld refuses a key its plugin does not know.
"""

from opsctl.slurm.hostlist import hostlist_expression
from opsctl.topology.fabric import Fabric

TREE, BLOCK = "tree", "block"
FORMATS = (TREE, BLOCK)


def _header(fabric: Fabric, plugin: str, source: str) -> list[str]:
    return [f"# topology.conf for TopologyPlugin=topology/{plugin}, written by `opsctl ib topology` from {source}:",
            f"# {len(fabric.nodes)} nodes, {len(fabric.leaf_groups())} leaf groups. Do not edit: rerun it."]


def _nodes(nodes: list[str]) -> str:
    return ",".join(hostlist_expression(nodes))


def render_tree(fabric: Fabric, source: str) -> str:
    """The topology/tree lines: leaf groups with their nodes, then each level above, lowest first."""
    lines = _header(fabric, TREE, source)
    listed = {g.name for g in fabric.leaf_groups()}
    lines += [f"SwitchName={g.name} Nodes={_nodes(g.nodes)}" for g in fabric.leaf_groups()]
    upper = sorted((g for g in fabric.groups.values() if g.level > 0), key=lambda g: (g.level, g.name))
    for group in upper:
        children = [c for c in group.children if c in listed]
        if children:
            lines.append(f"SwitchName={group.name} Switches={','.join(children)}")
            listed.add(group.name)
    return "\n".join(lines) + "\n"


def block_sizes(sizes: list[int]) -> list[int]:
    """BlockSizes for blocks of these node counts: the smallest, then doubled while as many blocks exist."""
    if not sizes:
        return []
    base, out = min(sizes), []
    blocks = 1
    while blocks <= len(sizes):
        out.append(base * blocks)
        blocks *= 2
    return out


def render_block(fabric: Fabric, source: str) -> str:
    """The topology/block lines: a block per scalable unit, then BlockSizes."""
    groups = fabric.leaf_groups()
    lines = _header(fabric, BLOCK, source)
    lines += [f"BlockName={g.name} Nodes={_nodes(g.nodes)}" for g in groups]
    sizes = block_sizes([len(g.nodes) for g in groups])
    if sizes:
        lines.append("BlockSizes=" + ",".join(str(s) for s in sizes))
    return "\n".join(lines) + "\n"


def render(fabric: Fabric, plugin: str, source: str) -> str:
    return render_tree(fabric, source) if plugin == TREE else render_block(fabric, source)
