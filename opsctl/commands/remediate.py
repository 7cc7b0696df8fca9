"""`opsctl remediate` and `opsctl hold`: the remediation ladder after a drain (docs/remediation.md).

Exit codes: 0 the ladder's steps were made (or nothing was due), 2 usage or config error, 3 Slurm could not
be read or refused a change, 4 a safety stop (the breaker, a budget spent, a node Slurm changed meanwhile).
"""

import json

import click

from opsctl.commands.context import Clients
from opsctl.commands.render import table
from opsctl.errors import ExitCode
from opsctl.remediation.ladder_plan import LadderDecision
from opsctl.remediation.remediate import RemediateResult, remediate, set_hold


def remediate_once(clients: Clients, dry_run: bool, as_json: bool) -> ExitCode:
    result = remediate(clients.config(acting=not dry_run), clients.slurm(), dry_run)
    if as_json:
        click.echo(json.dumps(result_dict(result), indent=1))
    else:
        click.echo(render(result))
        if result.plan.stop:
            click.echo(f"safety stop: {result.plan.stop}", err=True)
    return result.exit_code


def result_dict(result: RemediateResult) -> dict:
    return {
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
    lines = [table(rows)]
    lines += [f"refused {node}: {why}" for node, why in result.dropped]
    lines += [f"RMA bundle: {path}" for path in result.bundles]
    return "\n".join(lines)


def _shown(decision: LadderDecision, result: RemediateResult) -> str:
    return f"would-{decision.action}" if decision.changes and result.dry_run else decision.action


def hold(clients: Clients, hostlist: str, why: str, release: bool) -> ExitCode:
    names = clients.slurm().expand(hostlist)
    for line in set_hold(clients.config(acting=True), clients.slurm(), names, " ".join(why.split()), release):
        click.echo(line)
    return ExitCode.OK
