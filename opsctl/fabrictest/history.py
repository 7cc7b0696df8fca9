"""The fabric test's history: every run's rail tests kept, and each node's HCA judged on all of them.

One run names an HCA that fails against two partners that proved themselves (opsctl.fabrictest.pairing).
An intermittent HCA (half rate in 30% of its tests) rarely fails twice in one run, so a run alone catches
it in about one run in six; over several runs it fails often enough. The history keeps the rail tests of
the last `KEEP_RUNS` runs (within `KEEP_SECONDS`), one row each (`node partner rail Gb/s pass|slow`), and
judges each node's HCA on all of them at once.

The model, per rail: each node's HCA is either healthy or bad, bad with probability `prior` before any
test. A rail test between two HCAs is slow (below the run's slow_gbps) with probability
`dip_rate` when both are healthy (a transient dip; the benchmark's noise model), and a bad end makes it
slow on its own with probability `fault_rate` (the intermittent fault: 0.3; a dead or half-rate HCA is
slow every time and is named sooner):

    P(slow | k bad ends) = 1 - (1 - dip_rate) * (1 - fault_rate) ** k

A passing test multiplies each end's odds of being bad by (1 - fault_rate), whatever the other end is. A
slow test is explained by either end, so what it says about one end depends on how likely the other end
is bad: each end's posterior is computed by belief propagation over the slow tests (each slow test sends
each end a likelihood ratio computed from the other end's posterior without that test), repeated until
the posteriors settle. So a healthy node that shared slow tests with a bad partner is cleared once the
partner is shown bad elsewhere, and a single dip names no one. A node's HCA whose posterior reaches
`culprit_posterior` is a culprit, named with the runs its evidence comes from.

The threshold: `bench/fabric_isolation.py --history` (64 nodes x 8 rails, one intermittent HCA, 1000
trials of up to 7 runs) names it within 7 runs in >= 90% of trials with <= 0.1% of nodes wrongly named
(docs/infiniband.md has the table).

How a run adds to it (opsctl.fabrictest.run), from the second run of a history on: after the run's own
rounds (whose verdicts are the run's, unchanged), one screening round pairs every node with a partner it
did not meet in this run, since an intermittent fault is found by how often it is tested; then up to
`RETEST_ROUNDS` rounds retest each suspect (posterior at least `suspect_posterior`, not yet a culprit)
against a partner that passed that rail in this run and is no suspect itself. A node that a run drained
starts afresh: its evidence from that run and before no longer counts (it was acted on; a repair would
otherwise be judged on the old HCA's tests).

Pure: no I/O. The state store is opsctl/actor/state.py's `fabric_history`, written through the ledger.
"""

import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opsctl.fabrictest.pairing import GOOD, UNKNOWN, Measurement, RailVerdict, Test

KEEP_RUNS = 30
KEEP_SECONDS = 30 * 86400.0
RETEST_ROUNDS = 4
_SWEEPS = 50  # belief propagation: enough for the few slow tests a history holds
_SETTLED = 1e-9
_MATCH_TRIES = 20


@dataclass(frozen=True)
class Model:
    prior: float = 1e-3  # a node's HCA is bad before any test
    dip_rate: float = 1e-3  # a healthy pair's rail test is slow (a transient dip)
    fault_rate: float = 0.3  # a bad end makes a rail test slow (an intermittent HCA; a dead one: always)
    culprit_posterior: float = 0.99  # named from here on
    suspect_posterior: float = 0.01  # retested in the history's rounds from here on

    def slow_given(self, bad_ends: int) -> float:
        return 1.0 - (1.0 - self.dip_rate) * (1.0 - self.fault_rate) ** bad_ends


MODEL = Model()


