"""`opsctl ib fabric-test`: ib_write_bw between the inventory's nodes, in the rounds opsctl.fabrictest.pairing
plans, a verdict per node and HCA with the measured bandwidths, and with --drain the culprits drained through
`drain_findings` (the actor, the limits of `opsctl health --drain`). The command renders the result.

Every run also adds its rail tests to the history (opsctl.fabrictest.history, kept in opsctl's state through
the ledger): from the second run on, the history's own rounds follow the run's, and the HCAs the history
names among this run's nodes are culprits too (drained with --drain, the reason saying "from history"). The
run's own verdicts stay its own. A history that cannot be read or written is a warning, and the run goes on
without it; with --drain (and no --dry-run) one that cannot be read stops the run before any test (exit 2 or 3).
`fabric_history` reads it for `opsctl ib fabric-test --history`.
"""

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from opsctl.actor.ledger import Ledger
from opsctl.actor.result import ActionResult
from opsctl.clients import Clients
from opsctl.config.schema import Config
from opsctl.errors import ExitCode, OpsctlError, SourceUnavailable, worst
from opsctl.fabrictest import history
from opsctl.fabrictest.inventory import Inventory
from opsctl.fabrictest.pairing import DEAD, GOOD, SLOW, Isolator, Measurement, RailVerdict, Test, Thresholds
from opsctl.fabrictest.runner import FabricRunner, ParamikoRemote
from opsctl.health.evaluate import Check
from opsctl.health.findings import drain_findings, failing_check, shared_cause

RULE = "ib-fabric"

Rounds = dict[tuple[str, str, int], int]  # (a, b, rail) -> the round it was measured in
# The caller's progress display: called at the start of each round with (its number, its pairs, its rail
# tests), it answers what to call after each rail test of that round.
RoundProgress = Callable[[int, int, int], Callable[[], None]]


@dataclass
class HistoryReport:
    """What the history added to a run."""

    run: int  # this run's number in the history
    runs: int  # the runs kept, this one included
    rounds: int  # the history's rounds in this run
    pair_tests: int
    culprits: list[history.Evidence]  # named by the history among this run's nodes


@dataclass
class FabricTest:
    verdicts: dict[str, dict[int, RailVerdict]]  # node -> rail -> verdict
    rounds: Rounds
    rails: list[str]  # the HCA of each rail
    rounds_run: int
    pair_tests: int
    rail_tests: int
    slow_gbps: float
    action: ActionResult  # what --drain (or --dry-run) did, refused and skipped; the breaker's stop
    exit_code: ExitCode
    history: HistoryReport | None = None  # None: the history could not be used (a warning said why)

    @property
    def passed(self) -> bool:
        return all(v.verdict == GOOD for rails in self.verdicts.values() for v in rails.values())


def fabric_test(clients: Clients, inventory: str, hosts_pattern: str | None, group: str | None, drain: bool,
                dry_run: bool, warn: Callable[[str], None], progress: RoundProgress | None = None) -> FabricTest:
    """Test the fabric between the inventory's nodes (`group`, else gpu_nodes when it has one; `hosts_pattern`
    narrows it), then drain the culprits with `drain` (`dry_run`: say what would be drained)."""
    config = clients.config(acting=drain and not dry_run)
    ib = config.ib
    inv = Inventory(Path(inventory))
    chosen = group if group is not None else ("gpu_nodes" if "gpu_nodes" in inv.groups else None)
    hosts = {h.name: h for h in inv.hosts(chosen, hosts_pattern)}
    now = time.time()
    earlier = _earlier_runs(config, now, strict=drain and not dry_run, warn=warn)
    remote = ParamikoRemote(hosts)
    try:
        _reach(remote, list(hosts))
        runner = FabricRunner(remote, hosts, list(ib.rails), ib.test_timeout_seconds, ib.parallel, warn=warn)
        isolator = Isolator(list(hosts), rails=len(ib.rails), thresholds=Thresholds(slow_gbps=ib.slow_gbps),
                            max_rounds=ib.max_rounds)
        rounds = run_rounds(isolator, runner, progress)
        pair_tests, rail_tests = sum(1 for r in runner.results if r.rail == 0), len(runner.results)
        this_run, extra = _history_rounds(earlier, isolator, runner, ib.slow_gbps, now, progress)
    finally:
        remote.close()
    verdicts = isolator.verdicts()
    found = {node: [_check(ib.rails[rail], v, ib.slow_gbps) for rail, v in rails.items()
                    if v.verdict in (SLOW, DEAD)]
             for node, rails in verdicts.items()}
    found = {node: checks for node, checks in found.items() if checks}
    named = _history_culprits(earlier, this_run, found)
    for evidence in named:
        found.setdefault(evidence.node, []).append(_history_check(evidence, ib.slow_gbps))
    # Unresolved rails count too: when a rail fails everywhere, no node can be shown good to judge the others.
    not_good = {node for node, rails in verdicts.items() if any(v.verdict != GOOD for v in rails.values())}
    stop = shared_cause(len(not_good | {e.node for e in named}), len(hosts), ib.max_fail_fraction, "the fabric test")
    action = ActionResult()
    if found and (drain or dry_run):
        drain_findings(config, clients.slurm(), found, stop, dry_run, result=action)
    elif stop:
        action.lines.append(stop)
        action.stop, action.exit_code = stop, ExitCode.SAFETY_STOP
    report = _keep(config, earlier, this_run, extra, named, [] if dry_run else action.drained, now, warn)
    result = FabricTest(verdicts=verdicts, rounds=rounds, rails=list(ib.rails), rounds_run=isolator.rounds,
                        pair_tests=pair_tests, rail_tests=rail_tests, slow_gbps=ib.slow_gbps, action=action,
                        exit_code=ExitCode.OK, history=report)
    result.exit_code = worst(ExitCode.OK if result.passed and not named else ExitCode.FAILING, action.exit_code)
    return result


