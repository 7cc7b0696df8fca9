"""What opsctl needs from Slurm, who owns a node's drain, and which Slurm states opsctl leaves alone.

A drain is opsctl's when its reason starts with `opsctl:` and opsctl still holds it. `opsctl:manual ...` is a
drain a person made through `opsctl drain`: opsctl owns the reason text but never resumes it on its own.

The words alone do not make a reason opsctl's. Slurm keeps a node's last reason after a resume (24.11 without
accounting storage, see opsctl/actor/act.py), its own drains keep a reason the node has (`_drain_node()`), and
its own verdicts are appended to it as ` : <note>` (`set_node_reason()`: ` : Not responding`, ` : reboot timed
out`; src/slurmctld/node_mgr.c). So a reason is opsctl's only when its words are, no note but a reboot's own is
appended, and the actor's custody record agrees with Slurm's record of who set the reason and when
(opsctl/actor/custody.py: `custody`, judged by Actor.nodes() for every acting path; None where nobody judged).

Node state names are Slurm's own (`node_state_string`, src/common/slurm_protocol_defs.c), as the
JSON of every release prints them: a base state (IDLE, ALLOCATED, MIXED, DOWN, ...) and flags
(DRAIN, FAIL, MAINTENANCE, RESERVED, REBOOT_REQUESTED, POWERED_DOWN, NOT_RESPONDING, ...).
tests/fixtures/slurm/ holds real outputs of each state from 22.05, 24.11 and 26.05.
"""

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from opsctl.errors import SourceUnavailable
from opsctl.slurm.reach import DOWN, HANDS_OFF, REBOOT, SERVICE, flags_of, holds, reach

if TYPE_CHECKING:
    from opsctl.slurm.accounting import FinishedJob

