"""`opsctl nodes`, `opsctl drain` and `opsctl resume`: what a person sees of the nodes and does to them."""

import json

import click

from opsctl.clients import Clients
from opsctl.commands.render import render_nodes
from opsctl.errors import ExitCode
from opsctl.health.manual import manual_drain, manual_resume
from opsctl.actor.result import ActionResult


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
    return _show(manual_drain(clients.config(acting=True), clients.slurm(), hostlist, reason))


def resume(clients: Clients, hostlist: str, force: bool) -> ExitCode:
    return _show(manual_resume(clients.config(acting=True), clients.slurm(), hostlist, force))


def _show(outcome: ActionResult) -> ExitCode:
    for line in outcome.lines:
        click.echo(line, err=line.startswith("refused"))
    return outcome.exit_code
