"""`opsctl history`: the audit log, as a table or one JSON object a line."""

import json

import click

from opsctl.actor.ledger import read_history
from opsctl.clients import Clients
from opsctl.commands.render import render_history
from opsctl.errors import ExitCode


def history(clients: Clients, node: str | None, limit: int, as_json: bool, job: str | None = None) -> ExitCode:
    records, warnings = read_history(clients.config(), node, limit, job)
    for warning in warnings:
        click.echo(f"opsctl: warning: {warning}", err=True)
    if as_json:
        for record in records:
            click.echo(json.dumps(record, sort_keys=True))
    else:
        click.echo(render_history(records))
    return ExitCode.OK
