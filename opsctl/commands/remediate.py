"""`opsctl remediate` and `opsctl hold`: the remediation ladder after a drain (docs/remediation.md).

Exit codes: 0 the ladder's steps were made (or nothing was due), 2 usage or config error, 3 Slurm could not
be read or refused a change, or a node's BMC did not power-cycle it, 4 a safety stop (the breaker, a budget
spent, a node Slurm changed meanwhile).
With --watch a round's exit 3 or 4 is a line on stderr and the next round follows; SIGTERM ends it with 0.
"""

import json

import click

from opsctl.clients import Clients
from opsctl.commands.render import iso_time, table
from opsctl.commands.watch import watch
from opsctl.errors import ExitCode
from opsctl.ladder.plan import LadderDecision
from opsctl.ladder.remediate import RemediateResult, remediate_round
from opsctl.ladder.remediate import hold as remediate_hold


def remediate_or_watch(clients: Clients, dry_run: bool, as_json: bool, watch_s: float | None) -> ExitCode:
    if watch_s is None:
        return remediate_once(clients, dry_run, as_json)

    # A round prints what it did, each line stamped with its time (a journal tells the rounds apart); a round
    # with nothing to do prints nothing, so that a node waiting for its reboot does not fill the journal.
    def show_round(result: RemediateResult) -> None:
        stamp = iso_time()
        if as_json:
            click.echo(json.dumps(result_dict(result) | {"time": stamp}))
            return
        for line in changes_lines(result):
            click.echo(f"{stamp} {line}")
        if result.plan.stop:
            click.echo(f"{stamp} safety stop: {result.plan.stop}", err=True)

    return watch(lambda: _round(clients, dry_run), watch_s, show_round,
                 lambda line: click.echo(f"{iso_time()} {line}", err=True))


def remediate_once(clients: Clients, dry_run: bool, as_json: bool) -> ExitCode:
    result = _round(clients, dry_run)
    if as_json:
        click.echo(json.dumps(result_dict(result), indent=1))
    else:
        click.echo(render(result))
        if result.plan.stop:
            click.echo(f"safety stop: {result.plan.stop}", err=True)
    return result.exit_code


def _round(clients: Clients, dry_run: bool) -> RemediateResult:
    return remediate_round(clients, dry_run)


def result_dict(result: RemediateResult) -> dict:
    return {
        **result.action.fields(),
        "dry_run": result.dry_run,
        "nodes": [{"node": d.node, "action": _shown(d, result), "gpu": d.fault.gpu if d.fault else "",
                   "rule": d.fault.rule if d.fault else "", "reason": d.reason, "detail": d.detail,
                   "state": d.seen.state_text if d.seen else "", "made": d.node in result.made}
                  for d in result.plan.decisions],
        "dropped": [{"node": node, "why": why} for node, why in result.dropped],
        "bundles": [str(path) for path in result.bundles],
        "stop": result.plan.stop,
    }


def render(result: RemediateResult) -> str:
    if not result.plan.decisions:
        return "no node on the remediation ladder"
    rows = [("NODE", "STEP", "GPU", "RULE", "DETAIL")]
    for d in result.plan.decisions:
        rows.append((d.node, _shown(d, result), d.fault.gpu if d.fault else "-",
                     d.fault.rule if d.fault else "-", d.reason or d.detail))
    return "\n".join([table(rows), *_outcome_lines(result)])


def changes_lines(result: RemediateResult) -> list[str]:
    """The round's steps made (or, dry, that would be), refusals by Slurm and bundles, one line each."""
    made = [f"{d.node} {_shown(d, result)} {d.reason}" for d in result.plan.decisions
            if d.changes and (result.dry_run or d.node in result.made)]
    return made + _outcome_lines(result)


def _outcome_lines(result: RemediateResult) -> list[str]:
    return [f"refused {node}: {why}" for node, why in result.dropped] + [
        f"RMA bundle: {path}" for path in result.bundles]


def _shown(decision: LadderDecision, result: RemediateResult) -> str:
    return f"would-{decision.action}" if decision.changes and result.dry_run else decision.action


def hold(clients: Clients, hostlist: str, why: str, release: bool) -> ExitCode:
    for line in remediate_hold(clients, hostlist, why, release):
        click.echo(line)
    return ExitCode.OK
