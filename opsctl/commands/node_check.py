"""`opsctl node check`: every node-local check, for a person, node_exporter and Slurm's HealthCheckProgram.

Exit codes: 0 every check passes, 1 a check failed, 2 usage or config error, 3 the hardware could not be read.
"""

import json
import socket
import time
from pathlib import Path

import click

from opsctl.commands.context import Clients
from opsctl.commands.render import JSON_SCHEMA
from opsctl.errors import ExitCode, worst
from opsctl.ib.report import check_report, report_dict
from opsctl.nodecheck import drain_self, metrics_text, results, storage_results, write_textfile
from opsctl.remediation.outcome import Outcome
from opsctl.storage.check import StorageReport, storage_report


def node_check(clients: Clients, as_json: bool, textfile: str | None, drain: bool, node: str | None,
               window: float | None, sysfs_root: str | None) -> ExitCode:
    clients.config(acting=drain)  # before anything reads it: --drain-self changes the node in Slurm
    report = check_report(clients.config().ib, None, None, window, sysfs_root)
    storage = storage_report(clients.config().storage)
    found = results(report) + storage_results(storage)
    if textfile:
        write_textfile(Path(textfile), metrics_text(found, time.time(), storage))
    code = ExitCode.OK if report.passed and storage.passed else ExitCode.FAILING
    outcome = Outcome()
    if drain:
        # Slurm names a node by its short host name unless slurm.conf says otherwise: --node then.
        outcome = drain_self(clients.config(), clients.slurm(), node or socket.gethostname().split(".")[0], found,
                             report)
        code = worst(code, outcome.exit_code)  # a storage check fails the command, though it drains nothing
    action = "\n".join(outcome.lines)
    if as_json:
        click.echo(json.dumps({"schema": JSON_SCHEMA, **report_dict(report), "checks": [r.__dict__ for r in found],
                               "storage": storage_dict(storage), "action": action}, indent=1))
    else:
        details = {(f.check, f.device): f.detail for f in storage.findings}
        for r in found:
            detail = details.get((r.check, r.device), "")
            click.echo(f"{r.check:22} {r.device or '-':14} {'FAIL' if r.failed else 'ok'}  {detail}".rstrip())
        for point, stats in sorted(storage.nfs.items()):
            click.echo(f"nfs {point}: {stats.retransmissions} RPC retransmissions of {stats.ops} ops since mount")
        if action:
            click.echo(action)
    return code


def storage_dict(storage: StorageReport) -> dict:
    return {
        "verdict": "pass" if storage.passed else "fail",
        "findings": [{"check": f.check, "device": f.device, "detail": f.detail} for f in storage.findings],
        "skipped": [{"check": check, "why": why} for check, why in sorted(storage.skipped.items())],
        "nfs": [{"mount": point, "ops": s.ops, "retransmissions": s.retransmissions,
                 "major_timeouts": s.major_timeouts} for point, s in sorted(storage.nfs.items())],
    }
