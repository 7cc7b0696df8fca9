"""Whether a failed job is requeued without its culprit: pure, so that tests give it any job and answer.

A job is requeued only when all of these hold, in this order (docs/recover.md):
  1. it ended FAILED or NODE_FAIL: never a job a person cancelled, one that timed out or completed;
  2. it opted in: `--comment=opsctl:recover` (a word of its comment), or the site's policy covers it
     (`recover.all_jobs`, its partition in `recover.partitions`, its QOS in `recover.qos`). A job that did not
     opt in is none of opsctl's business: no audit record;
  3. `opsctl why` names a culprit by a failure whose rule drains (or opsctl's own drain of it): never on
     "no evidence", "no data", a warning, or a report-only failure, which a job's own bug can explain;
  4. Slurm can requeue it: a batch job, with its requeue flag, still held by slurmctld (MinJobAge: a job
     gone from it took its comment, partition and QOS along, so that only `recover.all_jobs` can tell it
     opted in), not running again, and not asking for the culprit by name (`--nodelist`: excluded, it could
     never start);
  5. the limits: `recover.max_requeues` per job, `recover.max_requeues_per_hour` for the cluster, and the
     breaker: as many different nodes blamed within the hour as would stop `opsctl health`'s drains
     (safety.breaker_min_nodes, safety.breaker_fraction) mean a shared fault, which requeues cannot outrun.
From step 3 on, a job that opted in and is not requeued gets a `requeue-refused` record saying why.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass

from opsctl.config.schema import Config
from opsctl.health.plan import breaker_limit
from opsctl.slurm.accounting import FinishedJob
from opsctl.slurm.hostlist import expand_hostlist, hostlist_expression
from opsctl.slurm.requeue import QueuedJob
from opsctl.why.evidence import Event
from opsctl.why.verdict import Answer

RECOVERABLE_STATES = ("FAILED", "NODE_FAIL")
OPT_IN_WORD = "opsctl:recover"
# slurmctld's states of a job that ended and may be requeued; PENDING: Slurm requeued it itself (NODE_FAIL).
REQUEUEABLE_STATES = {"FAILED", "NODE_FAIL", "PENDING"}
# The events that blame a node enough to requeue without it: a rule that drains, or opsctl's drain itself.
BLAMING = ("fail", "drain")


@dataclass(frozen=True)
class Decision:
    culprit: str = ""
    event: Event | None = None
    refused: str = ""  # why not, when the job opted in; "" with no excluded: not opsctl's business
    excluded: str = ""  # the new ExcNodeList when it is requeued
    opted_in_by: str = ""

    @property
    def requeue(self) -> bool:
        return bool(self.excluded) and not self.refused


def opted_in_by(job: QueuedJob, config: Config) -> str:
    """How the job opted in, in words; "" when it did not."""
    policy = config.recover
    if OPT_IN_WORD in re.split(r"[\s,;]+", job.comment):
        return f"--comment={OPT_IN_WORD}"
    if policy.all_jobs:
        return "recover.all_jobs"
    if job.partition in policy.partitions:
        return f"partition {job.partition} (recover.partitions)"
    if job.qos and job.qos in policy.qos:
        return f"QOS {job.qos} (recover.qos)"
    return ""


def blamed(answer: Answer) -> Event | None:
    """The culprit's event when it blames the node enough (BLAMING); None otherwise."""
    if not answer.events:
        return None
    first = answer.events[0]
    return first if (first.severity, first.action) == BLAMING else None


def decide(job: FinishedJob, answer: Answer, queued: QueuedJob | None, config: Config,
           requeues: dict[str, list[dict[str, object]]], recent: list[dict[str, object]],
           cluster_nodes: Callable[[], int]) -> Decision:
    """`queued`: slurmctld's job (None: it left slurmctld's memory); `requeues`: job id -> opsctl's requeues of
    it (requeues.json); `recent`: every requeue of the last hour; `cluster_nodes`: Slurm's node count, asked
    only when the breaker is reached."""
    if not config.recover.enabled or job.state not in RECOVERABLE_STATES:
        return Decision()
    if queued is None:
        # Its comment, partition and QOS went with it: only a site where every job opts in knows it did.
        event = blamed(answer) if config.recover.all_jobs else None
        return Decision(culprit=event.node if event else "", event=event, refused=(
            "cannot requeue: slurmctld no longer holds the job (it ended more than MinJobAge ago)") if event else "")
    how = opted_in_by(queued, config)
    if not how:
        return Decision()
    event = blamed(answer)
    if event is None:
        said = f"{answer.events[0].check} on {answer.culprit} is not a failure that drains" if answer.events \
            else answer.verdict
        return Decision(refused=f"not requeued: no node to blame ({said})", opted_in_by=how)
    culprit = event.node
    done = len(requeues.get(job.id, []))
    blamed_nodes = {str(entry.get("culprit")) for entry in recent} | {culprit}
    # Two nodes never trip it (safety.breaker_min_nodes is at least 0): Slurm is asked only past that.
    limit = breaker_limit(config.safety, cluster_nodes()) if len(blamed_nodes) > config.safety.breaker_min_nodes \
        else float(config.safety.breaker_min_nodes)
    refused = (
        "not a batch job: Slurm requeues batch jobs only" if not queued.batch else
        "submitted with --no-requeue (or slurm.conf sets JobRequeue=0 and it did not ask --requeue)"
        if not queued.requeue else
        f"already {queued.state} again" if queued.state not in REQUEUEABLE_STATES else
        f"the job asks for {culprit} by name (--nodelist): without it, it could never start"
        if culprit in expand_hostlist(queued.required) else
        f"requeued {'once' if done == 1 else f'{done} times'} already (recover.max_requeues "
        f"{config.recover.max_requeues})"
        if done >= config.recover.max_requeues else
        f"the budget is spent: {len(recent)} requeues in the last hour (recover.max_requeues_per_hour "
        f"{config.recover.max_requeues_per_hour})" if len(recent) >= config.recover.max_requeues_per_hour else
        f"circuit breaker: {len(blamed_nodes)} different nodes blamed for failed jobs within the hour (limit "
        f"{limit:g}): a shared fault, which requeues cannot outrun" if len(blamed_nodes) > limit else "")
    excluded = ",".join(hostlist_expression(set(expand_hostlist(queued.excluded)) | {culprit}))
    return Decision(culprit=culprit, event=event, refused=refused and f"not requeued: {refused}",
                    excluded="" if refused else excluded, opted_in_by=how)
