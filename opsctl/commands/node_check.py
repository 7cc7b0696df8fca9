"""`opsctl node check`: every node-local check, for a person, node_exporter and Slurm's HealthCheckProgram
(opsctl.nodecheck.run); this renders its one result.

Exit codes: 0 every check passes, 1 a check failed, 2 usage or config error, 3 the hardware could not be read.
The kernel log's XIDs change none of them (the health rules judge them from Prometheus), nor does a kernel
log that cannot be read (`kernel_log.read_ok`, docs/gpu-kernel-log.md).
"""

import json

import click

from opsctl.clients import Clients
from opsctl.commands.render import JSON_SCHEMA
from opsctl.errors import ExitCode
from opsctl.ib.report import report_dict
from opsctl.nodecheck.run import (
    aer_lines,
    check_lines,
    gpus_dict,
    kernel_log_dict,
    kernel_log_lines,
    nvlink_dict,
    nvlink_lines,
    ofed_dict,
    ofed_lines,
    storage_dict,
)
from opsctl.nodecheck.run import node_check as run_node_check


def node_check(clients: Clients, as_json: bool, textfile: str | None, drain: bool, node: str | None,
               window: float | None, sysfs_root: str | None, remediate: bool = False) -> ExitCode:
    result = run_node_check(clients, textfile, drain, node, window, sysfs_root, remediate)
    action = "\n".join(result.action.lines)
    if as_json:
        # `skipped` is already the InfiniBand report's (the checks it could not make): what the action left
        # alone is named in `action`, and done, would and refused sit beside it.
        acted = {name: lines for name, lines in result.action.fields().items() if name != "skipped"}
        click.echo(json.dumps({"schema": JSON_SCHEMA, **report_dict(result.report),
                               "checks": [r.__dict__ for r in result.found], "storage": storage_dict(result.storage),
                               "kernel_log": kernel_log_dict(result.kernel), "nvlink": nvlink_dict(result.nvlinks),
                               "pcie_aer": result.aer, "gpus": gpus_dict(result.gpus), "ofed": ofed_dict(result.ofed),
                               "action": action, **acted},
                              indent=1))
    else:
        for line in (check_lines(result) + kernel_log_lines(result.kernel) + nvlink_lines(result.nvlinks)
                     + aer_lines(result.aer) + ofed_lines(result.ofed)):
            click.echo(line)
        if action:
            click.echo(action)
    return result.exit_code
