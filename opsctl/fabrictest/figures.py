"""The figures of one fabric test run per node and rail, what the picture (opsctl.fabrictest.picture) draws and
the textfile (opsctl.fabrictest.textfile) exports, and the colour scale both the picture and its legend use.

A node's rail has one figure, its measured bandwidth, chosen from its measurements (RailVerdict.evidence, in
the order they were taken) so that it says what the verdict says:

- a culprit (slow or dead): its worst measurement below `slow_gbps`, the value its drain reason names;
- any other rail: its last measurement against a partner not named on that rail, since a test reports the
  slower end and a failure the named partner explains is not this node's (the reference partners of a culprit
  would otherwise look slow); without such a partner, its last measurement;
- a rail never measured: None, drawn grey as "not tested".

The scale diverges around the slow threshold: from red (dead, below `dead_gbps`) through amber (half the
expected rate) to yellow just below `slow_gbps`, and from light green at `slow_gbps` to green at the expected
rate (the port's rate, hardware.ib_rate_bytes_per_second). A passing rail is never drawn in a failing colour.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

from opsctl.fabrictest.pairing import DEAD, SLOW, Measurement, RailVerdict, Thresholds
from opsctl.fabrictest.run import FabricTest

NOT_TESTED = "#bdbdbd"
RED = "#d73027"
AMBER = "#fdae61"
YELLOW = "#fee08b"
LIGHT_GREEN = "#a6d96a"
GREEN = "#1a9850"
CULPRITS = (SLOW, DEAD)


@dataclass(frozen=True)
class RailFigure:
    """One cell of the rails x nodes grid."""

    node: str
    rail: int
    hca: str
    gbps: float | None  # None: never measured
    verdict: str  # good, slow, dead or unknown
    measurements: int

    @property
    def culprit(self) -> bool:
        return self.verdict in CULPRITS


@dataclass(frozen=True)
class PastRun:
    """An earlier run's figures, for the picture's history strip: `label` names the run (its time), `gbps`
    holds (node, rail) -> Gb/s of each rail it measured (a rail left out was not tested in that run), and
    `culprits` the (node, rail) it named slow or dead."""

    label: str
    gbps: Mapping[tuple[str, int], float]
    culprits: frozenset[tuple[str, int]] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Scale:
    """Colours by bandwidth against the expected rate (Gb/s)."""

    expected_gbps: float
    slow_gbps: float
    dead_gbps: float = Thresholds().dead_gbps

    def colour(self, gbps: float | None) -> str:
        if gbps is None:
            return NOT_TESTED
        if gbps < self.dead_gbps:
            return RED
        if gbps >= self.slow_gbps:
            span = self.expected_gbps - self.slow_gbps
            return mix(LIGHT_GREEN, GREEN, (gbps - self.slow_gbps) / span if span > 0 else 1.0)
        half = self.expected_gbps / 2
        if gbps <= half:
            return mix(RED, AMBER, (gbps - self.dead_gbps) / (half - self.dead_gbps) if half > self.dead_gbps else 1.0)
        return mix(AMBER, YELLOW, (gbps - half) / (self.slow_gbps - half))

    def legend(self) -> list[tuple[float | None, str]]:
        """The legend's swatches: (value, label), from dead to full rate, then not tested."""
        half, slow, full = self.expected_gbps / 2, self.slow_gbps, self.expected_gbps
        below = max(self.dead_gbps, slow - 1)
        return [(0.0, "0 dead"), (half / 2, f"{half / 2:.0f}"), (half, f"{half:.0f} half"),
                (below, f"<{slow:g} slow"), (slow, f"{slow:g}"), (full, f"{full:.0f} full"), (None, "not tested")]


def mix(low: str, high: str, t: float) -> str:
    """The colour a fraction `t` (clamped to 0..1) of the way from `low` to `high` (#rrggbb)."""
    t = min(1.0, max(0.0, t))
    a, b = rgb(low), rgb(high)
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(a, b, strict=True))


def rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def figures(result: FabricTest) -> list[RailFigure]:
    """Every node's every rail, nodes in natural order (gpu2 before gpu10), rails in order."""
    culprits = {(node, rail) for node, rails in result.verdicts.items() for rail, v in rails.items()
                if v.verdict in CULPRITS}
    found = []
    for node in sorted(result.verdicts, key=natural_key):
        for rail, verdict in sorted(result.verdicts[node].items()):
            gbps = _figure(node, rail, verdict, culprits, result.slow_gbps)
            found.append(RailFigure(node, rail, result.rails[rail], gbps, verdict.verdict, len(verdict.evidence)))
    return found


def _figure(node: str, rail: int, verdict: RailVerdict, culprits: set[tuple[str, int]],
            slow_gbps: float) -> float | None:
    if not verdict.evidence:
        return None
    if verdict.verdict in CULPRITS:
        return min((m.gbps for m in verdict.evidence if m.gbps < slow_gbps), default=verdict.evidence[-1].gbps)
    own = [m for m in verdict.evidence if (_partner(m, node), rail) not in culprits]
    return (own or verdict.evidence)[-1].gbps


def _partner(m: Measurement, node: str) -> str:
    return m.b if m.a == node else m.a


def natural_key(name: str) -> tuple[tuple[int, str], ...]:
    """gpu2 < gpu10: digits compare as numbers."""
    parts: list[tuple[int, str]] = []
    digits = ""
    for char in name + "\0":
        if char.isdigit():
            digits += char
            continue
        if digits:
            parts.append((int(digits), ""))
            digits = ""
        if char != "\0":
            parts.append((-1, char))
    return tuple(parts)
