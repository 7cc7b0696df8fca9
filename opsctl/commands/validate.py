"""`opsctl validate --idle`: one sweep (opsctl.validate.sweep), then `opsctl health --drain` over the nodes it
validated, so that a failure is drained by the path every drain takes.

Exit codes: 0 every validated node passed, 1 a node failed or was not checked, 2 usage or config error,
3 Slurm or Prometheus unreadable, 4 the health run's safety stop.
"""

import json

import click

from opsctl.commands.context import Clients
from opsctl.commands.render import JSON_SCHEMA, render_json, render_table
from opsctl.errors import ExitCode, worst
from opsctl.remediation.run import RunOptions, run_health
from opsctl.validate.sweep import Sweep, run_sweep


def validate(clients: Clients, idle: bool, scope: str | None, dry_run: bool, as_json: bool) -> ExitCode:
    if not idle:
        raise click.UsageError("say what to validate: --idle (the idle GPU nodes, as Slurm jobs)")
    config = clients.config(acting=not dry_run)
    names = clients.slurm().expand(scope) if scope else None
    sweep = run_sweep(config, clients.slurm(), clients.jobs(), clients.prom(), names, dry_run)
    code = ExitCode.FAILING if any(v.result in ("fail", "not-checked") for v in sweep.nodes.values()) \
        else ExitCode.OK
    result = None
    if sweep.validated:
        options = RunOptions(drain=True, scope=",".join(sweep.validated))
        result = run_health(config, options, clients.fresh_prom(), clients.slurm())
        code = worst(code, result.exit_code)
    if as_json:
        click.echo(json.dumps({"schema": JSON_SCHEMA, "nodes": _rows(sweep),
                               "health": json.loads(render_json(result)) if result else None}, indent=1))
    else:
        for row in _rows(sweep):
            click.echo(f"{row['node']:10} {row['job'] or '-':8} {row['result']:24} {row['detail']}".rstrip())
        if result is not None:
            click.echo(render_table(result, False))
    return code


def _rows(sweep: Sweep) -> list[dict]:
    return [{"node": v.node, "job": v.job, "result": v.result, "detail": v.detail} for v in sweep.nodes.values()]
