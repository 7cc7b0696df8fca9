"""`opsctl ib fabric-test`: ib_write_bw between the inventory's nodes (opsctl.fabrictest.run), a verdict per
node and HCA with the measured bandwidths, and with --drain the culprits drained; this renders it, with a
progress bar on a terminal.

Exit codes: 0 every rail good, 1 slow, dead or unresolved rails, 2 usage or config error, 3 a node could
not be reached (nothing tested), 4 a safety stop: too many nodes fail at once (the fabric is at fault),
or a limit of `opsctl health --drain` (budget, out-of-service, the lock held).

After the report, the run's figures go to node_exporter's textfile directory (beside metrics.textfile, when it
is set; opsctl.fabrictest.textfile) and, with --html/--svg/--png, into the picture of the rails x nodes grid
(opsctl.fabrictest.picture); a picture file that cannot be written is a usage error (exit 2).

A run also reports what its history added (opsctl.fabrictest.history: the history's rounds, the culprits it
names; a culprit of the history makes the exit code 1 too). `--history` tests nothing and shows each node's
HCA judged on the kept runs, culprits first: exit 0 with no culprit, 1 with culprits, 2 when the history
cannot be read.
"""

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from opsctl.clients import Clients
from opsctl.commands.render import JSON_SCHEMA
from opsctl.errors import ExitCode
from opsctl.fabrictest.history import MODEL, Evidence, HistoryRun, ranked
from opsctl.fabrictest.pairing import DEAD, GOOD, SLOW, UNKNOWN, RailVerdict
from opsctl.fabrictest.picture import png_renderer
from opsctl.fabrictest.publish import publish
from opsctl.fabrictest.run import FabricTest, HistoryReport, Rounds, fabric_history
from opsctl.fabrictest.run import fabric_test as run_fabric_test

_RANK = {GOOD: 0, UNKNOWN: 1, SLOW: 2, DEAD: 3}


def fabric_test(clients: Clients, inventory: str, hosts_pattern: str | None, group: str | None, as_json: bool,
                drain: bool, dry_run: bool, html: str | None = None, svg: str | None = None,
                png: str | None = None) -> ExitCode:
    if png:
        png_renderer()  # a missing renderer is said before the test, not after minutes of it
    bar = ProgressBar() if not as_json and sys.stderr.isatty() else None
    try:
        result = run_fabric_test(clients, inventory, hosts_pattern, group, drain, dry_run,
                                 warn=lambda line: click.echo(f"opsctl: warning: {line}", err=True),
                                 progress=bar.round if bar is not None else None)
    finally:
        if bar is not None:
            bar.stop()
    click.echo(json.dumps(_json(result), indent=1) if as_json else _table(result))
    _publish(clients, result, html, svg, png)
    return result.exit_code


def _publish(clients: Clients, result: FabricTest, html: str | None, svg: str | None, png: str | None) -> None:
    """The run's figures: metrics for the dashboard, and the pictures asked for."""
    publish(clients.config(), result, html, svg, png,
            warn=lambda line: click.echo(f"opsctl: warning: {line}", err=True))


class ProgressBar:
    """rich's progress bar on stderr, a task per round; started at the first round, so that nothing shows while
    the nodes are reached."""

    def __init__(self) -> None:
        self._progress: Any = None

    def round(self, number: int, pairs: int, rail_tests: int) -> Callable[[], None]:
        if self._progress is None:
            from rich.console import Console
            from rich.progress import Progress

            self._progress = Progress(console=Console(stderr=True), transient=True)
            self._progress.start()
        progress = self._progress
        task = progress.add_task(f"round {number}: {pairs} pairs", total=rail_tests)
        return lambda: progress.advance(task)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def _node_verdict(rails: dict[int, RailVerdict]) -> str:
    return max((v.verdict for v in rails.values()), key=_RANK.__getitem__, default=GOOD)


def _measurements(node: str, verdict: RailVerdict, rounds: Rounds) -> list[dict[str, Any]]:
    return [{"peer": m.b if m.a == node else m.a, "round": rounds.get((m.a, m.b, m.rail)), "gbps": round(m.gbps, 2)}
            for m in verdict.evidence]


def _summary(result: FabricTest) -> dict[str, Any]:
    return {"rounds": result.rounds_run, "pair_tests": result.pair_tests, "rail_tests": result.rail_tests,
            "slow_gbps": result.slow_gbps}


