"""`opsctl job-health`: the node that hangs or slows each running multi-node job (docs/job-health.md). The work
is opsctl.jobhealth.run's; this renders.

Exit codes: 0 answered (verdicts or none; --queue: the named nodes queued), 2 usage or config error (a bad
job_health key, a window shorter than two scrapes), 3 Slurm (squeue) or Prometheus unreadable, or the audit
log or state unwritable. A verdict is not a failure: it never drains, and the exit code stays 0.
"""

import json

import click

from opsctl.clients import Clients
from opsctl.errors import ExitCode
from opsctl.jobhealth.run import check_jobs
from opsctl.jobhealth.verdict import OK, render, to_json


def job_health(clients: Clients, queue: bool, as_json: bool) -> ExitCode:
    found = check_jobs(clients, queue, warn=lambda line: click.echo(line, err=True))
    if as_json:
        click.echo(json.dumps({"jobs": [to_json(health) for health in found.jobs], "queued": found.queued,
                               "single_node_jobs": found.single, "queries": found.queries, "at": found.at},
                              sort_keys=True))
        return ExitCode.OK
    for health in found.jobs:
        if health.verdict != OK or health.no_data:
            for line in render(health):
                click.echo(line)
    quiet = sum(1 for health in found.jobs if health.verdict == OK and not health.no_data)
    click.echo(f"{len(found.jobs)} running jobs of 2 nodes or more, {quiet} of them ok"
               + (f"; queued for opsctl validate: {', '.join(found.queued)}" if found.queued else "")
               + f" ({found.queries} queries)")
    return ExitCode.OK
