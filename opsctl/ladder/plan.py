"""Pure decisions of `opsctl remediate`: the next step of each node on the remediation ladder.

Nothing here talks to Slurm; `opsctl.ladder.remediate` reads what this needs and carries out the plan
through the actor. The steps and their reasons are opsctl/ladder/reasons.py's; docs/remediation.md
has the ladder as a whole.

Safety, as for drains: a node with any reason opsctl did not set, a person's `opsctl:manual` drain, a node
held by Slurm for another cause (a maintenance reservation, a reboot someone else asked for, DOWN not by
opsctl's reboot) and a node under `opsctl hold` are never touched. Resets and reboots have budgets per run
and per hour. The circuit breaker counts every node that would need a reset or reboot now or is in the
middle of one: when that is more than the health run's breaker allows, nothing is reset or rebooted (a
shared fault, or broken monitoring, is no hardware fault of many nodes at once).
"""

import calendar
import re
import time
from dataclasses import dataclass, field
from typing import Any

from opsctl.actor.act import RESUME, RETURN_TO_SERVICE_2, cap_reason
from opsctl.config.schema import Config, duration_seconds
from opsctl.health.ladder_reason import ladder_reach
from opsctl.health.plan import counted_nodes
from opsctl.health.xid import XidCatalog
from opsctl.ladder.hold import is_held, without_hold
from opsctl.ladder.reasons import (
    BOARD_RESTARTS,
    POWER_CYCLE,
    REBOOT,
    RESET,
    RMA,
    UNVALIDATED,
    VALIDATED,
    Fault,
    Rung,
    fault_of,
    needed_action,
    rung_of,
    step_reason,
)
from opsctl.slurm.base import SlurmNode
from opsctl.slurm.reach import HANDS_OFF

WAIT = "wait"  # nothing to do this run: a step under way, or the node runs jobs


@dataclass(frozen=True)
class LadderDecision:
    node: str
    action: str  # reset | reboot | power-cycle | resume | rma | unvalidated | wait | skip:<why>, would-<...> in a dry
    # run
    fault: Fault | None = None
    reason: str = ""  # the reason the step sets
    detail: str = ""  # why, in words
    seen: SlurmNode | None = None

    @property
    def changes(self) -> bool:
        return self.action in (RESET, REBOOT, POWER_CYCLE, RESUME, RMA, UNVALIDATED)


@dataclass
class LadderPlan:
    decisions: list[LadderDecision] = field(default_factory=list)
    stop: str = ""  # a safety limit stopped (part of) the run: exit 4
    breaker: bool = False

    def changing(self) -> list[LadderDecision]:
        return [d for d in self.decisions if d.changes]


@dataclass(frozen=True)
class Budgets:
    """The steps already taken in the last hour (State.recent)."""

    resets: int = 0
    reboots: int = 0
    resumes: int = 0


def plan_ladder(cluster: dict[str, SlurmNode], catalog: XidCatalog, records: list[dict[str, Any]],
                holds: set[str], budgets: Budgets, config: Config, now: float) -> LadderPlan:
    plan = LadderPlan()
    wanted: list[LadderDecision] = []
    in_flight = 0
    for name, node in sorted(cluster.items()):
        decision = _next(name, node, catalog, records, holds, config, now)
        if decision is None:
            continue
        rung = rung_of(node)
        if rung is not None and rung.step in (RESET, *BOARD_RESTARTS):
            in_flight += 1
        wanted.append(decision)
    _apply_limits(wanted, in_flight, cluster, budgets, config, plan)
    return plan


def _next(name: str, node: SlurmNode, catalog: XidCatalog, records: list[dict[str, Any]], holds: set[str],
          config: Config, now: float) -> LadderDecision | None:
    """The node's next step, before the budgets and the breaker; None for a node not on the ladder."""
    base = without_hold(node)
    rung, fault = rung_of(base), fault_of(base, catalog)
    if (rung is None and fault is None) or not node.out_of_service:
        # In service: its reason is a leftover (24.11 keeps the reason through a resume), not a step.
        return None
    fault = fault or (rung.fault if rung else None)
    if name in holds or is_held(node):
        return LadderDecision(name, "skip:held", fault, seen=node, detail="opsctl hold: a person has it")
    if rung is not None and rung.step in (RMA, UNVALIDATED):
        return LadderDecision(name, "skip:" + rung.step, fault, seen=node, detail="a person's: nothing automatic")
    # One judgement for every step, RMA included: opsctl's own reboot may leave the node DOWN and, while it
    # runs, rebooting; any other hold of Slurm's or a person's means hands off.
    judged = ladder_reach(node)
    if judged.verdict == HANDS_OFF:
        kind, _, detail = judged.why.partition(": ")
        return LadderDecision(name, f"skip:{kind}", fault, seen=node, detail=detail)
    if rung is None:
        assert fault is not None
        return _enter(name, node, fault, records, config, now)
    return _climb(name, node, rung, records, config, now, catalog)


