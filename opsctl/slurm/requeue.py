"""A job as slurmctld holds it, and its requeue without some nodes (opsctl/recover/).

squeue, not `scontrol show job`: that prints `Key=value` pairs with the job's name and comment unquoted, so a
user could write `Requeue=1` into either; squeue's fields come in the order asked, the comment last, whole.
Two calls, because `-o` has no letter for the requeue flag, the restart count or the batch flag, and `-O`
has no field for the excluded nodes or the QOS (squeue(1), 22.05; the same letters and fields in 26.05).
An ended job stays in slurmctld's memory MinJobAge seconds (300 by default): after that it cannot be
requeued, and `job()` says None.

The requeue is Slurm's hold, exclude, release (scontrol(1)): `requeuehold` puts an ended batch job back
to PENDING, held, so that it cannot start before the exclusion is set; `update JobId= ExcNodeList=`; then
`release`. slurmctld makes a requeued job eligible only `cred_expire + 1` seconds later (121 s by default:
the previous run's credentials on its nodes expire first), which opsctl leaves as it is. A job that Slurm
requeued itself (a NODE_FAIL of a job with the requeue flag) is pending already: `hold` takes its place.
"""

from dataclasses import dataclass
from typing import Protocol

from opsctl.errors import SourceUnavailable

# `-o` letters: id, state, partition, QOS, excluded nodes, required nodes, comment (last: it may hold "|").
QUEUE_FORMAT = "%i|%T|%P|%q|%x|%n|%k"
# `-O` fields, each followed by "|": their width pads with spaces, stripped.
FLAGS_FORMAT = "JobID:|,Requeue:|,RestartCnt:|,BatchFlag:|"
GONE = "Invalid job id specified"


@dataclass(frozen=True)
class QueuedJob:
    id: str
    state: str  # RUNNING, PENDING, FAILED, NODE_FAIL, ...
    partition: str
    qos: str
    excluded: str  # the job's ExcNodeList, a hostlist expression ("" none)
    required: str  # its ReqNodeList (--nodelist)
    comment: str
    requeue: bool  # the job may be requeued (--requeue, or slurm.conf JobRequeue=1 without --no-requeue)
    restarts: int  # how often Slurm has requeued it, anyone's requeues alike
    batch: bool  # an sbatch job: Slurm requeues batch jobs only


class SlurmRequeue(Protocol):
    """Reads one job from slurmctld and requeues it. Errors: SourceUnavailable."""

    def queued_job(self, job_id: str) -> QueuedJob | None:
        """The job as slurmctld holds it; None once it left slurmctld's memory (MinJobAge)."""
        ...

    def requeue_excluding(self, job_id: str, excluded: str, pending: bool) -> None:
        """Hold the job (`pending`: it already is; else requeue it held), set its ExcNodeList to `excluded`,
        release it. The release is tried even when the exclusion failed: a held job waits for a person."""
        ...


def _flag(text: str, where: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "yes", "true"):
        return True
    if value in ("0", "no", "false"):
        return False
    raise SourceUnavailable(f"Slurm: {where} printed {text.strip()[:40]!r}, not 0 or 1")


def _none(text: str) -> str:
    return "" if text in ("(null)", "None", "N/A") else text


def parse_queued_job(queue: str, flags: str, job_id: str) -> QueuedJob | None:
    """The two squeue answers for `job_id` (QUEUE_FORMAT and FLAGS_FORMAT, no header) -> the job."""
    row = next((line.split("|", 6) for line in queue.splitlines() if line.split("|", 1)[0] == job_id), None)
    flag_row = next(([f.strip() for f in line.split("|")] for line in flags.splitlines()
                     if line.split("|", 1)[0].strip() == job_id), None)
    if row is None or flag_row is None:
        return None
    if len(row) != 7 or len(flag_row) < 4:
        raise SourceUnavailable(f"Slurm: squeue printed {'|'.join(row)[:80]!r} for job {job_id}, not its fields")
    try:
        restarts = int(flag_row[2])
    except ValueError:
        raise SourceUnavailable(f"Slurm: squeue printed restart count {flag_row[2][:20]!r} for job {job_id}") \
            from None
    where = f"squeue -O for job {job_id}"
    return QueuedJob(id=job_id, state=row[1], partition=row[2], qos=_none(row[3]), excluded=_none(row[4]),
                     required=_none(row[5]), comment=row[6].rstrip("\n"), requeue=_flag(flag_row[1], where),
                     restarts=restarts, batch=_flag(flag_row[3], where))
