"""Schedule rail-aligned `ib_write_bw` rounds between nodes and name the slow or dead HCAs.

Every node has `rails` HCAs (mlx5_0..mlx5_7 on an H200 node); a test pairs two nodes and runs all
rails at once, HCA i against HCA i, so one pair costs one round whatever the rail count. A pair's
value on a rail is what both ends see: a slow value says that at least one end is bad, not which.
A node takes part in at most one test per round (each HCA serves one test at a time).

Approach, round by round (`Isolator.next_round` plans, `Isolator.record` takes the results):

1. Every node is paired once (a random perfect matching). On a healthy fabric that is the whole
   run: one round, no suspects. With an odd count, the node left over is tested in round 2 against
   a node that round 1 showed good.
2. A rail below `slow_gbps` makes both ends of that rail suspects. Each suspect is retested against
   a new partner already shown good on its suspect rails, all suspects in parallel. A node is named
   bad on a rail when it fails with two different partners that vouch for themselves: each passed
   that rail with a third node and is not named bad. So a dead HCA is named in round 2, and the
   innocent end of its first test passes its retest; the failure it shared is explained by the
   partner named bad, so it is not blamed.
3. What is still open is retested the same way: both ends of a pair bad (neither could vouch for
   the other in round 2), or a failure no one explains (a noise dip, or an intermittent fault that
   passed its retest). A node-rail with an unexplained failure stays a suspect until it passes
   `clear_passes` retests after it, so an intermittent HCA gets more than one chance to fail again.

Why two partners: a single slow test cannot tell the ends apart, and a single failure of a healthy
link (a transient dip) must not name anyone. Requiring failures against two partners that proved
themselves elsewhere keeps false positives near the square of the dip rate; retesting only the
suspects keeps the rest of the fabric free. Faults that leave no good partner (a whole rail down,
two nodes only) end as `unknown`, never as a guess.

Pure: no I/O. The caller runs the tests (`isolate` with a `measure` callable, or its own loop).
"""

import random
from collections.abc import Callable
from dataclasses import dataclass, field

GOOD, SLOW, DEAD, UNKNOWN = "good", "slow", "dead", "unknown"
_MATCH_TRIES = 20


@dataclass(frozen=True)
class Test:
    """One pair of nodes; all rails run at once, HCA i of a against HCA i of b."""

    __test__ = False  # a name pytest would otherwise try to collect in the test modules that import it

    a: str
    b: str


@dataclass(frozen=True)
class Measurement:
    a: str
    b: str
    rail: int
    gbps: float  # 0.0: no link, or the test failed


@dataclass(frozen=True)
class Thresholds:
    slow_gbps: float = 360.0  # below: slow (a healthy CX-7 NDR pair averages ~392 Gb/s)
    dead_gbps: float = 1.0  # below: dead (no traffic)


@dataclass
class RailVerdict:
    verdict: str  # GOOD, SLOW, DEAD or UNKNOWN
    evidence: list[Measurement] = field(default_factory=list)  # every measurement of this node's rail


@dataclass
class _Assessment:
    """What the evidence shows so far (recomputed each round; only rails that ever failed are examined)."""

    bad: dict[tuple[str, int], list[Measurement]]  # named bad, with the failures that name it
    suspect: set[tuple[str, int]]  # a failure nobody explains, and too few passes since

    def open_rails(self, node: str) -> set[int]:
        return {rail for (other, rail) in self.suspect if other == node} | {
            rail for (other, rail) in self.bad if other == node}


def _other_end(m: Measurement, node: str) -> str:
    return m.b if m.a == node else m.a


