"""`opsctl ib fabric-test`: ib_write_bw between the inventory's nodes, in the rounds opsctl.fabrictest.pairing
plans, a verdict per node and HCA with the measured bandwidths, and with --drain the culprits drained.

Exit codes: 0 every rail good, 1 slow, dead or unresolved rails, 2 usage or config error, 3 a node could
not be reached (nothing tested), 4 a safety stop: too many nodes fail at once (the fabric is at fault),
or a limit of `opsctl health --drain` (budget, out-of-service, the lock held).
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click

from opsctl.clients import Clients
from opsctl.commands.render import JSON_SCHEMA
from opsctl.errors import ExitCode, SourceUnavailable, worst
from opsctl.fabrictest.inventory import Inventory
from opsctl.fabrictest.pairing import DEAD, GOOD, SLOW, UNKNOWN, Isolator, RailVerdict, Thresholds
from opsctl.fabrictest.runner import FabricRunner, ParamikoRemote
from opsctl.health.evaluate import Check
from opsctl.health.findings import drain_findings, failing_check, shared_cause
from opsctl.actor.result import ActionResult

RULE = "ib-fabric"
_RANK = {GOOD: 0, UNKNOWN: 1, SLOW: 2, DEAD: 3}


def fabric_test(clients: Clients, inventory: str, hosts_pattern: str | None, group: str | None, as_json: bool,
                drain: bool, dry_run: bool) -> ExitCode:
    config = clients.config(acting=drain and not dry_run)
    ib = config.ib
    inv = Inventory(Path(inventory))
    chosen = group if group is not None else ("gpu_nodes" if "gpu_nodes" in inv.groups else None)
    hosts = {h.name: h for h in inv.hosts(chosen, hosts_pattern)}
    remote = ParamikoRemote(hosts)
    try:
        _reach(remote, list(hosts))
        runner = FabricRunner(remote, hosts, list(ib.rails), ib.test_timeout_seconds, ib.parallel,
                              warn=lambda line: click.echo(f"opsctl: warning: {line}", err=True))
        isolator = Isolator(list(hosts), rails=len(ib.rails), thresholds=Thresholds(slow_gbps=ib.slow_gbps),
                            max_rounds=ib.max_rounds)
        rounds = _run_rounds(isolator, runner, show_progress=not as_json and sys.stderr.isatty())
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
    actions = ActionResult()
    if found and (drain or dry_run):
        actions = drain_findings(config, clients.slurm(), found, stop, dry_run)
    elif stop:
        actions.lines.append(stop)
        actions.stop, actions.exit_code = stop, ExitCode.SAFETY_STOP
    code = ExitCode.OK if all(v.verdict == GOOD for r in verdicts.values() for v in r.values()) else ExitCode.FAILING
    summary = {"rounds": isolator.rounds, "pair_tests": sum(1 for r in runner.results if r.rail == 0),
               "rail_tests": len(runner.results), "slow_gbps": ib.slow_gbps}
    if as_json:
        click.echo(json.dumps(_json(verdicts, rounds, list(ib.rails), summary, actions), indent=1))
    else:
        click.echo(_table(verdicts, rounds, list(ib.rails), summary, actions))
    return worst(code, actions.exit_code)


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


Rounds = dict[tuple[str, str, int], int]  # (a, b, rail) -> the round it was measured in


def _run_rounds(isolator: Isolator, runner: FabricRunner, show_progress: bool) -> Rounds:
    rounds: Rounds = {}
    progress = None
    if show_progress:
        from rich.console import Console
        from rich.progress import Progress

        progress = Progress(console=Console(stderr=True), transient=True)
        progress.start()
    try:
        while tests := isolator.next_round():
            number = isolator.rounds
            if progress is not None:
                task = progress.add_task(f"round {number}: {len(tests)} pairs", total=len(tests) * len(runner.hcas))
                runner.on_rail = lambda _result, task=task: progress.advance(task)
            measured = runner.measure(tests)
            rounds.update({(m.a, m.b, m.rail): number for m in measured})
            isolator.record(measured)
    finally:
        if progress is not None:
            progress.stop()
    return rounds


def _check(hca: str, verdict: RailVerdict, slow_gbps: float) -> Check:
    failed = [m for m in verdict.evidence if m.gbps < slow_gbps]
    worst_gbps = min((m.gbps for m in failed), default=0.0)
    evidence = f"{hca} {verdict.verdict} {worst_gbps:.0f} Gb/s (below {slow_gbps:g}, {len(failed)} partners)"
    return failing_check(RULE, hca, evidence, value=worst_gbps, threshold=slow_gbps)


def _node_verdict(rails: dict[int, RailVerdict]) -> str:
    return max((v.verdict for v in rails.values()), key=_RANK.__getitem__, default=GOOD)


def _measurements(node: str, verdict: RailVerdict, rounds: Rounds) -> list[dict[str, Any]]:
    return [{"peer": m.b if m.a == node else m.a, "round": rounds.get((m.a, m.b, m.rail)), "gbps": round(m.gbps, 2)}
            for m in verdict.evidence]


def _json(verdicts: dict[str, dict[int, RailVerdict]], rounds: Rounds, rails: list[str], summary: dict[str, Any],
          actions: ActionResult) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = []
    culprits: list[dict[str, str]] = []
    for node, by_rail in sorted(verdicts.items()):
        hcas = [{"hca": rails[rail], "rail": rail, "verdict": v.verdict, "measurements": _measurements(node, v, rounds)}
                for rail, v in sorted(by_rail.items())]
        culprits += [{"node": node, "hca": rails[rail], "verdict": v.verdict} for rail, v in sorted(by_rail.items())
                     if v.verdict in (SLOW, DEAD)]
        nodes.append({"node": node, "verdict": _node_verdict(by_rail), "hcas": hcas})
    passed = all(n["verdict"] == GOOD for n in nodes)
    return {"schema": JSON_SCHEMA, **summary, "verdict": "pass" if passed else "fail", "culprits": culprits,
            "nodes": nodes, "actions": actions.lines, "stop": actions.stop}


def _table(verdicts: dict[str, dict[int, RailVerdict]], rounds: Rounds, rails: list[str], summary: dict[str, Any],
           actions: ActionResult) -> str:
    lines = []
    for node, by_rail in sorted(verdicts.items()):
        bad = [(rail, v) for rail, v in sorted(by_rail.items()) if v.verdict != GOOD]
        detail = "; ".join(f"{rails[rail]} {v.verdict}: " + ", ".join(
            f"{m['gbps']:.1f} vs {m['peer']} (round {m['round']})" for m in _measurements(node, v, rounds))
            for rail, v in bad)
        lines.append(f"{node:12} {_node_verdict(by_rail):8} {detail}".rstrip())
    lines += actions.lines
    lines.append(f"rounds: {summary['rounds']}, pair tests: {summary['pair_tests']} ({summary['rail_tests']} rail "
                 f"tests), slow below {summary['slow_gbps']:g} Gb/s")
    return "\n".join(lines)

