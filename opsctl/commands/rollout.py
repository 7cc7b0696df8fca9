"""`opsctl rollout drain|resume`: the head node's side of provisioning's rolling changes (what they do:
opsctl/rollout/batch.py; who runs them: playbooks/roles/nvidia/tasks/rolling.yml).

`drain` exit codes: 0 every node of the batch is out of service and runs no job (change them), 1 a node
is skipped (its jobs outlasted --wait, or Slurm changed under the decision): it is back in service and
must not be changed, 2 usage or config error (an unknown node), 3 Slurm unreadable. `reboot`: 0 every node
rebooted and registered again, 1 a node is refused (not drained by a rollout, or jobs still run there) or
not back within --wait (left DOWN), 2, 3. `resume`: 0, 2, 3.
"""

import json

import click

from opsctl.actor.result import ActionResult
from opsctl.clients import Clients
from opsctl.commands.render import JSON_SCHEMA
from opsctl.errors import ExitCode
from opsctl.rollout import batch


def drain(clients: Clients, hostlist: str, change: str, wait_s: float, as_json: bool) -> ExitCode:
    outcome = batch.rollout_drain(clients, hostlist, change, wait_s)
    if as_json:
        click.echo(json.dumps({"schema": JSON_SCHEMA, **outcome.action.fields(), "ready": outcome.ready,
                               "skipped": outcome.skipped, "drained": outcome.drained, "held": outcome.held,
                               "actions": outcome.lines}, indent=1))
    else:
        click.echo("\n".join(outcome.lines))
    return outcome.exit_code


def reboot(clients: Clients, hostlist: str, change: str, wait_s: float, as_json: bool) -> ExitCode:
    back, lines, action = batch.rollout_reboot(clients, hostlist, change, wait_s)
    return _print(as_json, "back", back, lines, "nothing to reboot", action)


def resume(clients: Clients, hostlist: str, as_json: bool) -> ExitCode:
    resumed, lines, action = batch.rollout_resume(clients, hostlist)
    return _print(as_json, "resumed", resumed, lines, "nothing to resume: no node of these is drained by a rollout",
                  action)


def _print(as_json: bool, field: str, nodes: list[str], lines: list[str], nothing: str,
           action: ActionResult) -> ExitCode:
    if as_json:
        click.echo(json.dumps({"schema": JSON_SCHEMA, **action.fields(), field: nodes, "actions": lines}, indent=1))
    else:
        click.echo("\n".join(lines) if lines else nothing)
    return ExitCode.FAILING if any(line.startswith(("refused ", "not back ")) for line in lines) else ExitCode.OK