class Isolator:
    def __init__(self, nodes: list[str], rails: int = 8, thresholds: Thresholds = Thresholds(),
                 max_rounds: int = 4, seed: int = 0, *, screen_rounds: int = 1, clear_passes: int = 2) -> None:
        """screen_rounds: rounds in which every node is tested (with a new partner) even when nothing
        failed; more than 1 only to hunt intermittent faults. clear_passes: passes after an
        unexplained failure that clear a node's rail."""
        if len(set(nodes)) != len(nodes):
            raise ValueError("node names must be unique")
        self._nodes = list(nodes)
        self._rails = rails
        self._thresholds = thresholds
        self._max_rounds = max_rounds
        self._screen_rounds = screen_rounds
        self._clear_passes = clear_passes
        self._rng = random.Random(seed)
        self._rounds = 0
        self._pending: list[Test] | None = None
        # (round, measurement) per node and rail, in the order recorded
        self._evidence: dict[tuple[str, int], list[tuple[int, Measurement]]] = {
            (node, rail): [] for node in nodes for rail in range(rails)}
        self._passed: dict[str, set[int]] = {node: set() for node in nodes}  # rails that passed at least once
        self._measured: dict[str, set[int]] = {node: set() for node in nodes}
        self._failed: set[tuple[str, int]] = set()  # node-rails that failed at least once
        self._partners: dict[str, set[str]] = {node: set() for node in nodes}

    @property
    def rounds(self) -> int:
        """Rounds handed out so far."""
        return self._rounds

    def next_round(self) -> list[Test]:
        """The tests of the next round, [] when done. Asked again before `record`, the same round."""
        if self._pending is not None:
            return list(self._pending)
        if self._rounds >= self._max_rounds:
            return []
        assessment = self._assess()
        all_rails = set(range(self._rails))
        needs = {node: (all_rails - self._measured[node]) | {rail for (other, rail) in assessment.suspect
                                                              if other == node} for node in self._nodes}
        screening = self._rounds < self._screen_rounds
        if not screening and not any(needs.values()):
            return []
        trusted = {node: self._passed[node] - assessment.open_rails(node) for node in self._nodes}
        tests = self._plan(needs, trusted, screening)
        if not tests:
            return []  # what is open has no usable partner: it stays unknown
        self._rounds += 1
        self._pending = tests
        return list(tests)

    def record(self, measurements: list[Measurement]) -> None:
        """Results of the round last handed out. A rail left out counts as not measured."""
        planned = {frozenset((test.a, test.b)) for test in self._pending or []}
        for m in measurements:
            if frozenset((m.a, m.b)) not in planned or not 0 <= m.rail < self._rails:
                raise ValueError(f"{m} is not a test of round {self._rounds}")
            for node in (m.a, m.b):
                self._evidence[node, m.rail].append((self._rounds, m))
                self._measured[node].add(m.rail)
                if self._is_pass(m):
                    self._passed[node].add(m.rail)
                else:
                    self._failed.add((node, m.rail))
        for test in self._pending or []:
            self._partners[test.a].add(test.b)
            self._partners[test.b].add(test.a)
        self._pending = None

    def verdicts(self) -> dict[str, dict[int, RailVerdict]]:
        assessment = self._assess()
        result: dict[str, dict[int, RailVerdict]] = {}
        for node in self._nodes:
            result[node] = {}
            for rail in range(self._rails):
                evidence = [m for _, m in self._evidence[node, rail]]
                if (node, rail) in assessment.bad:
                    dead = all(m.gbps < self._thresholds.dead_gbps for m in assessment.bad[node, rail])
                    verdict = DEAD if dead else SLOW
                elif (node, rail) in assessment.suspect or rail not in self._passed[node]:
                    verdict = UNKNOWN
                else:
                    verdict = GOOD
                result[node][rail] = RailVerdict(verdict, evidence)
        return result

    # --- the evidence

    def _is_pass(self, m: Measurement) -> bool:
        return m.gbps >= self._thresholds.slow_gbps

    def _vouches(self, partner: str, rail: int, against: str, excluded: set[tuple[str, int]]) -> bool:
        """Whether partner's rail passed with a node other than `against`, and is not excluded (named bad)."""
        if (partner, rail) in excluded or rail not in self._passed[partner]:
            return False
        return any(self._is_pass(m) and against not in (m.a, m.b) for _, m in self._evidence[partner, rail])

    def _named_bad(self, excluded: set[tuple[str, int]]) -> dict[tuple[str, int], list[Measurement]]:
        """Node-rails that failed against two different partners that vouch for themselves."""
        result = {}
        for node, rail in self._failed:
            counted = [m for _, m in self._evidence[node, rail] if not self._is_pass(m)
                       and self._vouches(_other_end(m, node), rail, node, excluded)]
            if len({_other_end(m, node) for m in counted}) >= 2:
                result[node, rail] = counted
        return result

    def _assess(self) -> _Assessment:
        # Twice: the second pass no longer lets a partner named bad in the first vouch, so a healthy
        # node that met two intermittent (once passing) partners is not named with them.
        bad = self._named_bad(set(self._named_bad(set())))
        suspect = set()
        for node, rail in self._failed - bad.keys():
            evidence = self._evidence[node, rail]
            unexplained = [round_ for round_, m in evidence if not self._is_pass(m)
                           and (_other_end(m, node), rail) not in bad]
            if unexplained:
                passes_since = sum(1 for round_, m in evidence if self._is_pass(m) and round_ > max(unexplained))
                if passes_since < self._clear_passes:
                    suspect.add((node, rail))
        return _Assessment(bad, suspect)

    # --- the plan

    def _plan(self, needs: dict[str, set[int]], trusted: dict[str, set[int]], screening: bool) -> list[Test]:
        busy: set[str] = set()
        tests: list[Test] = []
        order = self._nodes[:]
        self._rng.shuffle(order)
        # Reference partners: nodes with nothing open first, so suspects meet proven nodes.
        candidates = sorted(order, key=lambda node: bool(needs[node]))
        # Suspects first (they were tested and failed), then nodes never tested.
        needers = sorted((node for node in order if needs[node]), key=lambda node: not self._partners[node])
        for node in needers:
            if node in busy:
                continue
            for partner in candidates:
                if (partner != node and partner not in busy and partner not in self._partners[node]
                        and needs[node] <= trusted[partner] and needs[partner] <= trusted[node]):
                    tests.append(Test(node, partner))
                    busy.update((node, partner))
                    break
        # Nodes never tested with no proven partner (round 1: all of them) are paired among themselves.
        untested = [node for node in needers if node not in busy and not self._partners[node]]
        tests.extend(self._match(untested, busy))
        # No proven partner at all (a small fabric): any new partner still adds a view of the rail; a
        # failure against it counts only once that partner has vouched for itself elsewhere.
        tests.extend(self._match([node for node in needers if node not in busy], busy, new_only=True))
        if screening:
            tests.extend(self._match([node for node in order if node not in busy], busy))
        return tests

    def _match(self, nodes: list[str], busy: set[str], new_only: bool = False) -> list[Test]:
        """Pair nodes two by two with new partners where possible (with `new_only`, only new ones).
        Greedy on a few shuffles: enough for the handful of rounds a run takes."""
        best: list[Test] = []
        best_repeats = len(nodes)
        for _ in range(_MATCH_TRIES):
            free = nodes[:]
            self._rng.shuffle(free)
            tests, repeats = [], 0
            while len(free) >= 2:
                node = free.pop(0)
                partner = next((other for other in free if other not in self._partners[node]), None)
                if partner is None:
                    if new_only:
                        continue
                    partner, repeats = free[0], repeats + 1
                free.remove(partner)
                tests.append(Test(node, partner))
            if (repeats, -len(tests)) < (best_repeats, -len(best)):
                best, best_repeats = tests, repeats
            if repeats == 0 and len(tests) == len(nodes) // 2:
                break
        busy.update(node for test in best for node in (test.a, test.b))
        return best


def isolate(nodes: list[str], measure: Callable[[list[Test]], list[Measurement]], rails: int = 8,
            thresholds: Thresholds = Thresholds(), max_rounds: int = 4, *,
            seed: int = 0) -> tuple[dict[str, dict[int, RailVerdict]], int]:
    """Drive an Isolator to the end with `measure` (runs one round's tests, returns every rail's value)."""
    isolator = Isolator(nodes, rails, thresholds, max_rounds, seed)
    while tests := isolator.next_round():
        isolator.record(measure(tests))
    return isolator.verdicts(), isolator.rounds