@dataclass(frozen=True)
class RailTest:
    """One rail of one pair test as the history keeps it."""

    node: str
    partner: str
    rail: int
    gbps: float
    passed: bool

    def row(self) -> str:
        return f"{self.node} {self.partner} {self.rail} {self.gbps:.2f} {'pass' if self.passed else 'slow'}"

    @classmethod
    def from_row(cls, row: str) -> "RailTest":
        node, partner, rail, gbps, verdict = row.split(" ")
        if verdict not in ("pass", "slow"):
            raise ValueError(f"{row!r}: pass or slow, not {verdict!r}")
        return cls(node, partner, int(rail), float(gbps), verdict == "pass")


@dataclass(frozen=True)
class HistoryRun:
    """One run's rail tests (its own rounds and the history's), and the nodes it drained."""

    run: int
    time: float
    hcas: tuple[str, ...]  # the HCA of each rail, as the run tested them
    slow_gbps: float
    tests: tuple[RailTest, ...]
    drained: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"run": self.run, "time": self.time, "hcas": list(self.hcas), "slow_gbps": self.slow_gbps,
                "tests": [t.row() for t in self.tests], "drained": list(self.drained)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "HistoryRun":
        hcas = tuple(str(h) for h in data["hcas"])
        tests = tuple(RailTest.from_row(str(row)) for row in data["tests"])
        if any(not 0 <= t.rail < len(hcas) for t in tests):
            raise ValueError(f"run {data['run']}: a rail outside its {len(hcas)} HCAs")
        return cls(run=int(data["run"]), time=float(data["time"]), hcas=hcas, slow_gbps=float(data["slow_gbps"]),
                   tests=tests, drained=tuple(str(n) for n in data.get("drained", [])))


def parse_runs(records: list[dict[str, Any]]) -> list[HistoryRun]:
    """The runs of the store's records; ValueError names the first one that is not a run."""
    runs = []
    for index, record in enumerate(records):
        try:
            runs.append(HistoryRun.from_json(record))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"record {index + 1} is not a fabric-test run ({type(err).__name__}: {err})") from None
    return runs


def kept(runs: Sequence[HistoryRun], now: float) -> list[HistoryRun]:
    """The runs the history keeps: the last KEEP_RUNS within KEEP_SECONDS."""
    return [r for r in runs if now - r.time <= KEEP_SECONDS][-KEEP_RUNS:]


def next_run_id(runs: Sequence[HistoryRun]) -> int:
    return max((r.run for r in runs), default=0) + 1


def new_run(run: int, now: float, hcas: Sequence[str], slow_gbps: float,
            measurements: Iterable[Measurement]) -> HistoryRun:
    tests = tuple(RailTest(m.a, m.b, m.rail, m.gbps, m.gbps >= slow_gbps) for m in measurements)
    return HistoryRun(run=run, time=now, hcas=tuple(hcas), slow_gbps=slow_gbps, tests=tests)


# --- the evidence


@dataclass
class Evidence:
    """A node's HCA judged on the history."""

    node: str
    hca: str
    posterior: float = 0.0
    tests: int = 0
    slow_tests: int = 0
    worst_gbps: float | None = None  # of its slow tests
    runs: list[int] = field(default_factory=list)  # the runs that tested it (since it was last drained)
    slow_runs: list[int] = field(default_factory=list)  # the runs with a slow test of it
    culprit: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "hca": self.hca, "posterior": round(self.posterior, 6), "tests": self.tests,
                "slow_tests": self.slow_tests, "runs": self.runs, "slow_runs": self.slow_runs,
                "culprit": self.culprit}

    def words(self) -> str:
        runs = ",".join(map(str, self.slow_runs))
        return f"slow in {self.slow_tests} of {self.tests} tests (runs {runs or '-'}), posterior {self.shown()}"

    def shown(self) -> str:
        """The posterior in four decimals, never rounded up to a certainty."""
        return ">0.9999" if self.posterior > 0.99995 else f"{self.posterior:.4f}"


Key = tuple[str, str]  # (node, hca)


_Variable = tuple[str, str, int]  # (node, hca, how many times the node was drained before these tests)


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x > -700 else 0.0