def _enter(name: str, node: SlurmNode, fault: Fault, records: list[dict[str, Any]], config: Config,
           now: float) -> LadderDecision:
    """A node that opsctl's health run drained for a fault the ladder clears."""
    rem = config.remediation
    since = now - duration_seconds(rem.rma_window)
    drains, rule, gpu = max((_episodes(records, name, rule, gpu, since), rule, gpu)
                            for rule in fault.rules for gpu in fault.gpus)
    if drains >= rem.rma_after:
        why = f"drained {drains} times for {rule} on {gpu} within {rem.rma_window}"
        return _step(name, node, RMA, fault, why, config)
    if fault.action == "inspect":
        return _step(name, node, RMA, fault, "NVIDIA's XID catalog: contact support, inspect the hardware",
                     config)
    tail = node.reason.split(" ", 2)[2] if node.reason.count(" ") >= 2 else ""
    if fault.action == "reset":
        if node.runs_jobs:
            return LadderDecision(name, WAIT, fault, seen=node, detail="runs jobs: a GPU reset waits until it is idle")
        return _step(name, node, RESET, fault, tail, config)
    return _step(name, node, REBOOT, fault, tail, config)


def _climb(name: str, node: SlurmNode, rung: Rung, records: list[dict[str, Any]], config: Config,
           now: float, catalog: XidCatalog) -> LadderDecision:
    """A node already on the ladder: wait for its step, or take the next one."""
    fault = rung.fault
    if rung.step == RESET or rung.after == RESET:
        # A fault that joined a reset under the ladder may need more than a reset: it goes to its own step.
        needed = needed_action(fault, node.reason, catalog)
        if needed == "inspect":
            return _step(name, node, RMA, fault, "NVIDIA's XID catalog: contact support, inspect the hardware",
                         config)
        if needed == REBOOT:
            return _step(name, node, REBOOT, fault, f"{rung.step}: a fault a reset does not clear joined it", config)
    started = _last(records, name, rung.step)
    if rung.step in BOARD_RESTARTS and started is not None and node.boot_time is not None and node.boot_time > started:
        # `scontrol reboot ASAP` waits for the node's jobs, hours at times: the node's checks have had time to
        # answer only since the boot Slurm reports, not since the request.
        started = node.boot_time
    age = now - started if started is not None else 0.0
    # The config refuses a step_timeout shorter than the node's longest step at validate_level (the reset or the
    # boot, the diagnostics, nvidia-smi -q, the bug report: opsctl.gpu.tools.node_step_bound_s).
    timeout = float(duration_seconds(config.remediation.step_timeout))
    if rung.step == RESET:
        if age > timeout:
            return _step(name, node, REBOOT, fault, f"no validation {age / 60:.0f}m after the reset",
                         config)
        return LadderDecision(name, WAIT, fault, seen=node, detail="the node resets the GPU and validates it")
    if rung.step in BOARD_RESTARTS:
        words = "reboot" if rung.step == REBOOT else "power cycle"
        if age > timeout and not node.down_for_reboot:
            return _step(name, node, UNVALIDATED, fault, f"no validation {age / 60:.0f}m after the {words}", config)
        if _never_back(node, age, timeout):
            return _not_back(name, node, rung, fault, age, config)
        return LadderDecision(name, WAIT, fault, seen=node, detail=f"{words}, then the node validates itself")
    result = rung.step.removeprefix(f"{VALIDATED}-")
    if result == "pass":
        return LadderDecision(name, RESUME, fault, seen=node, detail=f"validated after the {rung.after}")
    if rung.after == "reset":
        return _step(name, node, REBOOT, fault, f"validation {result} after the reset", config)
    if result == "fail":
        # The node's detail starts with the GPU's serial (`serial=...`): the RMA's reason keeps it for sinfo -R.
        return _step(name, node, RMA, fault, f"failed its checks after the reboot: {rung.detail}".strip(), config)
    # The node's words say why (a fabric that never trained, a diag that failed once only): the person reads them.
    why = "the checks could not run after the reboot" + (f": {rung.detail}" if rung.detail else "")
    return _step(name, node, UNVALIDATED, fault, why, config)


def _never_back(node: SlurmNode, age: float, timeout: float) -> bool:
    """The node did not come back from its reboot: slurmctld gave up on it after ResumeTimeout (`reboot timed
    out`, its own words appended to the reason), or it is still not answering past the step's timeout."""
    return node.reboot_timed_out or (age > timeout and node.down_for_reboot)


