"""What opsctl needs from Slurm, and who owns a node's drain.

A drain is opsctl's when its reason starts with `opsctl:`. `opsctl:manual ...` is a drain a person
made through `opsctl drain`: opsctl owns the reason text but never resumes it on its own.
"""

from dataclasses import dataclass
from typing import Protocol

OWNED_PREFIX = "opsctl:"
MANUAL_PREFIX = "opsctl:manual"
# Base states in which a node is out of service whatever its flags say (sinfo --json `state`).
DOWN_STATES = {"down", "fail", "failing", "future", "unknown"}


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str  # lower case base state: idle, allocated, mixed, down, ...
    flags: tuple[str, ...] = ()  # upper case: DRAIN, NOT_RESPONDING, ...
    reason: str = ""

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags or self.state in ("drained", "draining", "drain")

    @property
    def out_of_service(self) -> bool:
        return self.drained or self.state in DOWN_STATES or "NOT_RESPONDING" in self.flags

    @property
    def owned(self) -> bool:
        return self.reason.startswith(OWNED_PREFIX)

    @property
    def manual(self) -> bool:
        return self.reason.startswith(MANUAL_PREFIX)

    @property
    def owner(self) -> str:
        if not self.reason:
            return ""
        if self.manual:
            return "opsctl-manual"
        return "opsctl" if self.owned else "other"

    def reason_rules(self) -> list[str]:
        """'opsctl:xid-79,ib-down gpu3 ...' -> ['xid-79', 'ib-down']."""
        if not self.owned or self.manual:
            return []
        head = self.reason[len(OWNED_PREFIX):].split(" ", 1)[0]
        return [rule for rule in head.split(",") if rule]


class Slurm(Protocol):
    """Errors: SourceUnavailable when Slurm cannot be read or does not accept a change."""

    def nodes(self) -> dict[str, SlurmNode]: ...

    def drain(self, names: list[str], reason: str) -> None: ...

    def resume(self, names: list[str]) -> None: ...

    def expand(self, hostlist: str) -> list[str]: ...
