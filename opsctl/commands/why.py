"""`opsctl why JOB`: which node most likely ended a job, with the evidence; `opsctl suspects`: the nodes
that keep turning up in failed jobs that nothing explains (docs/why.md).

Exit codes: 0 answered (a likely culprit, or "no evidence"; --queue: suspects queued or none), 2 usage or
config error (a job that accounting does not know, or that has not ended), 3 Slurm's accounting or
Prometheus unreadable, or the audit log or state unwritable. With --spool, the worst of its jobs' codes.
"""

import json
import os
import time
from pathlib import Path

import click

from opsctl.clients import Clients
from opsctl.config.schema import Config, duration_seconds
from opsctl.errors import ConfigError, ExitCode, OpsctlError, worst
from opsctl.health.catalog import Rule, load_catalog
from opsctl.prom.client import PromRangeQuery
from opsctl.actor.audit import AuditLog
from opsctl.actor.state import State
from opsctl.slurm.accounting import FinishedJob
from opsctl.slurm.base import SlurmAccounting
from opsctl.why import suspicion
from opsctl.why.evidence import gather, window
from opsctl.why.verdict import NO_DATA, Answer, judge, render, to_json

EVENT = "why"
POLL_S = 2.0


def _audit_records(config: Config) -> list[dict]:
    if not config.audit_log.exists():
        return []
    records, _ = AuditLog(config.audit_log).read()
    return records


def explain(config: Config, prom: PromRangeQuery, job: FinishedJob, audit: list[dict], rules: list[Rule]) -> Answer:
    before = prom.queries
    found = gather(prom, rules, config, job, audit)
    return judge(job, found, prom.queries - before)


def _ended_job(accounting: SlurmAccounting, job_id: str, wait: float) -> FinishedJob:
    """The job once accounting shows it ended, asking again for up to `wait` seconds (slurmctld sends a
    job's end to slurmdbd a moment after the job ends, so the epilog may ask too early)."""
    deadline = time.monotonic() + wait
    while True:
        job = accounting.finished_job(job_id)
        if job is not None and job.ended or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    if job is None:
        raise ConfigError(f"job {job_id}: Slurm's accounting (sacct) has no such job")
    if not job.ended:
        raise ConfigError(f"job {job_id} has not ended ({job.state}): `opsctl why` explains ended jobs")
    if job.start is None:
        raise ConfigError(f"job {job_id} never started ({job.state}): it ran on no node")
    return job


def why(clients: Clients, job_id: str | None, spool: Path | None, as_json: bool, record: bool,
        wait: float) -> ExitCode:
    if (job_id is None) == (spool is None):
        raise click.UsageError("say which job: JOB, or --spool DIR (the jobs EpilogSlurmctld left there)")
    if spool is not None:
        return why_spooled(clients, spool, wait)
    assert job_id is not None
    if not job_id.isdigit():
        raise click.UsageError(f"JOB must be a Slurm job id, not {job_id!r}")
    return _why_one(clients, job_id, as_json, record, wait)


def why_spooled(clients: Clients, spool: Path, wait: float) -> ExitCode:
    """`--record` for every job that the controller's EpilogSlurmctld left in `spool`, an empty file named by
    its id, oldest first; each entry is removed before its job is explained, so a job that cannot be
    explained is said once and not retried forever (and the path unit that starts this run sees the
    directory empty). Only names are read: root never opens a file that the Slurm user made. A job that
    fails is one line on stderr; the others go on."""
    clients.config(acting=True)
    try:
        entries = sorted((e.stat(follow_symlinks=False).st_mtime, e.name) for e in os.scandir(spool))
    except OSError as err:
        raise ConfigError(f"--spool {spool}: {err.strerror}") from None
    code = ExitCode.OK
    rules = load_catalog(clients.config())  # once for every job of the run
    for _, name in entries:
        try:
            os.unlink(spool / name)
        except FileNotFoundError:
            continue  # another run took it
        except OSError as err:
            click.echo(f"opsctl: --spool {spool}: cannot remove {name!r}: {err.strerror}", err=True)
            continue
        if not name.isdigit():
            click.echo(f"opsctl: --spool {spool}: removed {name!r}, not a job id", err=True)
            continue
        try:
            _why_one(clients, name, False, True, wait, quiet=True, rules=rules)
        except OpsctlError as err:
            click.echo(f"opsctl: job {name}: {err}", err=True)
            code = worst(code, err.exit_code)
    return code


