"""The output layer of `opsctl health`, `nodes`, `drain`, `resume`, `history` and `rules`.

opsctl/cli.py parses the arguments and calls one function here with the Clients of the invocation;
each calls the core, echoes the rendered result and returns the exit code.
"""

import json

import click

from opsctl.commands.changes import ChangeLog, run_kind
from opsctl.commands.context import Clients
from opsctl.commands.dashboards import gpu_dashboard
from opsctl.commands.exit import error_json
from opsctl.commands.render import iso_time, render_history, render_json, render_nodes, render_table
from opsctl.commands.watch import PASSING, watch
from opsctl.errors import ConfigError, ExitCode, OpsctlError
from opsctl.health.catalog import load_catalog
from opsctl.health.export import render_prometheus_rules
from opsctl.metrics import RunRecorder
from opsctl.metrics.alerts import system_alerts
from opsctl.prom.client import redact
from opsctl.remediation.audit import AuditLog
from opsctl.remediation.manual import manual_drain, manual_resume
from opsctl.remediation.run import RunOptions, RunResult, run_health
from opsctl.remediation.state import StateDir


def health(clients: Clients, drain: bool, dry_run: bool, resume: bool, as_json: bool, watch_s: float | None,
           all_nodes: bool, scope: str | None = None, changes_only: bool = False) -> ExitCode:
    if changes_only and (as_json or all_nodes):
        raise ConfigError("--changes-only prints what changed since the last run, not every node: "
                          "leave out --json and --all")
    config = clients.config(acting=(drain or resume) and not dry_run)
    recorder = RunRecorder(config.metrics, serve=watch_s is not None, warn=lambda line: click.echo(line, err=True))
    changes = ChangeLog(StateDir(config.state_dir), run_kind(drain, resume, dry_run, scope)) if changes_only else None

    @recorder.wrap
    def once() -> RunResult:
        if changes is not None:
            changes.read()
        options = RunOptions(drain=drain, resume=resume, dry_run=dry_run, scope=scope)
        return run_health(config, options, clients.fresh_prom(), clients.slurm())

    def show(result: RunResult) -> None:
        if changes is not None:
            click.echo(changes.render(result))  # first what happened, then the record: a full disk loses no line
            changes.keep(result)
            return
        click.echo(render_json(result) if as_json else render_table(result, all_nodes))

    if watch_s is None:
        result = once()
        show(result)
        return result.exit_code

    # Every --watch line starts with the time of its round (the JSON carries it in summary.time), so a
    # journal or a terminal scrollback tells the rounds apart.
    def show_round(result: RunResult) -> None:
        if as_json or changes is not None:
            show(result)
            return
        stamp = iso_time(result.started)
        click.echo("\n".join(f"{stamp} {line}" for line in render_table(result, all_nodes).splitlines()))

    def once_or_json_error() -> RunResult:
        try:
            return once()
        except OpsctlError as err:
            if as_json and err.exit_code in PASSING:
                click.echo(error_json(redact(str(err)), err.exit_code, getattr(err, "done", []), time=iso_time()))
            raise

    recorder.start()
    return watch(once_or_json_error, watch_s, show_round, lambda line: click.echo(f"{iso_time()} {line}", err=True))


def nodes(clients: Clients, as_json: bool) -> ExitCode:
    found = clients.slurm().nodes()
    if as_json:
        click.echo(json.dumps([{"node": n.name, "state": n.state, "flags": list(n.flags), "reason": n.reason,
                                "owner": n.owner, "partitions": list(n.partitions)} for n in found.values()],
                              indent=1))
    else:
        click.echo(render_nodes(found))
    return ExitCode.OK


def drain(clients: Clients, hostlist: str, reason: str) -> ExitCode:
    code, lines = manual_drain(clients.config(acting=True), clients.slurm(), hostlist, reason)
    for line in lines:
        click.echo(line, err=line.startswith("refused"))
    return code


def resume(clients: Clients, hostlist: str, force: bool) -> ExitCode:
    code, lines = manual_resume(clients.config(acting=True), clients.slurm(), hostlist, force)
    for line in lines:
        click.echo(line, err=line.startswith("refused"))
    return code


def history(clients: Clients, node: str | None, limit: int, as_json: bool) -> ExitCode:
    records, warnings = AuditLog(clients.config().audit_log).read(node=node, limit=limit)
    for warning in warnings:
        click.echo(f"opsctl: warning: {warning}", err=True)
    if as_json:
        for record in records:
            click.echo(json.dumps(record, sort_keys=True))
    else:
        click.echo(render_history(records))
    return ExitCode.OK


def rules_export(clients: Clients, fmt: str) -> ExitCode:
    config = clients.config()
    rules = load_catalog(config)
    node_label = config.node_mapping.target_label or "instance"
    if fmt == "grafana":
        click.echo(gpu_dashboard(config), nl=False)
    else:
        click.echo(render_prometheus_rules(rules, node_label=node_label, extra_groups=[system_alerts(config)]),
                   nl=False)
    return ExitCode.OK


def rules_list(clients: Clients) -> ExitCode:
    for rule in load_catalog(clients.config()):
        click.echo(f"{rule.id:22} {rule.severity:4} {rule.action:6} {rule.alert_expr()}")
    return ExitCode.OK
