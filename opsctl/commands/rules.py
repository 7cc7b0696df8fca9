"""`opsctl rules export` and `opsctl rules list`: the catalog as Prometheus alert and recording rules, a
Grafana dashboard, or one line a rule."""

import click

from opsctl.clients import Clients
from opsctl.commands.dashboards import gpu_dashboard
from opsctl.errors import ExitCode
from opsctl.health.catalog import load_catalog
from opsctl.health.export import render_prometheus_rules
from opsctl.health.precomputed import recording_groups
from opsctl.metrics.alerts import system_alerts


def rules_export(clients: Clients, fmt: str) -> ExitCode:
    config = clients.config()
    rules = load_catalog(config)
    node_label = config.node_mapping.target_label or "instance"
    if fmt == "grafana":
        click.echo(gpu_dashboard(config), nl=False)
    else:
        groups = [system_alerts(config), *recording_groups(rules, config)]
        click.echo(render_prometheus_rules(rules, node_label=node_label, extra_groups=groups), nl=False)
    return ExitCode.OK


def rules_list(clients: Clients) -> ExitCode:
    for rule in load_catalog(clients.config()):
        click.echo(f"{rule.id:22} {rule.severity:4} {rule.action:6} {rule.alert_expr()}")
    return ExitCode.OK
