"""What opsctl already acted on, so that a person's repair is never undone by a re-drain.

Every check behind a drain whose rule has `memory` (window or level) is remembered as a Handled
record: (node, rule, device, value, time). A later check of the same rule and device is `handled`,
not failing, while it shows the same event:

- window (windowed counts and increases: XID counts, ecc-dbe-new): the same or a lower value within
  one window of the time opsctl acted. A higher value, or any value after the window, is a new event.
- level (lifetime counters and latched gauges: remapped-rows-high, row-remap-failure, the last-XID
  gauge): the same or a lower value, until the rule reads ok again for that device (then the record
  is forgotten, and the next breach is a new event).

Records are written before `scontrol` runs, as an intent (`settled: false`), and settled after it.
An intent counts as handled too: a crash between the two must not turn into a re-drain after a
person resumed the node.
"""

from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

# Level records (and the last-XID gauge, which never reads ok for a code it once showed) are kept
# this long at most; window records until their window has passed.
LEVEL_KEEP_S = 90 * 86400.0


class Check(Protocol):
    """What a record needs of a health check (opsctl.health.evaluate.Check): the actor imports no feature."""

    @property
    def id(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def value(self) -> float | None: ...
    @property
    def memory(self) -> str: ...
    @property
    def window_s(self) -> float: ...


@dataclass(frozen=True)
class Handled:
    node: str
    rule: str
    device: str
    value: float
    time: float
    memory: str  # window | level
    window_s: float = 0.0
    settled: bool = False

    def covers(self, check: Check, now: float) -> bool:
        if check.value is None or check.value > self.value:
            return False
        return self.memory == "level" or now - self.time <= self.window_s

    def expired(self, now: float) -> bool:
        return now - self.time > (LEVEL_KEEP_S if self.memory == "level" else self.window_s)


def records_for(node: str, checks: Iterable[Check], now: float) -> list[Handled]:
    """Intent records for the checks of one change (only rules that have memory)."""
    return [Handled(node=node, rule=c.id, device=c.device, value=float(c.value), time=now, memory=c.memory,
                    window_s=c.window_s)
            for c in checks if c.memory in ("window", "level") and c.value is not None]


class HandledMemory:
    """The records of one run; implements opsctl.health.evaluate.Memory."""

    def __init__(self, records: Iterable[Handled] = ()):
        self.records = list(records)

    @classmethod
    def from_json(cls, raw: Any) -> "HandledMemory":
        return cls(Handled(**entry) for entry in raw)

    def to_json(self) -> list[dict[str, Any]]:
        return [asdict(r) for r in self.records]

    def covers(self, node: str, check: Check, now: float) -> bool:
        return any(r.covers(check, now) for r in self.records
                   if (r.node, r.rule, r.device) == (node, check.id, check.device))

    def add(self, records: Iterable[Handled]) -> None:
        self.records += list(records)

    def settle(self, nodes: Iterable[str]) -> None:
        done = set(nodes)
        self.records = [replace(r, settled=True) if r.node in done else r for r in self.records]

    def drop_intents(self, nodes: Iterable[str]) -> None:
        """The change was refused: there is nothing to remember for these nodes' unsettled records."""
        gone = set(nodes)
        self.records = [r for r in self.records if r.settled or r.node not in gone]

    def forget(self, keys: Iterable[tuple[str, str, str]]) -> None:
        """(node, rule, device) that read ok again: their level records end."""
        gone = set(keys)
        self.records = [r for r in self.records if not (r.memory == "level" and (r.node, r.rule, r.device) in gone)]

    def level_rules(self) -> dict[str, set[str]]:
        """rule id -> nodes with a level record (they are asked whether the rule reads ok again)."""
        out: dict[str, set[str]] = {}
        for r in self.records:
            if r.memory == "level":
                out.setdefault(r.rule, set()).add(r.node)
        return out

    def prune(self, now: float) -> None:
        self.records = [r for r in self.records if not r.expired(now)]
