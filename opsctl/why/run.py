"""`opsctl why` and `opsctl suspects` (docs/why.md): a job once accounting shows it ended, its answer, the
`--record` audit records (also of each job in EpilogSlurmctld's spool: opsctl/recover/spool.py), and the
suspects, with `--queue` writing them to the validate queue. The command (opsctl/commands/why.py) parses and
renders.

The audit log and the validate queue are read and written through the Ledger (opsctl/actor/ledger.py): a
`why --record` in the epilog never waits for, or stops, an acting run.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opsctl.actor.ledger import Ledger
from opsctl.clients import Clients
from opsctl.config.schema import Config, duration_seconds
from opsctl.errors import ConfigError
from opsctl.health.catalog import Rule, load_catalog
from opsctl.jobhealth.run import running_job
from opsctl.jobhealth.verdict import JobHealth
from opsctl.prom.client import PromRangeQuery
from opsctl.slurm.accounting import FinishedJob
from opsctl.slurm.base import SlurmAccounting
from opsctl.why import suspicion
from opsctl.why.evidence import gather, window
from opsctl.why.verdict import NO_DATA, Answer, judge

EVENT = "why"
POLL_S = 2.0


@dataclass(frozen=True)
class JobAnswer:
    """One job's answer; `answer` None: `--record` of a job that did not fail (nothing to explain), or a job that
    still runs, whose answer is `running`: the node that hangs or slows it (opsctl/jobhealth/)."""

    job: FinishedJob
    answer: Answer | None
    running: JobHealth | None = None


@dataclass
class Suspects:
    jobs: list[FinishedJob]
    since: float
    until: float
    scores: dict[str, suspicion.Score]
    found: list[suspicion.Score]  # the suspects, in the order of `scores`
    queued: list[str]  # with --queue: the suspects newly queued for `opsctl validate`


def explain(config: Config, prom: PromRangeQuery, job: FinishedJob, audit: list[dict[str, Any]],
            rules: list[Rule]) -> Answer:
    before = prom.queries
    found = gather(prom, rules, config, job, audit)
    return judge(job, found, prom.queries - before)


def ended_job(accounting: SlurmAccounting, job_id: str, wait: float, running_ok: bool = False) -> FinishedJob:
    """The job once accounting shows it ended, asking again for up to `wait` seconds (slurmctld sends a
    job's end to slurmdbd a moment after the job ends, so the epilog may ask too early); with `running_ok`, a
    job that has not ended after the wait is returned as it is."""
    deadline = time.monotonic() + wait
    while True:
        job = accounting.finished_job(job_id)
        if job is not None and job.ended or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    if job is None:
        raise ConfigError(f"job {job_id}: Slurm's accounting (sacct) has no such job")
    if not job.ended:
        if running_ok:
            return job
        raise ConfigError(f"job {job_id} has not ended ({job.state}): `opsctl why` explains ended jobs")
    if job.start is None:
        raise ConfigError(f"job {job_id} never started ({job.state}): it ran on no node")
    return job


def why_job(clients: Clients, job_id: str, record: bool, wait: float, rules: list[Rule] | None = None,
            show: Callable[[JobAnswer], None] | None = None) -> JobAnswer:
    """Explain job `job_id`; `show` (the command's renderer) sees the answer before `--record` writes it, so
    that an audit log that cannot be written still leaves the answer on the screen."""
    config = clients.config(acting=record)
    ledger = Ledger(config)
    # A running job is judged as `opsctl job-health` judges it, read-only; --record is for ended jobs alone.
    job = ended_job(clients.accounting(), job_id, wait, running_ok=not record)
    if not job.ended:
        # squeue, not accounting, says what runs: slurmdbd learns of a job's start a moment after it (sacct says
        # PENDING meanwhile), and its nodes and start are squeue's.
        health = running_job(clients, job.id)
        if health is None:
            raise ConfigError(f"job {job_id} has not ended ({job.state}) and does not run: `opsctl why` explains "
                              "ended jobs and running ones")
        result = JobAnswer(job, None, health)
        if show is not None:
            show(result)
        return result
    if record and not job.failed:
        result = JobAnswer(job, None)
    else:
        if wait:  # the window ends after the job: wait for its last scrapes
            time.sleep(max(0.0, min(wait, window(job, config).until - time.time())))
        # The audit log is read after the wait: a drain within the job's window may have just been written.
        answer = explain(config, clients.prom_range(), job, _audit_records(ledger),
                         load_catalog(config) if rules is None else rules)
        result = JobAnswer(job, answer)
    if show is not None:
        show(result)
    if record and result.answer is not None:
        write_record(ledger, result.answer)
    return result


def write_record(ledger: Ledger, answer: Answer) -> None:
    """One record per node of the job, so that each node's history (`opsctl history NODE`) shows it."""
    job = answer.job
    said = f"likely culprit {answer.culprit}" if answer.culprit else answer.verdict
    for node in job.nodes:
        mine = [e for e in answer.events if e.node == node]
        ledger.audit(EVENT, node=node, checks=list(dict.fromkeys(e.check for e in mine)),
                     evidence=f"{mine[0].check} {mine[0].evidence}" if mine else "", reason=f"job {job.id}",
                     detail=f"job {job.id} {job.state}{' (' + job.exit + ')' if job.exit else ''}: {said}")


def recorded_evidence(audit: list[dict[str, Any]]) -> tuple[dict[str, set[str]], set[str]]:
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


def find_suspects(clients: Clients, queue: bool) -> Suspects:
    """The nodes that keep turning up in failed jobs that nothing explains; with `queue`, those not yet in the
    validate queue are added to it."""
    config = clients.config(acting=queue)
    now = time.time()
    since = now - duration_seconds(config.why.suspect_lookback)
    jobs = suspicion.counted(clients.accounting().finished_jobs(since, now))
    ledger = Ledger(config)
    audit = _audit_records(ledger)
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
        waiting = ledger.state.validate_queue.load()
        queued = [s.node for s in found if s.node not in waiting]
        ledger.save_validate_queue({**waiting, **{s.node: {"since": now, "why": s.words()} for s in found
                                                  if s.node in queued}})
    return Suspects(jobs=jobs, since=since, until=now, scores=scores, found=found, queued=queued)


def _audit_records(ledger: Ledger) -> list[dict[str, Any]]:
    records, _ = ledger.audit_records()
    return records
