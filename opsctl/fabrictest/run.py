"""`opsctl ib fabric-test`: ib_write_bw between the inventory's nodes, in the rounds opsctl.fabrictest.pairing
plans, a verdict per node and HCA with the measured bandwidths, and with --drain the culprits drained through
`drain_findings` (the actor, the limits of `opsctl health --drain`). The command renders the result.
"""

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from opsctl.actor.result import ActionResult
from opsctl.clients import Clients
from opsctl.errors import ExitCode, SourceUnavailable, worst
from opsctl.fabrictest.inventory import Inventory
from opsctl.fabrictest.pairing import DEAD, GOOD, SLOW, Isolator, RailVerdict, Thresholds
from opsctl.fabrictest.runner import FabricRunner, ParamikoRemote
from opsctl.health.evaluate import Check
from opsctl.health.findings import drain_findings, failing_check, shared_cause

RULE = "ib-fabric"

Rounds = dict[tuple[str, str, int], int]  # (a, b, rail) -> the round it was measured in
# The caller's progress display: called at the start of each round with (its number, its pairs, its rail
# tests), it answers what to call after each rail test of that round.
RoundProgress = Callable[[int, int, int], Callable[[], None]]


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
    remote = ParamikoRemote(hosts)
    try:
        _reach(remote, list(hosts))
        runner = FabricRunner(remote, hosts, list(ib.rails), ib.test_timeout_seconds, ib.parallel, warn=warn)
        isolator = Isolator(list(hosts), rails=len(ib.rails), thresholds=Thresholds(slow_gbps=ib.slow_gbps),
                            max_rounds=ib.max_rounds)
        rounds = run_rounds(isolator, runner, progress)
    finally:
        remote.close()
    verdicts = isolator.verdicts()
    found = {node: [_check(ib.rails[rail], v, ib.slow_gbps) for rail, v in rails.items()
                    if v.verdict in (SLOW, DEAD)]
             for node, rails in verdicts.items()}
    found = {node: checks for node, checks in found.items() if checks}
    # Unresolved rails count too: when a rail fails everywhere, no node can be shown good to judge the others.
    not_good = sum(1 for rails in verdicts.values() if any(v.verdict != GOOD for v in rails.values()))
    stop = shared_cause(not_good, len(hosts), ib.max_fail_fraction, "the fabric test")
    action = ActionResult()
    if found and (drain or dry_run):
        drain_findings(config, clients.slurm(), found, stop, dry_run, result=action)
    elif stop:
        action.lines.append(stop)
        action.stop, action.exit_code = stop, ExitCode.SAFETY_STOP
    result = FabricTest(verdicts=verdicts, rounds=rounds, rails=list(ib.rails), rounds_run=isolator.rounds,
                        pair_tests=sum(1 for r in runner.results if r.rail == 0), rail_tests=len(runner.results),
                        slow_gbps=ib.slow_gbps, action=action, exit_code=ExitCode.OK)
    result.exit_code = worst(ExitCode.OK if result.passed else ExitCode.FAILING, action.exit_code)
    return result


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
