"""`opsctl hw quarantine`: provisioning's hardware check of the Slurm nodes, run on the head node
(opsctl/hw/quarantine.py says what it drains, resumes and when it stops); this renders it.

Exit codes: 0 every node fits (a node may have been resumed), 1 a node differs (drained), 2 usage or
config error, 3 the input (or Slurm) could not be read, 4 a safety stop: the breaker (nothing drained)
or a drain limit of `opsctl health --drain`.
"""

import json

import click

from opsctl.clients import Clients
from opsctl.commands.render import JSON_SCHEMA
from opsctl.errors import ExitCode
from opsctl.hw.quarantine import quarantine as decide_quarantine


def quarantine(clients: Clients, results: str, as_json: bool, dry_run: bool) -> ExitCode:
    found = decide_quarantine(clients, results, dry_run)
    outcome, mismatches, differing = found.action, found.mismatches, found.differing
    if as_json:
        click.echo(json.dumps({"schema": JSON_SCHEMA, "tested": sorted(mismatches), "mismatch": differing,
                               "drained": outcome.drained, "resumed": outcome.resumed, "dry_run": dry_run,
                               "stop": outcome.stop, "actions": outcome.lines, **outcome.fields()}, indent=1))
    else:
        for node, why in differing.items():
            click.echo(f"hw-mismatch {node}: {why}")
        click.echo("\n".join(outcome.lines) if outcome.lines else "nothing to drain or resume")
        click.echo(f"{len(mismatches)} node(s) checked: {len(mismatches) - len(differing)} fit, "
                   f"{len(differing)} differ")
    return outcome.exit_code
