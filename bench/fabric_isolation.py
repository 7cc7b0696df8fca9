"""Isolating bad HCAs with rail-aligned ib_write_bw rounds: opsctl's scheduler against two baselines.

A simulated fabric of N nodes x 8 HCAs (rails) has k bad HCAs (k = 1 or 2, placed uniformly at
random over node-rails), all of one kind:
- dead: 0 Gb/s (no link);
- half: half the rate of a healthy pair (~196 Gb/s), every test;
- intermittent: half rate with probability 0.3 in each test, healthy otherwise.

Noise model of a healthy pair-rail, from the real capture (CX-7 NDR back to back, `ib_write_bw
--report_gbits`, 65536 B: 392.34 Gb/s average, 392.38 peak; tests/fixtures/infiniband/
ib_write_bw_ib_read_bw_cx7_ndr_b2b_client.txt): 392.34 - |N(0, 1.5)| Gb/s, and with probability
1/1000 per test a transient dip to 355 +- 1.5 Gb/s, below the 360 Gb/s threshold, so that a
strategy pays for trusting one slow test. A test's value on a rail is what both ends see: a bad end
sets it (a half-rate end halves the healthy value), noise applies to every test.

Strategies, on the same faults in each trial:
- ours: opsctl.fabrictest.pairing.Isolator (defaults: max_rounds 4, clear_passes 2, thresholds 360/1);
- all-pairs: round robin by the circle method, N-1 rounds, every pair once; a node-rail is named
  bad if more than half of its tests on that rail were slow;
- random: repeated random perfect matchings (imbue's approach), 15 rounds; named bad if more than
  half of its tests on that rail were slow.
The baselines only need pass or fail per test, so they are counted without building measurements:
tests touching a bad HCA are drawn one by one, transient dips are drawn by skipping geometrically
over all (test, rail) slots.

Columns: rounds and tests (one test = one node pair, all 8 rails) are means per trial; detected is
the share of bad HCAs named with the right node and rail; false positives is the share of nodes
wrongly named (a node with at least one healthy rail named slow or dead), out of N x trials;
unknown is the mean count per trial of node-rails our scheduler left unresolved (not named).
The target for ours (dead or half-rate, k <= 2): at most 3 rounds on average, detection >= 99%,
false positives <= 0.1% of nodes.

With history (`--history`, also the last table of a full run): one intermittent HCA (k=1), and
`opsctl ib fabric-test` run again and again, each run's tests kept (opsctl.fabrictest.history: each
run's own rounds, then from the second run on the history's screening and retest rounds), until the
history or a run's own verdict names it or 7 runs have passed. Columns: named is the share of trials
that named it within 7 runs (target >= 90%); runs to name is the mean over those; tests per run is
the mean count of pair tests per run (its own rounds and the history's); false culprits is the share
of nodes wrongly named (by a run or by the history, at any run of the trial), out of N x trials
(target <= 0.1%).

Run: .venv/bin/python bench/fabric_isolation.py [--trials 1000] [--nodes 64] [--seed 0] [--history]
"""

import argparse
import math
import random
import sys
import time
import typing
from collections import Counter
from dataclasses import dataclass, field
from functools import cache

from opsctl.fabrictest import history
from opsctl.fabrictest.pairing import DEAD, SLOW, UNKNOWN, Isolator, Measurement, Test

RAILS = 8
HEALTHY_GBPS = 392.34
NOISE_SIGMA_GBPS = 1.5
DIP_RATE = 1e-3
DIP_GBPS = 355.0
INTERMITTENT_RATE = 0.3
KINDS = ("dead", "half", "intermittent")
RANDOM_ROUNDS = 15
HISTORY_RUNS = 7

Fault = tuple[int, int]  # (node index, rail)


def node_name(index: int) -> str:
    return f"gpu{index:03d}"


def place_faults(nodes: int, count: int, rng: random.Random) -> list[Fault]:
    return [divmod(slot, RAILS) for slot in rng.sample(range(nodes * RAILS), count)]


def bad_fires(kind: str, rng: random.Random) -> bool:
    """Whether a bad HCA makes this test slow."""
    return kind != "intermittent" or rng.random() < INTERMITTENT_RATE


def dip_slots(slots: int, rng: random.Random) -> list[int]:
    """The slots (of `slots` test-rails) hit by a transient dip: Bernoulli(DIP_RATE) each, drawn as gaps."""
    hits, position = [], -1
    log_miss = math.log(1.0 - DIP_RATE)
    while True:
        position += 1 + int(math.log(1.0 - rng.random()) / log_miss)
        if position >= slots:
            return hits
        hits.append(position)


