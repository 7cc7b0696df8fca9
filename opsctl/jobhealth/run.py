"""`opsctl job-health` and `opsctl why` of a running job (docs/job-health.md): every running job of two nodes or
more, its nodes judged against each other (opsctl.jobhealth.verdict) over the last `job_health.window`.

The cost grows with the signals, not the nodes or the jobs: Slurm's running jobs are one `squeue`; Prometheus
answers two queries for the targets' identities (who each target is: opsctl.health.identity) and one per
signal (opsctl.jobhealth.signals) for every node at once, sent together; the answers are split by job here.

With `queue`, a node named hung or slow goes on the validate queue as `opsctl suspects --queue` puts a suspect
there (the next `opsctl validate --idle` takes it first once it is idle), each verdict is written to the audit
log once per job (event `job-health`), and the verdicts go to Prometheus as series of a textfile (the alert
OpsctlJobHealthVerdict reads them). Nothing is ever drained: a slow node still runs its job. State and audit
writes go through the Ledger (opsctl/actor/ledger.py) and take no run lock.
"""

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from opsctl.actor.ledger import Ledger
from opsctl.clients import Clients
from opsctl.config.schema import Config, duration_seconds
from opsctl.errors import ConfigError, SourceUnavailable
from opsctl.health.evaluate import presence_queries
from opsctl.health.identity import Identities, identity_query
from opsctl.jobhealth.signals import Signal, in_use
from opsctl.jobhealth.verdict import HUNG, SLOW, JobHealth, Values, judge
from opsctl.metrics.jobhealth import JobHealthMetrics, VerdictSample
from opsctl.metrics.recorder import write_textfile
from opsctl.prom.client import PromQuery, Sample
from opsctl.slurm.base import RunningJob

EVENT = "job-health"
TEXTFILE = "opsctl-job-health.prom"


@dataclass
class Evaluation:
    jobs: list[JobHealth]  # the running jobs of two nodes or more, in squeue's order
    single: int  # running jobs on one node: nothing to compare a node with
    queries: int
    at: float
    queued: list[str] = field(default_factory=list)  # with --queue: the nodes newly queued for opsctl validate


def check_window(config: Config) -> None:
    """A rate needs two scrapes within the window."""
    window, scrape = config.job_health.window, duration_seconds(config.prometheus.scrape_interval)
    if window < 2 * scrape:
        raise ConfigError(f"config key job_health.window: must span two scrapes (2 x prometheus.scrape_interval = "
                          f"{2 * scrape}s), got {window}")


def node_values(config: Config, prom: PromQuery, nodes: set[str]) -> Values:
    """Every signal's value per node of `nodes`: the identity queries and one query per signal, together."""
    signals = in_use(config)
    up_q, _ = presence_queries(config)
    answers = prom.query_many([up_q, identity_query(config), *(s.expr(config) for s in signals)])
    if prom.warnings:  # a partial answer could leave a GPU out of a node's minimum and name a healthy node
        raise SourceUnavailable(f"Prometheus: the answer may be partial: {prom.warnings[0]}")
    ids = Identities(answers[0], answers[1], config)
    values: Values = {}
    for signal, samples in zip(signals, answers[2:], strict=True):
        for node, value in per_node(signal, samples, ids, nodes).items():
            values.setdefault(node, {})[signal.name] = value
    return values


def per_node(signal: Signal, samples: list[Sample], ids: Identities, nodes: set[str]) -> dict[str, float]:
    """A signal's answer by Slurm node; a target whose identity is in conflict is left out (never judged), and a
    node with several targets of the signal's exporter combines them as the signal does."""
    found: dict[str, list[float]] = {}
    for sample in samples:
        info = ids.target(sample.labels)
        if info is not None and info.conflict or sample.value != sample.value:  # NaN: no value
            continue
        node = ids.node_of(sample.labels)
        if node in nodes:
            found.setdefault(node, []).append(sample.value)
    return {node: combine(signal.aggregate, got) for node, got in found.items()}