def _why_one(clients: Clients, job_id: str, as_json: bool, record: bool, wait: float,
             quiet: bool = False, rules: list[Rule] | None = None) -> ExitCode:
    config = clients.config(acting=record)
    job = _ended_job(clients.accounting(), job_id, wait)
    if record and not job.failed:
        if not quiet:
            click.echo(f"job {job.id} {job.state}: nothing to explain")
        return ExitCode.OK
    if wait:  # the window ends after the job: wait for its last scrapes
        time.sleep(max(0.0, min(wait, window(job, config).until - time.time())))
    # The audit log is read after the wait: a drain within the job's window may have just been written.
    answer = explain(config, clients.prom_range(), job, _audit_records(config),
                     load_catalog(config) if rules is None else rules)
    if as_json:
        click.echo(json.dumps(to_json(answer), sort_keys=True))
    else:
        for line in render(answer):
            click.echo(line)
    if record:
        write_record(AuditLog(config.audit_log), answer)
    return ExitCode.OK


def write_record(audit: AuditLog, answer: Answer) -> None:
    """One record per node of the job, so that each node's history (`opsctl history NODE`) shows it."""
    job = answer.job
    said = f"likely culprit {answer.culprit}" if answer.culprit else answer.verdict
    for node in job.nodes:
        mine = [e for e in answer.events if e.node == node]
        audit.write(EVENT, node=node, checks=list(dict.fromkeys(e.check for e in mine)),
                    evidence=f"{mine[0].check} {mine[0].evidence}" if mine else "", reason=f"job {job.id}",
                    detail=f"job {job.id} {job.state}{' (' + job.exit + ')' if job.exit else ''}: {said}")


def recorded_evidence(audit: list[dict]) -> tuple[dict[str, set[str]], set[str]]:
    """From the records `opsctl why --record` wrote: failed job id -> the nodes with evidence, and the jobs
    whose answer was "no data"."""
    found: dict[str, set[str]] = {}
    unknown = set()
    for record in audit:
        reason = str(record.get("reason") or "")
        if record.get("event") == EVENT and reason.startswith("job "):
            nodes = found.setdefault(reason[4:], set())
            if record.get("checks"):
                nodes.add(str(record.get("node")))
            if str(record.get("detail") or "").endswith(f": {NO_DATA}"):
                unknown.add(reason[4:])
    return found, unknown


def suspects(clients: Clients, queue: bool, as_json: bool) -> ExitCode:
    config = clients.config(acting=queue)
    now = time.time()
    since = now - duration_seconds(config.why.suspect_lookback)
    jobs = suspicion.counted(clients.accounting().finished_jobs(since, now))
    audit = _audit_records(config)
    rules = load_catalog(config)
    evidence, unknown = recorded_evidence(audit)
    # A failed job that no `why --record` judged (no epilog, or one that failed) is judged now.
    for job in suspicion.failed_jobs(jobs):
        if job.id not in evidence:
            answer = explain(config, clients.prom_range(), job, audit, rules)
            evidence[job.id] = answer.nodes_with_evidence()
            if answer.verdict == NO_DATA:
                unknown.add(job.id)
    scores = suspicion.score(jobs, evidence, frozenset(unknown))
    found = [s for s in scores.values() if s.suspect(config)]
    queued: list[str] = []
    if queue and found:
        state = State(config.state_dir)
        waiting = state.validate_queue.load()
        queued = [s.node for s in found if s.node not in waiting]
        state.validate_queue.save({**waiting, **{s.node: {"since": now, "why": s.words()} for s in found
                                                 if s.node in queued}})
    if as_json:
        click.echo(json.dumps({"suspects": [s.node for s in found], "queued": queued, "jobs": len(jobs),
                               "since": since, "until": now,
                               "nodes": [{"node": s.node, "jobs": s.jobs, "failed_unexplained": s.failed,
                                          "failed_explained": s.explained, "fraction": round(s.fraction, 3),
                                          "suspect": s.suspect(config)} for s in scores.values()]},
                              sort_keys=True))
        return ExitCode.OK
    click.echo(f"{len(jobs)} jobs since {time.strftime('%Y-%m-%d %H:%M', time.localtime(since))}, "
               f"{len(suspicion.failed_jobs(jobs))} of them failed")
    for s in found:
        click.echo(f"suspect {s.node}: {s.words()}" + (" (queued for opsctl validate)" if s.node in queued else ""))
    if not found:
        click.echo("no suspects")
    return ExitCode.OK