# --- ours: real Measurements through the Isolator


def measure_pairs(tests: list[Test], faults: dict[tuple[str, int], str], rng: random.Random) -> list[Measurement]:
    measurements = []
    for test in tests:
        for rail in range(RAILS):
            if rng.random() < DIP_RATE:
                gbps = DIP_GBPS + rng.gauss(0.0, NOISE_SIGMA_GBPS)
            else:
                gbps = HEALTHY_GBPS - abs(rng.gauss(0.0, NOISE_SIGMA_GBPS))
            for end in (test.a, test.b):
                kind = faults.get((end, rail))
                if kind is not None and bad_fires(kind, rng):
                    gbps = min(gbps, 0.0 if kind == "dead" else gbps / 2)
            measurements.append(Measurement(test.a, test.b, rail, gbps))
    return measurements


def run_ours(nodes: int, faults: list[Fault], kind: str, rng: random.Random, seed: int,
             **options: int) -> tuple[int, int, set[Fault], int]:
    names = [node_name(i) for i in range(nodes)]
    by_name = {(node_name(node), rail): kind for node, rail in faults}
    isolator = Isolator(names, seed=seed, **options)
    tests_run = 0
    while tests := isolator.next_round():
        tests_run += len(tests)
        isolator.record(measure_pairs(tests, by_name, rng))
    named, unknown = set(), 0
    for name, rails in isolator.verdicts().items():
        for rail, verdict in rails.items():
            if verdict.verdict in (SLOW, DEAD):
                named.add((names.index(name), rail))
            elif verdict.verdict == UNKNOWN:
                unknown += 1
    return isolator.rounds, tests_run, named, unknown


# --- the baselines: pass or fail per test, counted


@cache
def circle_rounds(nodes: int) -> list[list[tuple[int, int]]]:
    """Round robin by the circle method: node 0 stays, the others rotate; with an odd count a bye."""
    players: list[int | None] = list(range(nodes)) + ([None] if nodes % 2 else [])
    rounds = []
    for _ in range(len(players) - 1):
        half = len(players) // 2
        pairs = [(players[i], players[-1 - i]) for i in range(half)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None])
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