def combine(aggregate: str, values: list[float]) -> float:
    if aggregate == "bits":
        mask = 0
        for value in values:
            mask |= int(value)
        return float(mask)
    if aggregate == "min":
        return min(values)
    return sum(values) / (len(values) if aggregate == "avg" else 1)


def evaluate(config: Config, prom: PromQuery, jobs: list[RunningJob], now: float) -> tuple[list[JobHealth], int]:
    """Each job's verdict, and the number of queries it took (none when there is no job)."""
    check_window(config)
    before = prom.queries
    nodes = {node for job in jobs for node in job.nodes}
    values = node_values(config, prom, nodes) if jobs else {}
    return [judge(job, values, now, config.job_health) for job in jobs], prom.queries - before


def check_jobs(clients: Clients, queue: bool, warn: Callable[[str], None]) -> Evaluation:
    """`opsctl job-health [--queue]`."""
    config = clients.config(acting=queue)
    check_window(config)
    running = clients.jobs().running_jobs()
    jobs = [job for job in running if len(job.nodes) >= 2]
    now = time.time()
    judged, queries = evaluate(config, clients.prom(), jobs, now)
    result = Evaluation(judged, len(running) - len(jobs), queries, now)
    if queue:
        result.queued = record(Ledger(config), judged, now)
        path = textfile(config)
        if path is not None:
            write_textfile(path, metrics(judged, now), warn)
    return result


def running_job(clients: Clients, job_id: str) -> JobHealth | None:
    """`opsctl why JOB` of a job that has not ended: the same verdict for that one job, read-only; None when squeue
    does not list it running (it is pending, or ended a moment ago)."""
    config = clients.config()
    check_window(config)
    running = next((job for job in clients.jobs().running_jobs() if job.id == job_id), None)
    if running is None:
        return None
    judged, queries = evaluate(config, clients.prom(), [running], time.time())
    return replace(judged[0], queries=queries)


def record(ledger: Ledger, judged: list[JobHealth], now: float) -> list[str]:
    """Queue the nodes named for validation and audit each verdict once per job; the nodes newly queued."""
    findings = [(health, f) for health in judged for f in health.findings]
    if not findings:
        return []
    records, _ = ledger.audit_records()
    # (job, node, signal, verdict) of every verdict recorded before: a job hung for an hour is said once
    said = {(str(r.get("reason")), str(r.get("node")), tuple(r.get("checks") or ()),
             str(r.get("detail") or "").split(":", 1)[0]) for r in records if r.get("event") == EVENT}
    for health, finding in findings:
        key = (f"job {health.job.id}", finding.node, (finding.signal,), finding.verdict)
        if key not in said:
            ledger.audit(EVENT, node=finding.node, checks=[finding.signal], evidence=finding.words,
                         reason=f"job {health.job.id}", detail=f"{finding.verdict}: {finding.words}", now=now)
            said.add(key)
    waiting = ledger.state.validate_queue.load()
    named = {node: health for health in judged for node in health.named()}
    queued = [node for node in named if node not in waiting]
    if queued:
        ledger.save_validate_queue({**waiting, **{node: {"since": now, "why": f"job {named[node].job.id} "
                                                          f"{named[node].verdict}: " + "; ".join(
                                                              f.words for f in named[node].findings if f.node == node)}
                                                  for node in queued}})
    return queued


def textfile(config: Config) -> Path | None:
    if config.job_health.textfile:
        return Path(config.job_health.textfile)
    if config.metrics.textfile:
        return Path(os.path.dirname(config.metrics.textfile)) / TEXTFILE
    return None


def metrics(judged: list[JobHealth], now: float) -> JobHealthMetrics:
    counts: dict[str, int] = {}
    for health in judged:
        counts[health.verdict] = counts.get(health.verdict, 0) + 1
    return JobHealthMetrics([VerdictSample(h.job.id, f.node, f.verdict, f.signal) for h in judged
                             for f in h.findings if f.verdict in (HUNG, SLOW)], counts, now)
