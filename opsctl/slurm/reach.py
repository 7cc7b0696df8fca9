"""May opsctl touch this node? One judgement, from every Slurm state and flag, for every path that changes a
node: the health run's drains and resumes, the remediation ladder's every step (RMA included), the rollout,
`node check --drain-self` and the node's own ladder step.

Each base state and flag that Slurm 22.05 to 26.05 prints (node_state_string() and node_state_flags[] in
src/common/slurm_protocol_defs.c; the JSON names of src/plugins/data_parser/v0.0.*/parsers.c) has one row in
STATES or FLAGS below, with what it means for opsctl:

  SERVICE    no bearing: the node runs or waits for jobs, or the flag is a request, not a state;
  DRAIN      opsctl's business when the reason is its own (SlurmNode.owned), a person's otherwise;
  DOWN       out of service: opsctl's only when it is opsctl's own reboot coming back (nextstate=DOWN with
             opsctl's reason, nothing else set); anyone else's DOWN is hands off;
  REBOOT     a reboot asked for or under way: wait, when it is opsctl's own (its reason is opsctl's reboot
             step), hands off otherwise (someone else's `scontrol reboot`);
  HANDS_OFF  Slurm or a person holds the node for another cause (failing, powered down or powering,
             maintenance, a reservation, a bad registration, no slurmd): opsctl never changes it.

A name that no release of the range prints (a newer release's flag) is HANDS_OFF: opsctl does not act on a
state it cannot read. docs/remediation.md has the table as the ladder, the health run and the rollout apply it;
tests/unit/test_slurm_reach.py checks that every name is listed and that the doc agrees.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opsctl.slurm.base import SlurmNode

SERVICE, DRAIN, DOWN, REBOOT, HANDS_OFF = "service", "drain", "down", "reboot", "hands-off"

# Base states, lower case as SlurmNode.state holds them (sinfo's %T adds drained/draining/drain for IDLE or
# busy nodes with the DRAIN flag).
STATES: dict[str, tuple[str, str]] = {
    "idle": (SERVICE, "waits for jobs"),
    "allocated": (SERVICE, "runs jobs"),
    "mixed": (SERVICE, "runs jobs on part of the node"),
    "completing": (SERVICE, "jobs ending"),
    "drained": (DRAIN, "drained, no job left (sinfo)"),
    "draining": (DRAIN, "drained, jobs still run (sinfo)"),
    "drain": (DRAIN, "drained (sinfo -o %t)"),
    "down": (DOWN, "out of service: slurmd lost, or set DOWN by Slurm, a person or a reboot's nextstate"),
    "fail": (HANDS_OFF, "FAIL as a base state (sinfo prints it so for DOWN+FAIL)"),
    "failing": (HANDS_OFF, "FAIL with jobs still running (sinfo)"),
    "future": (HANDS_OFF, "configured, not yet in service"),
    "unknown": (HANDS_OFF, "slurmctld does not know yet (after its restart)"),
    "error": (HANDS_OFF, "ERROR: a node reported an error"),
    "inval": (HANDS_OFF, "registered with fewer resources than configured (sinfo)"),
    "invalid": (HANDS_OFF, "a base state this release does not know"),
    "maint": (HANDS_OFF, "in a maintenance reservation (sinfo)"),
    "reserved": (HANDS_OFF, "in an advanced reservation (sinfo resv)"),
    "resv": (HANDS_OFF, "in an advanced reservation (sinfo)"),
    "planned": (SERVICE, "the backfill planned a job on it"),
    "powered_down": (HANDS_OFF, "powered down (sinfo)"),
    "powering_up": (HANDS_OFF, "powering up (sinfo)"),
    "powering_down": (HANDS_OFF, "powering down (sinfo)"),
    "reboot_issued": (REBOOT, "rebooting (sinfo)"),
    "reboot_requested": (REBOOT, "a reboot pending (sinfo)"),
    "blocked": (SERVICE, "24.05+: blocked by a job's exclusive topology"),
}

FLAGS: dict[str, tuple[str, str]] = {
    "DRAIN": (DRAIN, "drained: whose, its reason says"),
    "COMPLETING": (SERVICE, "jobs ending"),
    "CLOUD": (SERVICE, "a cloud node; the power flags say whether it is up"),
    "DYNAMIC_NORM": (SERVICE, "a dynamic node registered as a normal one"),
    "PLANNED": (SERVICE, "the backfill planned a job on it"),
    "BLOCKED": (SERVICE, "24.05+: blocked by a job's exclusive topology"),
    "PERFCTRS": (SERVICE, "23.x: Cray network performance counters in use (NET)"),
    "NET": (SERVICE, "older name of PERFCTRS"),
    "RESUME": (SERVICE, "a resume request, not a state"),
    "UNDRAIN": (SERVICE, "an undrain request, not a state"),
    "REBOOT_REQUESTED": (REBOOT, "a reboot pending once its jobs end"),
    "REBOOT_ISSUED": (REBOOT, "a reboot under way"),
    "NOT_RESPONDING": (REBOOT, "slurmd does not answer: a reboot under way, or a node lost"),
    "NO_RESPOND": (REBOOT, "older name of NOT_RESPONDING"),
    "REBOOT_CANCELED": (HANDS_OFF, "a pending reboot being cancelled by someone"),
    "REBOOT_CANCEL": (HANDS_OFF, "older name of REBOOT_CANCELED"),
    "FAIL": (HANDS_OFF, "to fail soon: no new jobs (scontrol update state=fail)"),
    "MAINTENANCE": (HANDS_OFF, "in a maintenance reservation (JSON)"),
    "MAINT": (HANDS_OFF, "in a maintenance reservation (sinfo, scontrol)"),
    "RESERVED": (HANDS_OFF, "in an advanced reservation for someone"),
    "RES": (HANDS_OFF, "older name of RESERVED"),
    "POWERED_DOWN": (HANDS_OFF, "powered off by the power saving"),
    "POWERING_DOWN": (HANDS_OFF, "on its way off"),
    "POWER_DOWN": (HANDS_OFF, "asked to power off"),
    "POWER_DRAIN": (HANDS_OFF, "power off as soon as its jobs end (scontrol power down asap)"),
    "POWER_DOWN_ASAP": (HANDS_OFF, "26.05 JSON: POWER_DOWN with POWER_DRAIN"),
    "POWER_DOWN_FORCE": (HANDS_OFF, "26.05 JSON: POWER_DOWN with POWERED_DOWN"),
    "POWERING_UP": (HANDS_OFF, "off and being powered up"),
    "POWER_UP": (HANDS_OFF, "asked to power up"),
    "INVALID_REG": (HANDS_OFF, "registered with fewer resources than configured"),
    "DYNAMIC_FUTURE": (HANDS_OFF, "a dynamic node's slot no slurmd registered for yet"),
    "EXTERNAL": (HANDS_OFF, "25.05+: a node without slurmd, outside Slurm's running of jobs"),
    # Base states, should a parser ever find one among the flags (a release that lists them in another
    # order, 24.11's JSON state list): the node still counts as what Slurm says it is.
    "DOWN": (DOWN, "a base state"),
    "IDLE": (SERVICE, "a base state"),
    "ALLOCATED": (SERVICE, "a base state"),
    "MIXED": (SERVICE, "a base state"),
    "FUTURE": (HANDS_OFF, "a base state"),
    "UNKNOWN": (HANDS_OFF, "a base state"),
    "ERROR": (HANDS_OFF, "a base state"),
    "INVAL": (HANDS_OFF, "a base state"),
    "INVALID": (HANDS_OFF, "a base state"),
}


def flags_of(kind: str) -> frozenset[str]:
    return frozenset(name for name, (what, _) in FLAGS.items() if what == kind)


def flag_kind(flag: str) -> str:
    return FLAGS.get(flag, (HANDS_OFF, ""))[0]


def state_kind(state: str) -> str:
    return STATES.get(state, (HANDS_OFF, ""))[0]


TOUCH, WAIT = "touch", "wait"


@dataclass(frozen=True)
class Reach:
    """The judgement: `touch` (opsctl may change the node), `wait` (its own reboot is under way) or
    `hands-off`, and why in words."""

    verdict: str
    why: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict == TOUCH


def holds(node: "SlurmNode", down_ok: bool = False, rebooting: bool = False) -> list[str]:
    """The state and flags of `node` that keep opsctl away. `down_ok`: the node is back from a reboot opsctl
    asked for (nextstate=DOWN leaves it DOWN with opsctl's reason), so DOWN is no hold; `rebooting`: that
    reboot may still be under way, so its own flags are no hold either (reach() says wait)."""
    def holding(kind: str) -> bool:
        return kind == HANDS_OFF or (kind == DOWN and not (down_ok or rebooting)) or (kind == REBOOT and not rebooting)

    held = [node.state.upper()] if holding(state_kind(node.state)) else []
    return held + [flag for flag in node.flags if holding(flag_kind(flag))]


def reach(node: "SlurmNode", take: bool = False, down_ok: bool = False, rebooting: bool = False) -> Reach:
    """May opsctl change `node` now? `take`: opsctl would take a node in service out (a new drain): no reason
    at all, or its own, is needed then; for every other change (a resume, a ladder step, a re-wording, a
    reboot) the reason must be opsctl's own and automatic (not `opsctl:manual`). `down_ok` and `rebooting`
    as for holds(): only for a node whose reason is opsctl's reboot, or the answer to it."""
    # opsctl's words that a resume left on a node in service hold nothing: a new drain replaces them.
    if node.reason and not node.owned and not (take and node.leftover):
        return Reach(HANDS_OFF, f"not-owned: {node.state_text} with a reason opsctl did not set")
    if not take and not node.owned:
        return Reach(HANDS_OFF, "not-owned: no opsctl reason")
    if node.manual:
        return Reach(HANDS_OFF, "manual: a person's drain through opsctl drain")
    held = holds(node, down_ok, rebooting)
    if held and take:  # a node in service to be taken out: its whole state says more than what holds it
        return Reach(HANDS_OFF, f"slurm-state: Slurm holds it {node.state_text}")
    if held:
        return Reach(HANDS_OFF, f"slurm-state: held by Slurm: {'+'.join(held)}")
    if rebooting and (state_kind(node.state) == REBOOT or any(flag_kind(f) == REBOOT for f in node.flags)):
        return Reach(WAIT, "rebooting: the reboot opsctl asked for is under way")
    if take and node.out_of_service:
        return Reach(HANDS_OFF, f"slurm-state: Slurm holds it {node.state_text}")
    return Reach(TOUCH)
