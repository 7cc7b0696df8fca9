"""`opsctl hold` in Slurm: a held node's reason carries the word `held` right after `opsctl:`, so that the node,
which reads only its Slurm reason, sees the hold too and takes no step (opsctl/ladder/node_step.py: a held reason
is no step of the ladder), and so does every health run (no rule is called `held`: nothing resumes it).

    opsctl:reset gpu2 row-remap-pending ...   ->   opsctl:held reset gpu2 row-remap-pending ...

`opsctl hold --release` takes the word out again: the node is back on the step it was on. A node with no
opsctl reason (in service, or a person's drain) is held on the head alone: it has no step to take.
"""

from dataclasses import replace

from opsctl.slurm.base import OWNED_PREFIX, SlurmNode

HELD = f"{OWNED_PREFIX}held "


def is_held(node: SlurmNode) -> bool:
    return node.reason.startswith(HELD)


def held_reason(reason: str) -> str:
    """`opsctl:<rest>` -> `opsctl:held <rest>`; a reason already held stays as it is."""
    return reason if reason.startswith(HELD) else HELD + reason.removeprefix(OWNED_PREFIX)


def released_reason(reason: str) -> str:
    """`opsctl:held <rest>` -> `opsctl:<rest>`."""
    return OWNED_PREFIX + reason.removeprefix(HELD) if reason.startswith(HELD) else reason


def without_hold(node: SlurmNode) -> SlurmNode:
    """The node as its step reads, the hold's word taken out."""
    return replace(node, reason=released_reason(node.reason)) if is_held(node) else node


def holdable(node: SlurmNode) -> bool:
    """A reason the hold can mark: opsctl's own, automatic one (a person's `opsctl:manual` needs no hold)."""
    return node.owned and not node.manual