def assess(runs: Sequence[HistoryRun], model: Model = MODEL) -> dict[Key, Evidence]:
    """Each node's HCA (every one the kept runs tested since the node was last drained) with its posterior of
    being bad."""
    drains: dict[str, list[int]] = {}
    for index, run in enumerate(runs):
        for node in run.drained:
            drains.setdefault(node, []).append(index)

    def variable(node: str, hca: str, index: int) -> _Variable:
        # A drain starts a node afresh: its earlier tests stay a variable of their own (they still explain
        # their partners' slow tests), judged no longer.
        return node, hca, sum(1 for d in drains.get(node, ()) if d < index)

    log_odds: dict[_Variable, float] = {}
    counts: dict[_Variable, Evidence] = {}
    slows: list[tuple[_Variable, _Variable]] = []
    passed = math.log(1.0 - model.fault_rate)
    for index, run in enumerate(runs):
        for test in run.tests:
            hca = run.hcas[test.rail]
            ends = (variable(test.node, hca, index), variable(test.partner, hca, index))
            for key in ends:
                if key not in counts:
                    counts[key], log_odds[key] = Evidence(key[0], hca), _logit(model.prior)
                _count(counts[key], run.run, test)
                log_odds[key] += passed if test.passed else 0.0
            if not test.passed:
                slows.append(ends)
    settled = _propagate(log_odds, slows, model)
    evidence = {}
    for (node, hca, epoch), ev in counts.items():
        if epoch == len(drains.get(node, ())):
            ev.posterior = _sigmoid(settled[node, hca, epoch])
            ev.culprit = ev.posterior >= model.culprit_posterior
            evidence[node, hca] = ev
    return evidence


def _count(ev: Evidence, run: int, test: RailTest) -> None:
    ev.tests += 1
    if not ev.runs or ev.runs[-1] != run:
        ev.runs.append(run)
    if not test.passed:
        ev.slow_tests += 1
        ev.worst_gbps = test.gbps if ev.worst_gbps is None else min(ev.worst_gbps, test.gbps)
        if not ev.slow_runs or ev.slow_runs[-1] != run:
            ev.slow_runs.append(run)


def _propagate(base: dict[_Variable, float], slows: list[tuple[_Variable, _Variable]],
               model: Model) -> dict[_Variable, float]:
    """Belief propagation over the slow tests: each sends each end log P(slow | end bad) / P(slow | end
    healthy), with the other end bad as likely as its posterior without this test says."""
    messages = [[0.0, 0.0] for _ in slows]
    incoming: dict[_Variable, list[tuple[int, int]]] = {}
    for index, (a, b) in enumerate(slows):
        incoming.setdefault(a, []).append((index, 0))
        incoming.setdefault(b, []).append((index, 1))

    def total(key: _Variable) -> float:
        return base[key] + sum(messages[i][end] for i, end in incoming.get(key, ()))

    none, one, two = model.slow_given(0), model.slow_given(1), model.slow_given(2)
    for _ in range(_SWEEPS):
        new = []
        for index, (a, b) in enumerate(slows):
            pair = []
            for end, other in ((0, b), (1, a)):
                other_bad = _sigmoid(total(other) - messages[index][1 - end])
                pair.append(math.log((other_bad * two + (1 - other_bad) * one)
                                     / (other_bad * one + (1 - other_bad) * none)))
            new.append(pair)
        change = max((abs(n - o) for ns, os in zip(new, messages, strict=True) for n, o in zip(ns, os, strict=True)),
                     default=0.0)
        messages = new
        if change < _SETTLED:
            break
    return {key: total(key) for key in base}


def culprits(evidence: dict[Key, Evidence]) -> list[Evidence]:
    return sorted((e for e in evidence.values() if e.culprit), key=lambda e: (e.node, e.hca))


def ranked(evidence: dict[Key, Evidence]) -> list[Evidence]:
    """Culprits first, then by posterior, then by name."""
    return sorted(evidence.values(), key=lambda e: (not e.culprit, -e.posterior, e.node, e.hca))


# --- the history's rounds of a run


Measure = Callable[[list[Test]], list[Measurement]]


