"""`opsctl node validate`: this node's active checks (opsctl.validate.node, run by opsctl.validate.run), for a
validation job or a person; this checks the usage and renders.

Exit codes: 0 every test passed, 1 a test failed, 2 usage or config error, 3 a test could not run (not
checked, never a pass).
"""

import json

import click

from opsctl.clients import Clients
from opsctl.commands.render import JSON_SCHEMA
from opsctl.config.rails import HCA_NAME
from opsctl.errors import ExitCode
from opsctl.validate.node import NCCL_PAIR
from opsctl.validate.run import node_validate as run_node_validate
from opsctl.validate.run import record_pairs as write_pair_results

CODES = {"pass": ExitCode.OK, "fail": ExitCode.FAILING, "not_checked": ExitCode.SOURCE_DOWN}


def node_validate(clients: Clients, as_json: bool, textfile: str | None, record_pairs: str | None = None) -> ExitCode:
    if record_pairs is not None:
        return _record_pairs(textfile, record_pairs)
    validation = run_node_validate(clients, textfile)
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


def _record_pairs(textfile: str | None, result: str) -> ExitCode:
    """What `opsctl validate --preflight` found on this node's rails, written beside its own results."""
    if not textfile:
        raise click.UsageError("--record-pairs writes to the --textfile directory: give --textfile")
    failed = [] if result == "pass" else [hca for hca in result.split(",") if hca]
    if result != "pass" and (not failed or not all(HCA_NAME.fullmatch(hca) for hca in failed)):
        raise click.UsageError(f"--record-pairs {result!r}: 'pass' or the failed HCAs, comma separated")
    write_pair_results(textfile, failed)
    click.echo(f"{NCCL_PAIR:10} {','.join(failed) or 'node':10} {'fail' if failed else 'pass'}")
    return ExitCode.OK