def _json(result: FabricTest) -> dict[str, Any]:
    rails, rounds = result.rails, result.rounds
    nodes: list[dict[str, Any]] = []
    culprits: list[dict[str, str]] = []
    for node, by_rail in sorted(result.verdicts.items()):
        hcas = [{"hca": rails[rail], "rail": rail, "verdict": v.verdict, "measurements": _measurements(node, v, rounds)}
                for rail, v in sorted(by_rail.items())]
        culprits += [{"node": node, "hca": rails[rail], "verdict": v.verdict} for rail, v in sorted(by_rail.items())
                     if v.verdict in (SLOW, DEAD)]
        nodes.append({"node": node, "verdict": _node_verdict(by_rail), "hcas": hcas})
    passed = all(n["verdict"] == GOOD for n in nodes)
    return {"schema": JSON_SCHEMA, **_summary(result), "verdict": "pass" if passed else "fail", "culprits": culprits,
            "nodes": nodes, "actions": result.action.lines, "stop": result.action.stop, **result.action.fields(),
            "history": _run_history_json(result.history)}


def _table(result: FabricTest) -> str:
    rails, rounds = result.rails, result.rounds
    lines = []
    for node, by_rail in sorted(result.verdicts.items()):
        bad = [(rail, v) for rail, v in sorted(by_rail.items()) if v.verdict != GOOD]
        detail = "; ".join(f"{rails[rail]} {v.verdict}: " + ", ".join(
            f"{m['gbps']:.1f} vs {m['peer']} (round {m['round']})" for m in _measurements(node, v, rounds))
            for rail, v in bad)
        lines.append(f"{node:12} {_node_verdict(by_rail):8} {detail}".rstrip())
    report = result.history
    lines += [f"{e.node:12} history  {e.hca} {e.words()}" for e in (report.culprits if report else [])]
    lines += result.action.lines
    lines.append(f"rounds: {result.rounds_run}, pair tests: {result.pair_tests} ({result.rail_tests} rail "
                 f"tests), slow below {result.slow_gbps:g} Gb/s")
    if report is not None:
        lines.append(f"history: run {report.run} ({report.runs} kept), its own rounds: {report.rounds} "
                     f"({report.pair_tests} pair tests), culprits: {len(report.culprits)}")
    return "\n".join(lines)


# --- the history


def _run_history_json(report: HistoryReport | None) -> dict[str, Any] | None:
    if report is None:
        return None
    return {"run": report.run, "runs": report.runs, "rounds": report.rounds, "pair_tests": report.pair_tests,
            "culprits": [e.to_json() for e in report.culprits]}


def history(clients: Clients, as_json: bool) -> ExitCode:
    """`opsctl ib fabric-test --history`."""
    runs, evidence = fabric_history(clients)
    judged = ranked(evidence)
    click.echo(json.dumps(_history_json(runs, judged), indent=1) if as_json else _history_table(runs, judged))
    return ExitCode.FAILING if any(e.culprit for e in judged) else ExitCode.OK


def _history_json(runs: list[HistoryRun], judged: list[Evidence]) -> dict[str, Any]:
    return {"schema": JSON_SCHEMA, "culprit_posterior": MODEL.culprit_posterior,
            "runs": [{"run": r.run, "time": r.time, "rail_tests": len(r.tests), "drained": list(r.drained)}
                     for r in runs],
            "culprits": [{"node": e.node, "hca": e.hca, "posterior": round(e.posterior, 6)}
                         for e in judged if e.culprit],
            "evidence": [e.to_json() for e in judged]}


def _history_table(runs: list[HistoryRun], judged: list[Evidence]) -> str:
    if not runs:
        return "fabric-test history: no run kept yet"
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(runs[0].time))
    lines = [f"fabric-test history: {len(runs)} runs kept (runs {runs[0].run}-{runs[-1].run}, since {when}); "
             f"a culprit from posterior {MODEL.culprit_posterior:g}",
             f"{'node':12} {'hca':8} {'verdict':8} {'posterior':>9} {'tests':>5} {'slow':>4}  slow in runs"]
    shown = [e for e in judged if e.culprit or e.slow_tests]
    for e in shown:
        verdict = "culprit" if e.culprit else "suspect" if e.posterior >= MODEL.suspect_posterior else "clear"
        lines.append(f"{e.node:12} {e.hca:8} {verdict:8} {e.shown():>9} {e.tests:5} {e.slow_tests:4}  "
                     f"{','.join(map(str, e.slow_runs)) or '-'}")
    clean = len(judged) - len(shown)
    if clean:
        top = max((e.posterior for e in judged if not (e.culprit or e.slow_tests)), default=0.0)
        lines.append(f"{clean} other node HCAs passed every test (posterior at most {top:.4f})")
    return "\n".join(lines)
