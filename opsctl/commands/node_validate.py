"""`opsctl node validate`: this node's active checks (opsctl.validate.node), for a validation job or a person.

Exit codes: 0 every test passed, 1 a test failed, 2 usage or config error, 3 a test could not run (not
checked, never a pass).
"""

import json
from pathlib import Path

import click

from opsctl.commands.context import Clients
from opsctl.commands.render import JSON_SCHEMA
from opsctl.errors import ExitCode
from opsctl.nodecheck import write_textfile
from opsctl.validate.node import metrics_text, validate_node

CODES = {"pass": ExitCode.OK, "fail": ExitCode.FAILING, "not_checked": ExitCode.SOURCE_DOWN}


def node_validate(clients: Clients, as_json: bool, textfile: str | None) -> ExitCode:
    validation = validate_node(clients.config())
    if textfile:
        write_textfile(Path(textfile), metrics_text(validation))
    if as_json:
        click.echo(json.dumps({"schema": JSON_SCHEMA, "verdict": validation.verdict,
                               "busbw_gbps": validation.busbw_gbps, "tests": [
                                   {"test": o.test, "verdict": o.verdict, "devices": list(o.devices),
                                    "detail": o.detail} for o in validation.outcomes]}, indent=1))
    else:
        for outcome in validation.outcomes:
            devices = ",".join(outcome.devices)
            click.echo(f"{outcome.test:10} {devices:10} {outcome.verdict.replace('_', ' '):12} {outcome.detail}")
    return CODES[validation.verdict]
