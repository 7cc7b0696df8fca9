"""Jinja filter: whether a slurm.conf change needs the Slurm daemons restarted, or `scontrol reconfigure`
is enough (running jobs and every daemon's PID are kept either way; a reconfigure disturbs nothing).

slurm_conf_restart_reasons: why the change from the installed file `old` to the rendered `new` needs a
restart, one short reason per changed key or line; [] when a reconfigure applies it all:

    {{ installed | slurm_conf_restart_reasons(rendered, _slurm_restart_keys) }}
    -> ['SelectType changed', 'node lines changed (nodes added, removed or redefined)']

What needs a restart (scontrol(1), "reconfigure"; slurm.conf(5), each parameter's "A restart of ... is
required"): the keys in `restart_keys` (the role's table from slurm.conf(5)), every key that names a
plugin (its name ends in Type or Plugin: plugins are loaded when a daemon starts), and the node lines
(nodes added or removed need both daemons restarted; their hardware is read by slurmd at start).
Partitions and every other key are re-read by a reconfigure. A missing installed file (a new node) is
a restart: its daemons start with the file anyway.
"""


def _settings(text: str) -> tuple[dict[str, str], set[str]]:
    """(key -> value of the single-key lines, the set of node definition lines), case of keys kept."""
    keys: dict[str, str] = {}
    nodes: set[str] = set()
    for raw in (text or "").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or "=" not in line:
            continue
        key, _, value = line.partition("=")
        if key.lower() in ("nodename", "nodeset"):
            nodes.add(" ".join(line.split()))
        elif key.lower() not in ("partitionname", "include"):
            keys[key.strip()] = value.strip()
    return keys, nodes


def slurm_conf_restart_reasons(old: str | None, new: str, restart_keys) -> list[str]:
    if not old:
        return ["no slurm.conf installed yet"]
    old_keys, old_nodes = _settings(old)
    new_keys, new_nodes = _settings(new)
    wanted = {key.lower() for key in restart_keys}
    reasons = []
    for key in sorted(set(old_keys) | set(new_keys), key=str.lower):
        if old_keys.get(key) == new_keys.get(key):
            continue
        if key.lower() in wanted or key.endswith(("Type", "Plugin")):
            reasons.append(f"{key} changed")
    if old_nodes != new_nodes:
        reasons.append("node lines changed (nodes added, removed or redefined)")
    return reasons


class FilterModule:
    def filters(self):
        return {"slurm_conf_restart_reasons": slurm_conf_restart_reasons}
