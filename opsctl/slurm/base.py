"""What opsctl needs from Slurm, who owns a node's drain, and which Slurm states opsctl leaves alone.

A drain is opsctl's when its reason starts with `opsctl:`. `opsctl:manual ...` is a drain a person
made through `opsctl drain`: opsctl owns the reason text but never resumes it on its own.

Node state names are Slurm's own (`node_state_string`, src/common/slurm_protocol_defs.c), as the
JSON of every release prints them: a base state (IDLE, ALLOCATED, MIXED, DOWN, ...) and flags
(DRAIN, FAIL, MAINTENANCE, RESERVED, REBOOT_REQUESTED, POWERED_DOWN, NOT_RESPONDING, ...).
tests/fixtures/slurm/ holds real outputs of each state from 22.05, 24.11 and 26.05.
"""

from dataclasses import dataclass
from typing import Protocol

OWNED_PREFIX = "opsctl:"
MANUAL_PREFIX = "opsctl:manual"
# Base states in which a node is out of service whatever its flags say.
DOWN_STATES = {"down", "fail", "failing", "future", "unknown", "error", "inval"}
# Flags that take a node out of service, set by Slurm or a person, never by opsctl. A node carrying one
# is not opsctl's to drain or resume (MAINT is printed MAINTENANCE in JSON, MAINT by sinfo -o %T).
OUT_OF_SERVICE_FLAGS = {"FAIL", "NOT_RESPONDING", "MAINTENANCE", "MAINT", "REBOOT_REQUESTED", "REBOOT_ISSUED",
                        "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN", "POWERING_UP", "INVALID_REG"}
# In service, but reserved for someone: not opsctl's to take away.
HANDS_OFF_FLAGS = OUT_OF_SERVICE_FLAGS | {"RESERVED"}
# Base states of a node that opsctl's own drain may be lifted from (the node runs or waits for jobs).
RESUMABLE_STATES = {"idle", "allocated", "mixed", "completing", "drained", "draining", "drain"}


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str  # lower case base state: idle, allocated, mixed, down, ...
    flags: tuple[str, ...] = ()  # upper case: DRAIN, NOT_RESPONDING, ...
    reason: str = ""
    partitions: tuple[str, ...] = ()
    gres: str = ""  # as configured, e.g. "gpu:h200:8(S:0-1)"

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags or self.state in ("drained", "draining", "drain")

    @property
    def state_text(self) -> str:
        """The state as Slurm prints it: the base state and its flags, `IDLE+DRAIN`, `DOWN+NOT_RESPONDING`."""
        return "+".join([self.state.upper() or "UNKNOWN", *self.flags])

    @property
    def held_by_slurm(self) -> tuple[str, ...]:
        """The states and flags that put this node out of opsctl's reach (empty when there are none)."""
        held = [self.state.upper()] if self.state in DOWN_STATES else []
        return tuple(held + [f for f in self.flags if f in HANDS_OFF_FLAGS])

    @property
    def out_of_service(self) -> bool:
        return self.drained or self.state in DOWN_STATES or any(f in OUT_OF_SERVICE_FLAGS for f in self.flags)

    @property
    def owned(self) -> bool:
        return self.reason.startswith(OWNED_PREFIX)

    @property
    def manual(self) -> bool:
        return self.reason.startswith(MANUAL_PREFIX)

    @property
    def foreign_reason(self) -> bool:
        """A reason that someone else set: opsctl never changes such a node, whatever its state."""
        return bool(self.reason) and not self.owned

    @property
    def owner(self) -> str:
        if not self.reason:
            return ""
        if self.manual:
            return "opsctl-manual"
        return "opsctl" if self.owned else "other"

    @property
    def has_gpus(self) -> bool:
        """gres lists a gpu (gpu, gpu:8, gpu:h200:8(S:0-1), ...)."""
        return any(item.split(":", 1)[0].split("(", 1)[0] == "gpu" for item in self.gres.split(",") if item)

    @property
    def resumable(self) -> bool:
        """opsctl's own drain, and nothing else holds the node: lifting the drain returns it to service."""
        return self.drained and self.owned and not self.manual and self.state in RESUMABLE_STATES \
            and not self.held_by_slurm

    def reason_rules(self) -> list[str]:
        """'opsctl:xid-79,ib-down gpu3 ...' -> ['xid-79', 'ib-down']."""
        if not self.owned or self.manual:
            return []
        head = self.reason[len(OWNED_PREFIX):].split(" ", 1)[0]
        return [rule for rule in head.split(",") if rule]

    def same_as(self, other: "SlurmNode") -> bool:
        """The fields a planned change depends on are unchanged (compare and set)."""
        return (self.state, self.flags, self.reason) == (other.state, other.flags, other.reason)


class Slurm(Protocol):
    """Errors: SourceUnavailable when Slurm cannot be read or does not accept a change."""

    def nodes(self) -> dict[str, SlurmNode]: ...

    def drain(self, names: list[str], reason: str) -> None: ...

    def resume(self, names: list[str]) -> None: ...

    def set_reason(self, names: list[str], reason: str) -> None: ...

    def expand(self, hostlist: str) -> list[str]: ...
