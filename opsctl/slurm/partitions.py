"""Which Slurm nodes opsctl judges: those in `slurm.partitions`, by default every partition that has
GPU nodes. Nodes outside them are not judged, not counted by the safety limits and never touched."""

from opsctl.errors import ConfigError
from opsctl.slurm.base import SlurmNode


def select_partitions(nodes: dict[str, SlurmNode], wanted: tuple[str, ...] | None) -> dict[str, SlurmNode]:
    known = sorted({p for node in nodes.values() for p in node.partitions})
    if wanted is None:
        chosen = {p for node in nodes.values() if node.has_gpus for p in node.partitions}
        if not chosen:
            raise ConfigError("config key slurm.partitions: no Slurm partition has GPU nodes (no node lists a gpu "
                              f"in its Gres); name the partitions to judge (Slurm has: {', '.join(known) or 'none'})")
    else:
        missing = sorted(set(wanted) - set(known))
        if missing:
            raise ConfigError(f"config key slurm.partitions: no Slurm partition {', '.join(missing)} "
                              f"(Slurm has: {', '.join(known) or 'none'})")
        chosen = set(wanted)
    return {name: node for name, node in nodes.items() if chosen.intersection(node.partitions)}
