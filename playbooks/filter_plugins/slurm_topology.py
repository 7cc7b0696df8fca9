"""Jinja filters for the topology.conf that slurm_common installs (slurm_topology_plugin, slurm_topology_source).

slurmctld reads topology.conf when it starts or reconfigures, and a line its plugin does not take stops it
("fatal: ... Parsing error"): a file written for topology/block under topology/tree leaves the cluster
without a controller. Slurm has no check flag for the file (`slurmd -G` does not read it), so the role
checks it here before it is installed:

    {{ text | slurm_topology_problems('topology/tree') }}
    -> ['line 3: BlockName= is a topology/block key, not one of topology/tree (SwitchName, Switches, Nodes, LinkSpeed)']

    {{ text | slurm_topology_nodes }}
    -> ['gpu001', 'gpu002', ...]   (every node the file names, its hostlists expanded)

The keys are topology.conf(5)'s (Slurm 22.05 to 26.05): topology/tree takes SwitchName with Switches, Nodes
and LinkSpeed; topology/block takes BlockName with Nodes, and BlockSizes. Parameter names are case
insensitive there, so they are here.
"""

import importlib.util
from pathlib import Path

# playbooks/filter_plugins/ -> opsctl's own hostlist code, loaded from its file as slurm_hostlist.py does.
_HOSTLIST = Path(__file__).resolve().parents[2] / "opsctl" / "slurm" / "hostlist.py"
_spec = importlib.util.spec_from_file_location("_opsctl_slurm_hostlist_topology", _HOSTLIST)
assert _spec is not None and _spec.loader is not None, _HOSTLIST
_hostlist = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_hostlist)

# plugin -> (the key that starts a line, every key a line may hold), in topology.conf(5)'s spelling.
PLUGIN_KEYS = {
    "topology/tree": ("SwitchName", ("SwitchName", "Switches", "Nodes", "LinkSpeed")),
    "topology/block": ("BlockName", ("BlockName", "Nodes", "BlockSizes")),
}


def _lines(text: str) -> list[tuple[int, list[tuple[str, str]]]]:
    """(line number, [(key, value), ...]) of each line that holds settings; comments and blanks left out."""
    lines = []
    for number, raw in enumerate((text or "").splitlines(), start=1):
        words = raw.split("#", 1)[0].split()
        if words:
            lines.append((number, [(k, v) for k, _, v in (w.partition("=") for w in words)]))
    return lines


def slurm_topology_problems(text: str, plugin: str) -> list[str]:
    """Why slurmctld with TopologyPlugin=`plugin` would refuse `text`, one line each; [] when it fits."""
    if plugin not in PLUGIN_KEYS:
        return [f"{plugin!r} is not a topology plugin the role writes ({', '.join(PLUGIN_KEYS)})"]
    first, allowed = PLUGIN_KEYS[plugin]
    known = {key.lower(): key for key in allowed}
    others = {key.lower(): name for name, (_, keys) in PLUGIN_KEYS.items() if name != plugin for key in keys}
    problems = []
    for number, pairs in _lines(text):
        for key, value in pairs:
            if key.lower() in known and value:
                continue
            if key.lower() in others and key.lower() not in known:
                problems.append(f"line {number}: {key}= is a {others[key.lower()]} key, not one of {plugin} "
                                f"({', '.join(allowed)})")
            elif key.lower() not in known:
                problems.append(f"line {number}: {key!r} is not a {plugin} key ({', '.join(allowed)})")
            else:
                problems.append(f"line {number}: {key}= has no value")
        lead = pairs[0][0].lower()
        if lead != first.lower() and not (plugin == "topology/block" and lead == "blocksizes"):
            problems.append(f"line {number}: starts with {pairs[0][0]}=, not {first}=")
    if not any(pairs[0][0].lower() == first.lower() for _, pairs in _lines(text)):
        problems.append(f"no {first}= line: an empty topology for {plugin}")
    return problems


def slurm_topology_nodes(text: str) -> list[str]:
    """Every node the file's Nodes= name, expanded, in order, each once."""
    nodes: dict[str, None] = {}
    for _, pairs in _lines(text):
        for key, value in pairs:
            if key.lower() == "nodes" and value:
                nodes.update(dict.fromkeys(_hostlist.expand_hostlist(value)))
    return list(nodes)


class FilterModule:
    def filters(self):
        return {"slurm_topology_problems": slurm_topology_problems, "slurm_topology_nodes": slurm_topology_nodes}
