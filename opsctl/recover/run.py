"""Requeue a failed job without its culprit, right after `opsctl why --spool` recorded its answer: the path
that slurmctld's EpilogSlurmctld starts for every job that did not end cleanly (docs/recover.md). The
decision is opsctl.recover.policy's; the requeue goes through the actor's Requeuer (actor/requeue.py)."""

import time
from dataclasses import dataclass

from opsctl.actor.requeue import Requeue, Requeuer
from opsctl.clients import Clients
from opsctl.recover.policy import RECOVERABLE_STATES, Decision, decide
from opsctl.slurm.accounting import FinishedJob
from opsctl.why.verdict import Answer

# slurmctld makes a requeued job eligible cred_expire + 1 seconds later (slurm/requeue.py).
ELIGIBLE_AFTER = "AuthInfo cred_expire + 1 s (121 s by default)"


@dataclass(frozen=True)
class Recovery:
    job: str
    culprit: str
    requeued: bool
    why: str  # the audit record's detail


def recover_job(clients: Clients, answer: Answer) -> Recovery | None:
    """Requeue `answer`'s job without its culprit when the policy says so; None when the job is none of
    opsctl's business (it did not fail, or did not opt in). Errors: SourceUnavailable (Slurm unreadable),
    StateUnwritable (the state or the audit log)."""
    config = clients.config(acting=True)
    job = answer.job
    if not config.recover.enabled or job.state not in RECOVERABLE_STATES:
        return None
    slurm = clients.requeues()
    now = time.time()
    with Requeuer(config, slurm, now) as requeuer:
        queued = slurm.queued_job(job.id)
        requeues = requeuer.state.requeues.load()
        recent = requeuer.state.requeues.recent(requeues, now)
        decision = decide(job, answer, queued, config, requeues, recent, lambda: len(clients.slurm().nodes()))
        if not decision.refused and not decision.requeue:
            return None
        checks, evidence = _blame(decision)
        if decision.refused:
            requeuer.refuse(job.id, decision.culprit, decision.refused, checks, evidence)
            return Recovery(job.id, decision.culprit, False, decision.refused)
        assert queued is not None  # decide() requeues only a job that slurmctld holds
        done = len(requeues.get(job.id, [])) + 1
        detail = (f"{_headline(job)}: likely culprit {decision.culprit} ({', '.join(checks)}); requeued without it "
                  f"(ExcNodeList={decision.excluded}), requeue {done} of {config.recover.max_requeues}, opted in by "
                  f"{decision.opted_in_by}; eligible again in {ELIGIBLE_AFTER}")
        refused = requeuer.requeue(Requeue(seen=queued, culprit=decision.culprit, excluded=decision.excluded,
                                           checks=checks, evidence=evidence, detail=detail))
        return Recovery(job.id, decision.culprit, not refused, refused or detail)


def _blame(decision: Decision) -> tuple[tuple[str, ...], str]:
    event = decision.event
    return ((event.check,), event.evidence) if event else ((), "")


def _headline(job: FinishedJob) -> str:
    return f"job {job.id} {job.state}" + (f" ({job.exit})" if job.exit else "")