# --- the history's hooks


def read_history(config: Config) -> list[history.HistoryRun]:
    """The history's runs as the state holds them; ConfigError (one line, naming the file) when it is not one."""
    store = Ledger(config).state.fabric_history
    try:
        return history.parse_runs(store.load())
    except ValueError as err:
        raise store.file.unreadable(str(err)) from None


def _earlier_runs(config: Config, now: float, strict: bool,
                  warn: Callable[[str], None]) -> list[history.HistoryRun] | None:
    """The kept runs before this one; None when the history cannot be used (`strict`: the error is raised)."""
    try:
        return history.kept(read_history(config), now)
    except OpsctlError as err:
        if strict:
            raise
        warn(f"the fabric-test history is neither used nor kept in this run: {err}")
        return None


def _history_rounds(earlier: list[history.HistoryRun] | None, isolator: Isolator, runner: FabricRunner,
                    slow_gbps: float, now: float,
                    progress: RoundProgress | None) -> tuple[history.HistoryRun, history.HistoryRounds]:
    """This run as the history keeps it (its own rounds' tests), and the history's rounds after them."""
    own = [Measurement(r.test.a, r.test.b, r.rail, r.gbps) for r in runner.results]
    this_run = history.new_run(history.next_run_id(earlier or []), now, runner.hcas, slow_gbps, own)
    if earlier is None:
        return this_run, history.HistoryRounds()
    number = [isolator.rounds]

    def on_round(tests: list[Test]) -> None:
        number[0] += 1
        if progress is not None:
            tick = progress(number[0], len(tests), len(tests) * len(runner.hcas))
            runner.on_rail = lambda _result, tick=tick: tick()

    extra = history.history_rounds(earlier, this_run, isolator.verdicts(), runner.measure, seed=this_run.run,
                                   on_round=on_round)
    kept_run = history.new_run(this_run.run, now, runner.hcas, slow_gbps, own + extra.measurements)
    return kept_run, extra


def _history_culprits(earlier: list[history.HistoryRun] | None, this_run: history.HistoryRun,
                      found: dict[str, list[Check]]) -> list[history.Evidence]:
    """The history's culprits among this run's nodes that the run did not name itself."""
    if earlier is None:
        return []
    tested = {t.node for t in this_run.tests} | {t.partner for t in this_run.tests}
    return [e for e in history.culprits(history.assess([*earlier, this_run]))
            if e.node in tested and e.hca not in {c.device for c in found.get(e.node, [])}]


def _history_check(evidence: history.Evidence, slow_gbps: float) -> Check:
    return failing_check(RULE, evidence.hca, f"{evidence.hca} from history: {evidence.words()}",
                         value=evidence.worst_gbps, threshold=slow_gbps)


def _keep(config: Config, earlier: list[history.HistoryRun] | None, this_run: history.HistoryRun,
          extra: history.HistoryRounds, named: list[history.Evidence], drained: list[str], now: float,
          warn: Callable[[str], None]) -> HistoryReport | None:
    """Append this run (with the nodes it drained, which start afresh) to the history."""
    if earlier is None:
        return None
    runs = history.kept([*earlier, replace(this_run, drained=tuple(sorted(drained)))], now)
    try:
        Ledger(config).save_fabric_history([run.to_json() for run in runs])
    except OpsctlError as err:
        warn(f"the fabric-test history was not kept: {err}")
    return HistoryReport(run=this_run.run, runs=len(runs), rounds=extra.rounds, pair_tests=extra.pair_tests,
                         culprits=named)


def fabric_history(clients: Clients) -> tuple[list[history.HistoryRun], dict[history.Key, history.Evidence]]:
    """`opsctl ib fabric-test --history`: the kept runs and each node's HCA judged on them."""
    runs = history.kept(read_history(clients.config()), time.time())
    return runs, history.assess(runs)


def _reach(remote: ParamikoRemote, names: list[str]) -> None:
    """Connect to every node first: one that cannot be reached, or whose host key is not the known one,
    stops the test before anything runs (exit 3)."""
    with ThreadPoolExecutor(max_workers=16) as pool:
        failures = [err for err in pool.map(lambda n: _try(remote, n), names) if err]
    if failures:
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise SourceUnavailable(f"fabric test not started: {failures[0]}{more}")


def _try(remote: ParamikoRemote, name: str) -> str:
    try:
        remote.run(name, "true", 30)
    except SourceUnavailable as err:
        return str(err)
    return ""


def run_rounds(isolator: Isolator, runner: FabricRunner, progress: RoundProgress | None = None) -> Rounds:
    rounds: Rounds = {}
    while tests := isolator.next_round():
        number = isolator.rounds
        if progress is not None:
            tick = progress(number, len(tests), len(tests) * len(runner.hcas))
            runner.on_rail = lambda _result, tick=tick: tick()
        measured = runner.measure(tests)
        rounds.update({(m.a, m.b, m.rail): number for m in measured})
        isolator.record(measured)
    return rounds


def _check(hca: str, verdict: RailVerdict, slow_gbps: float) -> Check:
    failed = [m for m in verdict.evidence if m.gbps < slow_gbps]
    worst_gbps = min((m.gbps for m in failed), default=0.0)
    evidence = f"{hca} {verdict.verdict} {worst_gbps:.0f} Gb/s (below {slow_gbps:g}, {len(failed)} partners)"
    return failing_check(RULE, hca, evidence, value=worst_gbps, threshold=slow_gbps)