OWNED_PREFIX = "opsctl:"
MANUAL_PREFIX = "opsctl:manual"
# What opsctl's resume leaves in place of its words where Slurm keeps the last reason (Actor._clear_kept): no
# drain of opsctl's, nothing to resume, and a later drain by Slurm that keeps it is Slurm's.
RESUMED_REASON = "opsctl:resumed"
# How slurmctld appends its own note to a node's reason (set_node_reason(), src/slurmctld/node_mgr.c), and the
# notes that are part of a reboot through Slurm (`scontrol reboot`): any other note is Slurm's own verdict.
SLURM_NOTE = " : "
# slurmctld's own words appended to the reason of a node it reboots (set_node_reason): the request sent, the node
# back, or not back within ResumeTimeout (power_save.c). opsctl's reboot stays opsctl's through them.
REBOOT_TIMED_OUT = "reboot timed out"
REBOOT_NOTES = ("reboot issued", "reboot complete", REBOOT_TIMED_OUT)
# Base states in which a node is out of service whatever its flags say. "invalid" is what Slurm prints
# for a base state its own release does not know (node_state_base_string).
DOWN_STATES = {"down", "fail", "failing", "future", "unknown", "error", "inval", "invalid"}
# Flags that take a node out of service, set by Slurm or a person, never by opsctl: those of the one table
# (opsctl/slurm/reach.py, every flag Slurm 22.05 to 26.05 prints) that hold a node for a reboot, a DOWN or
# another cause, but a reservation's, which leaves the node in service for someone (opsctl keeps off it
# all the same: reach.py). A flag the table does not list (a newer release's) leaves the node in service as
# its base state says, but out of opsctl's reach.
OUT_OF_SERVICE_FLAGS = (flags_of(REBOOT) | flags_of(DOWN) | flags_of(HANDS_OFF)) - {"RESERVED", "RES"}
# Flags that leave a node in service, for the record (the table's say why). DRAIN is opsctl's own business
# (SlurmNode.drained, .owned).
IN_SERVICE_FLAGS = flags_of(SERVICE)
# Base states of a node that runs jobs (sinfo's %T says "draining" for a drained one that still does).
BUSY_STATES = {"allocated", "mixed", "completing", "draining"}
# Base states of a node that opsctl's own drain may be lifted from (the node runs or waits for jobs).
RESUMABLE_STATES = {"idle", "allocated", "mixed", "completing", "drained", "draining", "drain"}


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str  # lower case base state: idle, allocated, mixed, down, ...
    flags: tuple[str, ...] = ()  # upper case: DRAIN, NOT_RESPONDING, ...
    reason: str = ""
    partitions: tuple[str, ...] = ()
    gres: str = ""  # as configured, e.g. "gpu:h200:8(S:0-1)"
    # Slurm's record, not compared (a node read from Slurm equals one described by its state and reason): when
    # slurmd last booted, who set the reason and when (reason_set_by_user, reason_changed_at); None or "" where
    # the release or backend does not say.
    boot_time: float | None = field(default=None, compare=False)
    reason_user: str = field(default="", compare=False)
    reason_time: float | None = field(default=None, compare=False)
    # Whether the actor's custody record and Slurm's record agree that opsctl set this reason
    # (opsctl/actor/custody.py); None: not judged, the words decide.
    custody: bool | None = field(default=None, compare=False)

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags or self.state in ("drained", "draining", "drain")

    @property
    def state_text(self) -> str:
        """The state as Slurm prints it: the base state and its flags, `IDLE+DRAIN`, `DOWN+NOT_RESPONDING`."""
        return "+".join([self.state.upper() or "UNKNOWN", *self.flags])

    @property
    def held_by_slurm(self) -> tuple[str, ...]:
        """The states and flags that put this node out of opsctl's reach (empty when there are none): the one
        table of opsctl/slurm/reach.py, where a flag no release of 22.05-26.05 prints keeps opsctl away too."""
        return tuple(holds(self))

    @property
    def out_of_service(self) -> bool:
        return self.drained or self.state in DOWN_STATES or any(f in OUT_OF_SERVICE_FLAGS for f in self.flags)

    @property
    def slurm_notes(self) -> tuple[str, ...]:
        """The notes slurmctld appended to the reason: 'opsctl:reboot ... : reboot issued' -> ('reboot issued',)."""
        return tuple(self.reason.split(SLURM_NOTE)[1:])

    @property
    def opsctl_words(self) -> bool:
        """The reason reads as one opsctl set and holds: its prefix, not the words a resume left, and no note
        of Slurm's own appended (a reboot's notes are part of opsctl's reboot)."""
        return self.reason.startswith(OWNED_PREFIX) and not self.resume_marker and \
            set(self.slurm_notes) <= set(REBOOT_NOTES)

    @property
    def resume_marker(self) -> bool:
        return self.reason == RESUMED_REASON or self.reason.startswith(RESUMED_REASON + " ")

    @property
    def owned(self) -> bool:
        """opsctl's own reason: its words, and (where the actor judged it) its custody."""
        return self.opsctl_words and self.custody is not False

    @property
    def manual(self) -> bool:
        return self.reason.startswith(MANUAL_PREFIX)

    @property
    def leftover(self) -> bool:
        """opsctl's words on a node in service that opsctl no longer holds (what a resume left, or kept): no
        drain of anyone's, so a new drain may replace them."""
        return self.reason.startswith(OWNED_PREFIX) and not self.owned and not self.out_of_service \
            and not self.held_by_slurm

    @property
    def foreign_reason(self) -> bool:
        """A reason that someone else set: opsctl never changes such a node, whatever its state."""
        return bool(self.reason) and not self.owned and not self.leftover

    @property
    def owner(self) -> str:
        if not self.reason:
            return ""
        if self.manual and self.owned:
            return "opsctl-manual"
        return "opsctl" if self.owned or self.leftover else "other"

    @property
    def runs_jobs(self) -> bool:
        """Jobs run or are ending there (a drained node "drains" until they have)."""
        return self.state in BUSY_STATES or "COMPLETING" in self.flags

    @property
    def has_gpus(self) -> bool:
        """gres lists a gpu (gpu, gpu:8, gpu:h200:8(S:0-1), ...)."""
        return any(item.split(":", 1)[0].split("(", 1)[0] == "gpu" for item in self.gres.split(",") if item)

    @property
    def resumable(self) -> bool:
        """opsctl's own drain, and nothing else holds the node: lifting the drain returns it to service."""
        return self.drained and self.owned and not self.manual and self.state in RESUMABLE_STATES \
            and not self.held_by_slurm

    @property
    def down_for_reboot(self) -> bool:
        """A reboot asked for or under way, or slurmd not answering (yet)."""
        return bool(set(self.flags) & {"REBOOT_REQUESTED", "REBOOT_ISSUED", "NOT_RESPONDING"})

    @property
    def back_from_reboot(self) -> bool:
        """DOWN with opsctl's own reason after a reboot through Slurm (nextstate=DOWN): slurmd registered
        again, nothing else holds it. Like a drain, only opsctl's own resume puts it back."""
        return self.state == "down" and not self.reboot_timed_out and reach(self, down_ok=True).ok

    @property
    def reboot_timed_out(self) -> bool:
        """slurmctld gave up on the reboot (ResumeTimeout passed with no registration after it): the node may
        never have rebooted, so it is not back from one, whatever it answers now."""
        return REBOOT_TIMED_OUT in self.slurm_notes

    def reason_rules(self) -> list[str]:
        """'opsctl:xid-79,ib-down gpu3 ...' -> ['xid-79', 'ib-down']."""
        if not self.owned or self.manual:
            return []
        head = self.reason[len(OWNED_PREFIX):].split(" ", 1)[0]
        return [rule for rule in head.split(",") if rule]

    def same_as(self, other: "SlurmNode") -> bool:
        """What a planned change rests on is unchanged (compare and set): the flags, the reason, and whether
        the base state is in service. A busy node moves between idle, mixed and allocated all the time;
        comparing those would postpone its drain run after run."""
        return (set(self.flags), self.reason, self.state in DOWN_STATES) == \
            (set(other.flags), other.reason, other.state in DOWN_STATES)