def majority_named(rounds: list[list[tuple[int, int]]], faults: list[Fault], kind: str,
                   rng: random.Random) -> set[Fault]:
    """Node-rails slow in more than half of their tests, over the given rounds of pairs."""
    bad_rails: dict[int, set[int]] = {}
    for node, rail in faults:
        bad_rails.setdefault(node, set()).add(rail)
    slow_slots: set[tuple[int, int, int]] = set()  # (round, pair index, rail)
    for round_index, pairs in enumerate(rounds):
        for slot in dip_slots(len(pairs) * RAILS, rng):
            slow_slots.add((round_index, slot // RAILS, slot % RAILS))
        for pair_index, (a, b) in enumerate(pairs):
            if a in bad_rails or b in bad_rails:
                for rail in bad_rails.get(a, set()) | bad_rails.get(b, set()):
                    ends_bad = (rail in bad_rails.get(a, ()), rail in bad_rails.get(b, ()))
                    if any(bad and bad_fires(kind, rng) for bad in ends_bad):
                        slow_slots.add((round_index, pair_index, rail))
    slow_tests: Counter[Fault] = Counter()
    for round_index, pair_index, rail in slow_slots:
        for node in rounds[round_index][pair_index]:
            slow_tests[node, rail] += 1
    tests_of: Counter[int] = Counter(node for pairs in rounds for pair in pairs for node in pair)
    return {(node, rail) for (node, rail), slow in slow_tests.items() if slow > tests_of[node] / 2}


def random_rounds(nodes: int, count: int, rng: random.Random) -> list[list[tuple[int, int]]]:
    order = list(range(nodes))
    rounds = []
    for _ in range(count):
        rng.shuffle(order)
        rounds.append([(order[i], order[i + 1]) for i in range(0, nodes - 1, 2)])
    return rounds


# --- the table


@dataclass
class Tally:
    trials: int = 0
    rounds: int = 0
    tests: int = 0
    bad_hcas: int = 0
    detected: int = 0
    wrong_nodes: int = 0
    unknown: int = 0
    nodes: int = 0
    seconds: float = field(default=0.0)

    def add(self, nodes: int, faults: list[Fault], rounds: int, tests: int, named: set[Fault],
            unknown: int = 0) -> None:
        self.trials += 1
        self.nodes += nodes
        self.rounds += rounds
        self.tests += tests
        self.bad_hcas += len(faults)
        self.detected += len(named & set(faults))
        self.wrong_nodes += len({node for node, _ in named - set(faults)})
        self.unknown += unknown

    def row(self, setting: str, strategy: str) -> str:
        return (f"| {setting} | {strategy} | {self.rounds / self.trials:.2f} | {self.tests / self.trials:.1f} | "
                f"{100 * self.detected / self.bad_hcas:.1f} | {100 * self.wrong_nodes / self.nodes:.3f} | "
                f"{self.unknown / self.trials:.3f} |")


HEADER = ("| faults | strategy | rounds | tests | detected % | false positives % of nodes | unknown / trial |\n"
          "|---|---|---:|---:|---:|---:|---:|")


def trial_rng(seed: int, kind: str, k: int, trial: int, purpose: str) -> random.Random:
    return random.Random(f"{seed}/{kind}/{k}/{trial}/{purpose}")


def run_setting(nodes: int, kind: str, k: int, trials: int, seed: int,
                strategies: dict[str, tuple[str, dict[str, int]]]) -> dict[str, Tally]:
    """strategies: label -> ("ours", Isolator options) | ("all-pairs", {}) | ("random", {"rounds": n})."""
    tallies = {label: Tally() for label in strategies}
    for trial in range(trials):
        faults = place_faults(nodes, k, trial_rng(seed, kind, k, trial, "faults"))
        for label, (strategy, options) in strategies.items():
            started = time.perf_counter()
            rng = trial_rng(seed, kind, k, trial, label)
            if strategy == "ours":
                rounds, tests, named, unknown = run_ours(nodes, faults, kind, rng, seed + trial, **options)
                tallies[label].add(nodes, faults, rounds, tests, named, unknown)
            else:
                schedule = circle_rounds(nodes) if strategy == "all-pairs" else random_rounds(
                    nodes, options["rounds"], rng)
                named = majority_named(schedule, faults, kind, rng)
                tallies[label].add(nodes, faults, len(schedule), sum(map(len, schedule)), named)
            tallies[label].seconds += time.perf_counter() - started
    return tallies


# --- with history: runs repeated until named


@dataclass
class HistoryTally:
    trials: int = 0
    named: int = 0
    runs_to_name: int = 0
    runs: int = 0
    pair_tests: int = 0
    wrong_nodes: int = 0
    nodes: int = 0

    def row(self, setting: str) -> str:
        return (f"| {setting} | {100 * self.named / self.trials:.1f} | "
                f"{self.runs_to_name / max(1, self.named):.2f} | {self.pair_tests / self.runs:.1f} | "
                f"{100 * self.wrong_nodes / self.nodes:.3f} |")

    def met(self) -> bool:
        return self.named >= 0.9 * self.trials and self.wrong_nodes <= 0.001 * self.nodes


HISTORY_HEADER = ("| faults | named within 7 runs % | runs to name | pair tests per run | false culprits % of nodes |\n"
                  "|---|---:|---:|---:|---:|")


def history_trial(nodes: int, fault: Fault, rng: random.Random, seed: int, tally: HistoryTally) -> None:
    """Runs with history until the fault is named (by a run or the history) or HISTORY_RUNS have passed."""
    names = [node_name(i) for i in range(nodes)]
    faults = {(node_name(fault[0]), fault[1]): "intermittent"}
    hcas = [f"mlx5_{rail}" for rail in range(RAILS)]
    runs: list[history.HistoryRun] = []
    wrong: set[str] = set()
    tally.trials += 1
    tally.nodes += nodes
    for number in range(1, HISTORY_RUNS + 1):
        isolator = Isolator(names, seed=seed * 100 + number)
        own: list[Measurement] = []
        while tests := isolator.next_round():
            tally.pair_tests += len(tests)
            measured = measure_pairs(tests, faults, rng)
            isolator.record(measured)
            own += measured
        verdicts = isolator.verdicts()
        current = history.new_run(number, float(number), hcas, 360.0, own)
        extra = history.history_rounds(runs, current, verdicts, lambda t: measure_pairs(t, faults, rng),
                                       seed=seed * 100 + number)
        tally.pair_tests += extra.pair_tests
        tally.runs += 1
        runs.append(history.new_run(number, float(number), hcas, 360.0, own + extra.measurements))
        named = {(name, rail) for name, by_rail in verdicts.items() for rail, v in by_rail.items()
                 if v.verdict in (SLOW, DEAD)}
        named |= {(e.node, int(e.hca.removeprefix("mlx5_"))) for e in history.culprits(history.assess(runs))}
        wrong |= {name for name, rail in named if (name, rail) not in faults}
        if set(faults) <= named:
            tally.named += 1
            tally.runs_to_name += number
            break
    tally.wrong_nodes += len(wrong)


def run_history(nodes: int, trials: int, seed: int) -> HistoryTally:
    tally = HistoryTally()
    for trial in range(trials):
        fault = place_faults(nodes, 1, trial_rng(seed, "intermittent", 1, trial, "faults"))[0]
        history_trial(nodes, fault, trial_rng(seed, "intermittent", 1, trial, "history"), seed + trial, tally)
    return tally


def write_history(out: typing.TextIO, nodes: int, trials: int, seed: int) -> bool:
    started = time.perf_counter()
    out.write(f"## Intermittent HCA with history, N={nodes} nodes x {RAILS} rails, {trials} trials, "
              f"up to {HISTORY_RUNS} runs each\n\n{HISTORY_HEADER}\n")
    tally = run_history(nodes, trials, seed)
    out.write(tally.row("intermittent (30%), k=1") + "\n")
    out.write(f"\nTargets (named within {HISTORY_RUNS} runs >= 90%, false culprits <= 0.1% of nodes): "
              f"{'met' if tally.met() else 'NOT met'}. Took {time.perf_counter() - started:.0f} s.\n")
    return tally.met()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--trials", type=int, default=1000, help="trials per setting")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--history", action="store_true", help="only the table of runs repeated with history")
    args = parser.parse_args()
    started = time.perf_counter()
    out = sys.stdout
    if args.history:
        write_history(out, args.nodes, args.trials, args.seed)
        return
    targets_met = True

    out.write(f"## Isolating k bad HCAs, N={args.nodes} nodes x {RAILS} rails, {args.trials} trials per setting\n\n")
    out.write(HEADER + "\n")
    main_strategies: dict[str, tuple[str, dict[str, int]]] = {
        "ours": ("ours", {}),
        f"all-pairs ({args.nodes - 1 + args.nodes % 2} rounds)": ("all-pairs", {}),
        f"random ({RANDOM_ROUNDS} rounds)": ("random", {"rounds": RANDOM_ROUNDS}),
    }
    for kind in KINDS:
        for k in (1, 2):
            tallies = run_setting(args.nodes, kind, k, args.trials, args.seed, main_strategies)
            for label, tally in tallies.items():
                out.write(tally.row(f"{kind}, k={k}", label) + "\n")
            ours = tallies["ours"]
            if kind != "intermittent" and not (ours.rounds <= 3 * ours.trials and ours.detected >= 0.99 * ours.bad_hcas
                                               and ours.wrong_nodes <= 0.001 * ours.nodes):
                targets_met = False
            out.flush()

    out.write("\n## Intermittent faults: detection against rounds\n\n")
    out.write(HEADER + "\n")
    sweep: dict[str, tuple[str, dict[str, int]]] = {
        f"ours (max_rounds {r})": ("ours", {"max_rounds": r}) for r in (2, 3, 4, 6)}
    sweep |= {f"ours (screen_rounds {s}, max_rounds {s + 2})": ("ours", {"screen_rounds": s, "max_rounds": s + 2})
              for s in (3, 6)}
    sweep |= {f"random ({r} rounds)": ("random", {"rounds": r}) for r in (3, 6, 15)}
    for k in (1, 2):
        tallies = run_setting(args.nodes, "intermittent", k, args.trials, args.seed, sweep)
        for label, tally in tallies.items():
            out.write(tally.row(f"intermittent, k={k}", label) + "\n")
        out.flush()

    out.write(f"\nTargets for ours (dead or half-rate, k <= 2: rounds <= 3, detected >= 99%, false positives "
              f"<= 0.1% of nodes): {'met' if targets_met else 'NOT met'}. "
              f"Took {time.perf_counter() - started:.0f} s.\n\n")
    out.flush()
    write_history(out, args.nodes, args.trials, args.seed)


if __name__ == "__main__":
    main()
