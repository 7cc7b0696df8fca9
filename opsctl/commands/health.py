"""The output layer of `opsctl health`, `nodes`, `drain`, `resume`, `history` and `rules`.

opsctl/cli.py parses the arguments and calls one function here; each loads the config, calls the
core, echoes the rendered result and returns the exit code.
"""

import json

import click

from opsctl.commands.dashboards import gpu_dashboard
from opsctl.commands.render import render_history, render_json, render_nodes, render_table
from opsctl.commands.watch import watch
from opsctl.config import load_config
from opsctl.errors import ExitCode
from opsctl.health.catalog import load_catalog
from opsctl.health.export import render_prometheus_rules
from opsctl.metrics import RunRecorder
from opsctl.metrics.alerts import system_alerts
from opsctl.remediation.audit import AuditLog
from opsctl.remediation.manual import manual_drain, manual_resume
from opsctl.remediation.run import RunOptions, run_health
from opsctl.slurm import make_slurm


def health(config_path, drain, dry_run, resume, as_json, watch_s, prometheus, all_nodes, scope=None) -> ExitCode:
    config = load_config(config_path)
    recorder = RunRecorder(config.metrics, serve=watch_s is not None, warn=lambda line: click.echo(line, err=True))

    @recorder.wrap
    def once():
        return run_health(config, RunOptions(drain=drain, resume=resume, dry_run=dry_run,
                                             prometheus_url=prometheus, scope=scope))

    def show(result):
        click.echo(render_json(result) if as_json else render_table(result, all_nodes))

    if watch_s is None:
        result = once()
        show(result)
        return result.exit_code
    recorder.start()
    return watch(once, watch_s, show, lambda line: click.echo(line, err=True))


def nodes(config_path, as_json) -> ExitCode:
    config = load_config(config_path)
    found = make_slurm(config).nodes()
    if as_json:
        click.echo(json.dumps([{"node": n.name, "state": n.state, "flags": list(n.flags), "reason": n.reason,
                                "owner": n.owner} for n in found.values()], indent=1))
    else:
        click.echo(render_nodes(found))
    return ExitCode.OK


def drain(config_path, hostlist, reason) -> ExitCode:
    code, lines = manual_drain(load_config(config_path), hostlist, reason)
    for line in lines:
        click.echo(line, err=line.startswith("refused"))
    return code


def resume(config_path, hostlist, force) -> ExitCode:
    code, lines = manual_resume(load_config(config_path), hostlist, force)
    for line in lines:
        click.echo(line, err=line.startswith("refused"))
    return code


def history(config_path, node, limit, as_json) -> ExitCode:
    records = AuditLog(load_config(config_path).audit_log).read(node=node, limit=limit)
    if as_json:
        for record in records:
            click.echo(json.dumps(record, sort_keys=True))
    else:
        click.echo(render_history(records))
    return ExitCode.OK


def rules_export(config_path, fmt) -> ExitCode:
    config = load_config(config_path)
    rules = load_catalog(config)
    if fmt == "grafana":
        click.echo(gpu_dashboard(config), nl=False)
    else:
        click.echo(render_prometheus_rules(rules, extra_groups=[system_alerts(config)]), nl=False)
    return ExitCode.OK


def rules_list(config_path) -> ExitCode:
    for rule in load_catalog(load_config(config_path)):
        click.echo(f"{rule.id:22} {rule.severity:4} {rule.action:6} {rule.alert_expr()}")
    return ExitCode.OK