def _not_back(name: str, node: SlurmNode, rung: Rung, fault: Fault, age: float, config: Config) -> LadderDecision:
    """A reboot that never came back is power-cycled through the node's BMC (a graceful reboot can hang on a GPU
    off the bus or a hung mount); a power cycle that did not bring it back, or no BMC to ask, is a person's."""
    if rung.step == REBOOT and config.bmc.protocol:
        return _step(name, node, POWER_CYCLE, fault, f"the reboot did not come back in {age / 60:.0f}m", config)
    why = "the power cycle did not bring it back" if rung.step == POWER_CYCLE else \
        "the reboot did not come back and no BMC is configured (bmc.protocol)"
    return _step(name, node, UNVALIDATED, fault, f"{why} in {age / 60:.0f}m", config)


def _step(name: str, node: SlurmNode, step: str, fault: Fault, detail: str, config: Config) -> LadderDecision:
    """A step that changes the node: its reason names the step, which is also the actor's event."""
    reason = cap_reason(step_reason(step, fault, detail), config.safety.reason_max_length)
    return LadderDecision(name, step, fault, reason=reason, detail=detail, seen=node)


def _episodes(records: list[dict[str, Any]], node: str, rule: str, gpu: str, since: float) -> int:
    """How many times opsctl drained this node for this rule on this GPU since `since` (this time included)."""
    word = re.compile(rf"(^|\s){re.escape(gpu)}(\s|$)") if gpu != "node" else None
    count = 0
    for record in records:
        # A drain, or a fault that joined the node's reason under the ladder (health/ladder_reason.py): its
        # record's checks are the new rule alone, its evidence names the new GPU as a word of its own.
        drained = record.get("event") in ("drain", "escalate") and record.get("node") == node
        if not drained or rule not in (record.get("checks") or []) or _seconds(record) < since:
            continue
        if word is None or word.search(str(record.get("evidence") or record.get("reason") or "")):
            count += 1
    return count


def _last(records: list[dict[str, Any]], node: str, step: str) -> float | None:
    """When the node's newest record of this step was written (the step was taken)."""
    times = [_seconds(r) for r in records if r.get("node") == node and r.get("event") == step]
    return max(times) if times else None


def _seconds(record: dict[str, Any]) -> float:
    try:
        return float(calendar.timegm(time.strptime(str(record.get("time")), "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return 0.0


def _apply_limits(wanted: list[LadderDecision], in_flight: int, cluster: dict[str, SlurmNode], budgets: Budgets,
                  config: Config, plan: LadderPlan) -> None:
    """The breaker, then each step's budget per run and per hour; what is over them is skipped."""
    rem, safety = config.remediation, config.safety
    disruptive = [d for d in wanted if d.action in (RESET, *BOARD_RESTARTS)]
    judged = len(counted_nodes(cluster))
    allowed = max(safety.breaker_min_nodes, int(safety.breaker_fraction * judged))
    if disruptive and in_flight + len(disruptive) > allowed:
        plan.breaker = True
        plan.stop = (f"circuit breaker: {in_flight + len(disruptive)} nodes would be reset or rebooted at once "
                     f"(more than {allowed} of {judged}); nothing is reset or rebooted")
        wanted = [d if d not in disruptive else LadderDecision(d.node, "skip:breaker", d.fault, seen=d.seen)
                  for d in wanted]
    left = {RESET: min(rem.max_resets_per_run, rem.max_resets_per_hour - budgets.resets),
            REBOOT: min(rem.max_reboots_per_run, rem.max_reboots_per_hour - budgets.reboots),
            RESUME: min(safety.max_resumes_per_run, safety.max_resumes_per_hour - budgets.resumes)}
    for decision in wanted:
        # A power cycle is a reboot the hard way: it spends the reboots' budget.
        spends = REBOOT if decision.action == POWER_CYCLE else decision.action
        if spends in left:
            if left[spends] <= 0:
                plan.stop = plan.stop or f"{spends} budget spent (remediation and safety limits)"
                decision = LadderDecision(decision.node, "skip:budget", decision.fault, seen=decision.seen,
                                          detail=f"{spends} budget spent")
            else:
                left[spends] -= 1
        plan.decisions.append(decision)


def refuse_reboots(plan: LadderPlan) -> None:
    """The plan's reboots and power cycles where slurm.conf sets ReturnToService=2: skipped, so that a dry run says
    so too (the actor would refuse each of them anyway)."""
    plan.stop = plan.stop or RETURN_TO_SERVICE_2
    plan.decisions = [LadderDecision(d.node, "skip:return-to-service", d.fault, seen=d.seen,
                                     detail=RETURN_TO_SERVICE_2) if d.action in BOARD_RESTARTS else d
                      for d in plan.decisions]
