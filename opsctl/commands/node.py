"""`opsctl node check`: every node-local check, for a person, node_exporter and Slurm's HealthCheckProgram.

Exit codes: 0 every check passes, 1 a check failed, 2 usage or config error, 3 the hardware could not be read.
"""

import json
import socket
import time
from pathlib import Path

import click

from opsctl.commands.context import Clients
from opsctl.commands.ib import check_report, report_dict
from opsctl.errors import ExitCode
from opsctl.nodecheck import drain_self, metrics_text, results, write_textfile


def node_check(clients: Clients, as_json: bool, textfile: str | None, drain: bool, node: str | None,
               window: float | None, sysfs_root: str | None) -> ExitCode:
    report = check_report(clients, None, None, window, sysfs_root)
    found = results(report)
    if textfile:
        write_textfile(Path(textfile), metrics_text(found, time.time()))
    code = ExitCode.OK if report.passed else ExitCode.FAILING
    action = ""
    if drain:
        # Slurm names a node by its short host name unless slurm.conf says otherwise: --node then.
        code, action = drain_self(clients.config(), clients.slurm(), node or socket.gethostname().split(".")[0],
                                  found)
    if as_json:
        click.echo(json.dumps({**report_dict(report), "checks": [r.__dict__ for r in found], "action": action},
                              indent=1))
    else:
        for r in found:
            click.echo(f"{r.check:20} {r.device or '-':10} {'FAIL' if r.failed else 'ok'}")
        if action:
            click.echo(action)
    return code
