"""`opsctl nodes`, `opsctl drain` and `opsctl resume`: what a person sees of the nodes and does to them."""

import json

import click

from opsctl.actor.result import ActionResult
from opsctl.clients import Clients
from opsctl.commands.render import JSON_SCHEMA, render_nodes
from opsctl.errors import ExitCode
from opsctl.health import manual


def nodes(clients: Clients, as_json: bool) -> ExitCode:
    found = manual.list_nodes(clients)
    if as_json:
        click.echo(json.dumps([{"node": n.name, "state": n.state, "flags": list(n.flags), "reason": n.reason,
                                "owner": n.owner, "partitions": list(n.partitions)} for n in found.values()],
                              indent=1))
    else:
        click.echo(render_nodes(found))
    return ExitCode.OK


def drain(clients: Clients, hostlist: str, reason: str, as_json: bool = False) -> ExitCode:
    return _show(manual.drain_nodes(clients, hostlist, reason), as_json)


def resume(clients: Clients, hostlist: str, force: bool, as_json: bool = False) -> ExitCode:
    return _show(manual.resume_nodes(clients, hostlist, force), as_json)


def _show(result: ActionResult, as_json: bool) -> ExitCode:
    if as_json:
        click.echo(json.dumps({"schema": JSON_SCHEMA, **result.fields(), "drained": result.drained,
                               "resumed": result.resumed, "actions": result.lines}, indent=1))
        return result.exit_code
    for line in result.lines:
        click.echo(line, err=line.startswith("refused"))
    return result.exit_code
