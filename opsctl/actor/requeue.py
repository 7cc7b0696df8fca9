"""The one way opsctl requeues a job (opsctl/recover/ decides; nothing else calls the Slurm client's
requeue_excluding: tests/unit/test_recover.py fails if something does).

As the Actor (actor/act.py) does for nodes, for each job:
1. lock: <state dir>/requeue.lock, waited for a while (two epilog runs may explain jobs at once); not the run
   lock, so that a requeue never waits for, or stops, an acting `opsctl health` or `remediate`;
2. compare and set: slurmctld is read again, and a job that no longer shows what the decision rested on (its
   state, restart count and excluded nodes: someone requeued, released or edited it meanwhile) is left alone,
   audited as `requeue-refused`;
3. intent: the requeue is written to requeues.json (the job's cap, the hourly budget and the breaker count
   it) before scontrol runs, so that a crash after it never requeues the job past its cap;
4. scontrol: hold, exclude, release (slurm/requeue.py);
5. audit: a `requeue` record on the culprit node with `reason` "job N", so that both `opsctl history NODE`
   and `opsctl history --job N` show it; `requeue-failed` when scontrol said no (the intent stays counted).
"""

import contextlib
from dataclasses import dataclass
from types import TracebackType

from opsctl.actor.ledger import Ledger
from opsctl.actor.lock import RunLock
from opsctl.config.schema import Config
from opsctl.errors import OpsctlError, SourceUnavailable
from opsctl.slurm.requeue import QueuedJob, SlurmRequeue

REQUEUE, REFUSED, FAILED = "requeue", "requeue-refused", "requeue-failed"
LOCK = "requeue.lock"
LOCK_WAIT_S = 60.0


@dataclass(frozen=True)
class Requeue:
    seen: QueuedJob  # slurmctld's job as the decision saw it: requeued only if it still shows this
    culprit: str
    excluded: str  # the job's new ExcNodeList: what it had, and the culprit
    checks: tuple[str, ...] = ()
    evidence: str = ""
    detail: str = ""

    @property
    def job(self) -> str:
        return self.seen.id


def job_reason(job: str) -> str:
    """The audit records' `reason` of everything opsctl did about a job (`opsctl history --job`)."""
    return f"job {job}"


class Requeuer:
    """`with Requeuer(config, slurm, now) as requeuer: requeuer.requeue(plan)`."""

    def __init__(self, config: Config, slurm: SlurmRequeue, now: float):
        self.slurm, self.now = slurm, now
        self.ledger = Ledger(config)
        self.state = self.ledger.state
        self._lock = RunLock(config.state_dir, LOCK, wait=LOCK_WAIT_S)

    def __enter__(self) -> "Requeuer":
        self._lock.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._lock.__exit__(kind, err, trace)

    def refuse(self, job: str, culprit: str, detail: str, checks: tuple[str, ...] = (), evidence: str = "") -> None:
        self.ledger.audit(REFUSED, node=culprit, checks=checks, evidence=evidence, reason=job_reason(job),
                          detail=detail, now=self.now)

    def requeue(self, plan: Requeue) -> str:
        """Requeue the job without its culprit; "" when done, else why not (audited either way)."""
        current = self.slurm.queued_job(plan.job)
        if current is None or (current.state, current.restarts, current.excluded) != (
                plan.seen.state, plan.seen.restarts, plan.seen.excluded):
            now_is = "gone from slurmctld" if current is None else f"now {current.state}, {current.restarts} restarts"
            why = f"changed: Slurm changed the job since the decision ({now_is})"
            self.refuse(plan.job, plan.culprit, why, plan.checks, plan.evidence)
            return why
        self.state.requeues.record(plan.job, plan.culprit, self.now)
        try:
            self.slurm.requeue_excluding(plan.job, plan.excluded, pending=current.state == "PENDING")
        except SourceUnavailable as err:
            with contextlib.suppress(OpsctlError):
                self.ledger.audit(FAILED, node=plan.culprit, checks=plan.checks, reason=job_reason(plan.job),
                                  detail=f"{plan.detail}; scontrol: {err}", now=self.now)
            raise
        self.ledger.audit(REQUEUE, node=plan.culprit, checks=plan.checks, evidence=plan.evidence,
                          reason=job_reason(plan.job), detail=plan.detail, now=self.now)
        return ""
