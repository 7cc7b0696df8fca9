"""`opsctl why JOB`: which node most likely ended a job, with the evidence; `opsctl suspects`: the nodes
that keep turning up in failed jobs that nothing explains (docs/why.md). The work is opsctl.why.run's;
this parses, checks the usage and renders.

Exit codes: 0 answered (a likely culprit, or "no evidence"; a running job: its verdict, docs/job-health.md;
--queue: suspects queued or none), 2 usage or config error (a job that accounting does not know, or that has
not ended with --record), 3 Slurm's accounting or
Prometheus unreadable, or the audit log or state unwritable. With --spool, the worst of its jobs' codes.
"""

import json
import time
from pathlib import Path

import click

from opsctl.clients import Clients
from opsctl.errors import ExitCode
from opsctl.jobhealth import verdict as running
from opsctl.recover.spool import why_spooled
from opsctl.why import suspicion
from opsctl.why.run import JobAnswer, find_suspects, why_job
from opsctl.why.verdict import render, to_json


def why(clients: Clients, job_id: str | None, spool: Path | None, as_json: bool, record: bool,
        wait: float) -> ExitCode:
    if (job_id is None) == (spool is None):
        raise click.UsageError("say which job: JOB, or --spool DIR (the jobs EpilogSlurmctld left there)")
    if spool is not None:
        return why_spooled(clients, spool, wait, warn=lambda line: click.echo(line, err=True)).exit_code
    assert job_id is not None
    if not job_id.isdigit():
        raise click.UsageError(f"JOB must be a Slurm job id, not {job_id!r}")

    def show(result: JobAnswer) -> None:
        if result.running is not None:
            if as_json:
                click.echo(json.dumps(running.to_json(result.running), sort_keys=True))
            else:
                for line in running.render(result.running):
                    click.echo(line)
        elif result.answer is None:
            click.echo(f"job {result.job.id} {result.job.state}: nothing to explain")
        elif as_json:
            click.echo(json.dumps(to_json(result.answer), sort_keys=True))
        else:
            for line in render(result.answer):
                click.echo(line)

    why_job(clients, job_id, record, wait, show=show)
    return ExitCode.OK


def suspects(clients: Clients, queue: bool, as_json: bool) -> ExitCode:
    found = find_suspects(clients, queue)
    config = clients.config()
    if as_json:
        click.echo(json.dumps({"suspects": [s.node for s in found.found], "queued": found.queued,
                               "jobs": len(found.jobs), "since": found.since, "until": found.until,
                               "nodes": [{"node": s.node, "jobs": s.jobs, "failed_unexplained": s.failed,
                                          "failed_explained": s.explained, "fraction": round(s.fraction, 3),
                                          "suspect": s.suspect(config)} for s in found.scores.values()]},
                              sort_keys=True))
        return ExitCode.OK
    click.echo(f"{len(found.jobs)} jobs since {time.strftime('%Y-%m-%d %H:%M', time.localtime(found.since))}, "
               f"{len(suspicion.failed_jobs(found.jobs))} of them failed")
    for s in found.found:
        click.echo(f"suspect {s.node}: {s.words()}"
                   + (" (queued for opsctl validate)" if s.node in found.queued else ""))
    if not found.found:
        click.echo("no suspects")
    return ExitCode.OK