@dataclass
class HistoryRounds:
    rounds: int = 0
    pair_tests: int = 0
    measurements: list[Measurement] = field(default_factory=list)


def history_rounds(earlier: Sequence[HistoryRun], current: HistoryRun, verdicts: dict[str, dict[int, RailVerdict]],
                   measure: Measure, seed: int, model: Model = MODEL,
                   on_round: Callable[[list[Test]], None] | None = None) -> HistoryRounds:
    """The history's rounds of the run `current` (its own rounds' tests), after `earlier` runs: none for the
    first run of a history; else a screening round, then retests of the suspects (module docstring)."""
    done = HistoryRounds()
    if not earlier:
        return done
    nodes = sorted(verdicts)
    rng = random.Random(seed)
    met: dict[str, set[str]] = {node: set() for node in nodes}
    for kept_test in current.tests:
        met[kept_test.node].add(kept_test.partner)
        met[kept_test.partner].add(kept_test.node)
    tests = _screen(nodes, met, rng)
    round_number = 0
    while tests:
        if on_round is not None:
            on_round(tests)
        measured = measure(tests)
        done.rounds += 1
        done.pair_tests += len(tests)
        done.measurements += measured
        for pair in tests:
            met[pair.a].add(pair.b)
            met[pair.b].add(pair.a)
        round_number += 1
        if round_number > RETEST_ROUNDS:
            break
        now = new_run(current.run, current.time, current.hcas, current.slow_gbps, done.measurements)
        run = HistoryRun(current.run, current.time, current.hcas, current.slow_gbps, current.tests + now.tests)
        tests = _retests(assess([*earlier, run], model), verdicts, current.hcas, met, rng, model)
    return done


def _screen(nodes: list[str], met: dict[str, set[str]], rng: random.Random) -> list[Test]:
    """Every node with a partner it has not met in this run where possible (a few greedy shuffles)."""
    best: list[Test] = []
    best_repeats = len(nodes)
    for _ in range(_MATCH_TRIES):
        free = nodes[:]
        rng.shuffle(free)
        tests, repeats = [], 0
        while len(free) >= 2:
            node = free.pop()
            partner = next((other for other in free if other not in met[node]), None)
            if partner is None:
                partner, repeats = free[0], repeats + 1
            free.remove(partner)
            tests.append(Test(node, partner))
        if repeats < best_repeats:
            best, best_repeats = tests, repeats
        if repeats == 0:
            break
    return best


def _retests(evidence: dict[Key, Evidence], verdicts: dict[str, dict[int, RailVerdict]], hcas: Sequence[str],
             met: dict[str, set[str]], rng: random.Random, model: Model) -> list[Test]:
    """Each suspect (with the rails it is suspect on) against a new partner that passed those rails in this
    run and is no suspect on them."""
    rail_of = {hca: rail for rail, hca in enumerate(hcas)}
    doubtful: dict[str, set[int]] = {}  # node -> rails a partner must not be doubtful on
    suspects: dict[str, set[int]] = {}
    for (node, hca), ev in evidence.items():
        if node not in verdicts or hca not in rail_of or ev.posterior < model.suspect_posterior:
            continue
        rail = rail_of[hca]
        doubtful.setdefault(node, set()).add(rail)
        if not ev.culprit and verdicts[node][rail].verdict in (GOOD, UNKNOWN):
            suspects.setdefault(node, set()).add(rail)
    busy: set[str] = set()
    tests = []
    order = sorted(verdicts)
    for node in sorted(suspects, key=lambda n: -max(evidence[n, hcas[r]].posterior for r in suspects[n])):
        if node in busy:
            continue
        rng.shuffle(order)
        partner = next((p for p in order if p != node and p not in busy and p not in met[node]
                        and all(verdicts[p][r].verdict == GOOD for r in suspects[node])
                        and not doubtful.get(p, set()) & suspects[node]), None)
        if partner is not None:
            tests.append(Test(node, partner))
            busy.update((node, partner))
    return tests
