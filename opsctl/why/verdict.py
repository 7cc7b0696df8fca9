"""Which node most likely ended a job, from its events (opsctl.why.evidence): pure, so that tests give it
any events they like.

The likely culprit is the node of the most telling event, ordered by:
  1. new before old: an event first seen during the job outranks a condition that was already there when
     the job started (the job ran with it for a while);
  2. what it is: a failure whose rule drains, then any failure (an exporter gone quiet, a reported fault),
     then a warning;
  3. time: the event nearest the job's end.
No event at all is "no evidence": opsctl knows nothing against any of the job's nodes in the window; but
when Prometheus holds no scrape of some of them there, it is "no data": opsctl cannot tell.
"""

import time
from dataclasses import dataclass
from typing import Any

from opsctl.slurm.accounting import FinishedJob
from opsctl.slurm.hostlist import hostlist_expression
from opsctl.why.evidence import Event, Found, Window

NO_EVIDENCE = "no evidence"
NO_DATA = "no data"


@dataclass(frozen=True)
class Answer:
    job: FinishedJob
    window: Window
    events: tuple[Event, ...]  # the most telling first
    queries: int = 0
    unseen: tuple[str, ...] = ()  # nodes with no scrape in the window: nothing can be said of them

    @property
    def verdict(self) -> str:
        return "culprit" if self.events else NO_DATA if self.unseen else NO_EVIDENCE

    @property
    def culprit(self) -> str:
        return self.events[0].node if self.events else ""

    def nodes_with_evidence(self) -> set[str]:
        return {event.node for event in self.events}


def judge(job: FinishedJob, found: Found, queries: int = 0) -> Answer:
    span = found.window
    ordered = sorted(found.events, key=lambda e: (e.at_start, -e.rank, abs(span.end - e.first), e.node, e.check))
    return Answer(job, span, tuple(ordered), queries, found.unseen)


def when(event: Event, end: float) -> str:
    if event.at_start:
        return "already there when the job started"
    gap = end - event.first
    if abs(gap) < 0.5:
        return "as the job ended"
    return f"{abs(gap):.0f} s {'before' if gap > 0 else 'after'} the job ended"


def _clock(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "?"


def headline(job: FinishedJob) -> str:
    nodes = ",".join(hostlist_expression(job.nodes)) or "no nodes"
    ended = f"{job.state}" + (f" ({job.exit})" if job.exit else "")
    return (f"job {job.id} ({job.name or '?'}, user {job.user or '?'}): {ended} on {nodes} "
            f"({len(job.nodes)} node{'s' if len(job.nodes) != 1 else ''}), {_clock(job.start)} to {_clock(job.end)}")


def event_line(event: Event, end: float) -> str:
    return f"{event.node}: {event.check} {event.evidence}, first seen {when(event, end)}"


def render(answer: Answer, limit: int = 10) -> list[str]:
    lines = [headline(answer.job)]
    unseen = ",".join(hostlist_expression(answer.unseen))
    if answer.verdict == NO_DATA:
        lines.append(f"{NO_DATA}: Prometheus holds no scrape of {unseen} over the job's time, and nothing against "
                     "the others: opsctl cannot tell")
        return lines
    if not answer.events:
        after = answer.window.until - answer.window.end
        lines.append(f"{NO_EVIDENCE}: no rule breached, no exporter went down and opsctl drained nothing on the "
                     f"job's nodes from its start to {after:.0f} s after its end")
        return lines
    lines.append(f"likely culprit: {answer.culprit}")
    lines += [f"  {event_line(e, answer.window.end)}" for e in answer.events[:limit]]
    if len(answer.events) > limit:
        lines.append(f"  ... and {len(answer.events) - limit} more events (--json lists them all)")
    if answer.unseen:
        lines.append(f"  no data of {unseen}: Prometheus holds no scrape of them over the job's time")
    return lines


def to_json(answer: Answer) -> dict[str, Any]:
    job = answer.job
    return {
        "job": {"id": job.id, "name": job.name, "user": job.user, "state": job.state, "exit": job.exit,
                "nodes": list(job.nodes), "start": job.start, "end": job.end},
        "verdict": answer.verdict,
        "no_data": list(answer.unseen),
        "culprit": answer.culprit or None,
        "window": {"start": answer.window.start, "until": answer.window.until, "step": answer.window.step},
        "evidence": [{"node": e.node, "check": e.check, "severity": e.severity, "action": e.action,
                      "evidence": e.evidence, "first_seen": e.first, "last_seen": e.last,
                      "seconds_before_end": round(answer.window.end - e.first, 1),
                      "already_at_start": e.at_start} for e in answer.events],
        "queries": answer.queries,
    }
