"""What happened on a job's nodes while it ran: every catalog rule over the job's window, one range
query per rule however many nodes the job had, plus the exporters' `up` and opsctl's own drains.

A rule is read without its hold (the value its alert compares, `Rule.plot_expr`), against its
threshold: a breach at one scrape is evidence here, though it would drain nothing. The window runs from
the job's start to `why.after_end` past its end (by default two scrape intervals), because the scrape
that sees an event lands up to one interval after it, and the job often dies first. The step is one
second, so that "first seen" is the scrape that saw it, coarser for a job so long that it would pass
Prometheus' 11,000 points per series; only breaching series come back, so the answers stay small.
"""

import calendar
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from opsctl.config.schema import Config, duration_seconds
from opsctl.health.catalog import Rule
from opsctl.health.evaluate import check_for, presence_queries
from opsctl.health.identity import Identities, identity_query
from opsctl.prom.client import PromRangeQuery, Sample
from opsctl.slurm.accounting import FinishedJob

MAX_POINTS = 10_000  # Prometheus refuses a range query of more than 11,000 points per series
# How much a kind of event explains a job's end: a fault that drains outranks one that is reported.
RANK = {("fail", "drain"): 3, ("fail", "report"): 2, ("warn", "report"): 1}


@dataclass(frozen=True)
class Event:
    node: str
    check: str  # a rule id, "exporter-down" or "opsctl-drain"
    severity: str  # fail | warn
    action: str  # drain | report
    evidence: str  # "gpu3 xid=79 count=1"
    first: float  # first seen within the window (Unix seconds)
    last: float
    at_start: bool  # already there when the job started: a condition the job ran with, not what ended it

    @property
    def rank(self) -> int:
        return RANK.get((self.severity, self.action), 1)


@dataclass(frozen=True)
class Window:
    start: float
    end: float  # the job's end
    until: float  # how far the evidence is read: the end plus why.after_end
    step: float


def window(job: FinishedJob, config: Config) -> Window:
    if job.start is None or job.end is None:
        raise ValueError(f"job {job.id} has no start and end")
    scrape = float(duration_seconds(config.prometheus.scrape_interval))
    after = float(duration_seconds(config.why.after_end)) or 2 * scrape
    start, until = job.start, job.end + after
    return Window(start=start, end=job.end, until=until, step=max(1.0, math.ceil((until - start) / MAX_POINTS)))


@dataclass(frozen=True)
class Found:
    events: list[Event]  # in no particular order
    window: Window
    unseen: tuple[str, ...]  # the job's nodes of which Prometheus holds no scrape in the window


def gather(client: PromRangeQuery, rules: list[Rule], config: Config, job: FinishedJob,
           audit: Iterable[dict[str, Any]]) -> Found:
    """The events on the job's nodes within its window, rules and drains alike, and the nodes that no
    exporter's scrape covers there (no data is not "no evidence")."""
    span = window(job, config)
    nodes = set(job.nodes)
    up_q, _ = presence_queries(config)
    # Who each target is, as the job started (every node was there then) and as it ended.
    names = []
    for at in (span.start, span.end):
        up, reported = client.query_many([up_q, identity_query(config)], at=at)
        names.append(Identities(up, reported, config))

    def node_of(labels: dict[str, str]) -> str:
        return next((n for n in (ids.node_of(labels) for ids in names) if n in nodes), "")

    events = []
    for rule in rules:
        for series in client.query_range(rule.unheld_expr(), span.start, span.until, span.step):
            node = node_of(series.labels)
            points = [(t, v) for t, v in series.points if math.isfinite(v)]
            if node and points:
                first_t, first_v = points[0]
                check = check_for(rule, Sample(series.labels, first_v, first_t))
                events.append(Event(node, rule.id, rule.severity, rule.action, check.evidence, first_t,
                                    points[-1][0], at_start=first_t <= span.start))
    for series in client.query_range(f"{up_q} == 0", span.start, span.until, span.step):
        node = node_of(series.labels)
        if node and series.points:
            source = next((s for s, j in config.prometheus.jobs.items() if j == series.labels.get("job")), "")
            events.append(Event(node, "exporter-down", "fail", "report", f"{source or 'an'} exporter down",
                                series.points[0][0], series.points[-1][0],
                                at_start=series.points[0][0] <= span.start))
    events += drains(audit, nodes, span)
    if job.failed_node in nodes:  # Slurm's own word (24.11 and later): this node's failure ended the job
        events.append(Event(job.failed_node, "slurm-node-fail", "fail", "drain", "Slurm ended the job: NODE_FAIL",
                            job.end or span.end, job.end or span.end, at_start=False))
    # Over the whole window, and never less than two scrapes: a job that lasted a second still had some.
    reach = math.ceil(max(span.until - span.start, 2 * float(duration_seconds(config.prometheus.scrape_interval))))
    seen = client.query(f"count_over_time({up_q}[{reach}s])", at=span.until)
    unseen = nodes - {node_of(sample.labels) for sample in seen}
    return Found(events, span, tuple(sorted(unseen)))


def drains(audit: Iterable[dict[str, Any]], nodes: set[str], span: Window) -> list[Event]:
    """opsctl's own drains of the job's nodes within the window, from the audit log."""
    found = []
    for record in audit:
        if record.get("event") != "drain" or record.get("dry_run") or record.get("node") not in nodes:
            continue
        try:
            at = float(calendar.timegm(time.strptime(str(record.get("time")), "%Y-%m-%dT%H:%M:%SZ")))
        except ValueError:
            continue
        if span.start <= at <= span.until:
            checks = ", ".join(record.get("checks") or [])
            found.append(Event(record["node"], "opsctl-drain", "fail", "drain",
                               f"drained by opsctl ({checks or record.get('reason', '')})", at, at, at_start=False))
    return found