class Slurm(Protocol):
    """Errors: SourceUnavailable when Slurm cannot be read or does not accept a change."""

    def nodes(self) -> dict[str, SlurmNode]: ...

    def drain(self, names: list[str], reason: str) -> None: ...

    def resume(self, names: list[str]) -> None: ...

    def set_reason(self, names: list[str], reason: str) -> None: ...

    def reboot(self, names: list[str], reason: str) -> None:
        """Reboot the nodes once their jobs end, and leave them DOWN with `reason` when they are back:
        what put them back in service is opsctl's own resume, after its checks (nextstate=RESUME would let
        registration do it before any check)."""
        ...

    def return_to_service(self) -> int:
        """slurm.conf's ReturnToService as slurmctld runs it. At 2 a node that registers after a reboot goes
        back to service whatever `nextstate` said, before its checks ran: the actor refuses reboots then."""
        ...

    def expand(self, hostlist: str) -> list[str]: ...


@dataclass(frozen=True)
class JobSpec:
    """One of opsctl's own jobs: a command on one whole node, in a partition of its own."""

    name: str
    node: str
    partition: str
    command: str  # run by sbatch --wrap, through /bin/sh on the node
    minutes: int  # the job's time limit
    reservation: str = ""  # run inside this reservation (opsctl validate --preflight's own)


@dataclass(frozen=True)
class StepSpec:
    """One command on several whole nodes at once, one task per node (srun), its output back to opsctl:
    the preflight's multi-node tests. `env` is set in each task after Slurm's own (CUDA_VISIBLE_DEVICES)."""

    name: str
    nodes: tuple[str, ...]
    partition: str
    reservation: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    minutes: int
    mpi: str  # srun --mpi: pmix for nccl-tests built with MPI=1
    gpus_per_node: int


@dataclass(frozen=True)
class Job:
    id: str
    state: str  # squeue's %T: PENDING, RUNNING, COMPLETING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    reason: str = ""  # squeue's %r: why it pends (Resources, Priority, ...), or None


@dataclass(frozen=True)
class RunningJob:
    """Any user's job that runs now, as squeue prints it (opsctl job-health)."""

    id: str  # 4242, or an array task's 4242_7
    name: str
    user: str
    nodes: tuple[str, ...]
    start: float | None  # Unix seconds; None where squeue does not say


class NodesBusy(SourceUnavailable):
    """A reservation asked for a node that runs a job ("Requested nodes are busy")."""


ENDED_JOB_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
                    "DEADLINE", "OUT_OF_MEMORY"}


class SlurmJobs(Protocol):
    """Submits, reads and cancels opsctl's own jobs, and lists everyone's running ones. Errors: SourceUnavailable."""

    def submit(self, spec: JobSpec) -> str: ...

    def queued(self, ids: list[str]) -> dict[str, Job]:
        """The jobs of `ids` that slurmctld still knows (an ended job stays MinJobAge seconds)."""
        ...

    def cancel(self, ids: list[str]) -> None: ...

    def running_jobs(self) -> list[RunningJob]:
        """Every user's running jobs, with their nodes (opsctl job-health): not only opsctl's own."""
        ...


class SlurmReservations(SlurmJobs, Protocol):
    """opsctl validate --preflight: a maintenance reservation of its own, steps run inside it, and the
    hand-over of the good nodes to the caller. Errors: SourceUnavailable (NodesBusy when a node of a new
    reservation runs a job)."""

    def reserve(self, name: str, nodes: list[str], minutes: int) -> None:
        """A reservation from now on, MAINT, for root only: users' jobs cannot start on its nodes."""
        ...

    def hand_over(self, name: str, nodes: list[str], users: list[str], minutes: int) -> None:
        """The reservation keeps only `nodes`, for `users`, no longer MAINT, `minutes` from its start."""
        ...

    def release(self, name: str) -> None: ...

    def run_step(self, spec: StepSpec, timeout: float) -> tuple[int, str]:
        """The step's exit code and the standard output of its tasks (nccl-tests: rank 0's only)."""
        ...


class SlurmAccounting(Protocol):
    """Ended jobs from Slurm's accounting (sacct, slurmdbd). Errors: SourceUnavailable."""

    def finished_job(self, job_id: str) -> "FinishedJob | None":
        """The job as accounting holds it (ended or not); None when accounting has no such job."""
        ...

    def finished_jobs(self, since: float, until: float) -> "list[FinishedJob]":
        """Every user's jobs that ran at some point between `since` and `until` (Unix seconds)."""
        ...


def load_slurm_json(text: str, where: str, harmless: tuple[str, ...] = ()) -> dict[str, Any]:
    """A Slurm command's JSON object; its `errors` list, when not empty, raised as the first error's words,
    but for the errors whose `description` is one of `harmless`."""
    try:
        data = json.loads(text)
    except ValueError:
        raise SourceUnavailable(f"{where}: output is not JSON") from None
    if not isinstance(data, dict):
        raise SourceUnavailable(f"{where}: output is not a JSON object")
    errors = [e for e in data.get("errors") or [] if not (isinstance(e, dict) and e.get("description") in harmless)]
    if errors:
        first = errors[0]
        said = first.get("error") or first.get("description") if isinstance(first, dict) else first
        raise SourceUnavailable(f"{where}: Slurm reported an error: {said}")
    return data
