"""Provisioning's rolling changes, on the head node: a batch of nodes is taken out of service before a
change that disturbs jobs (a new driver, fabric manager, a reboot) and put back once it passed its checks
(playbooks/roles/nvidia/tasks/rolling.yml runs them, one batch at a time).

`drain_batch`: every node of the batch that is in service is drained `opsctl:provision <change>` through
the actor (the run lock, compare and set, the intent, one audit record each); an earlier rollout's own
drain (a run that stopped) is kept. A node out of service for another reason (a person's drain, another
check's, DOWN) is skipped and left exactly as it is: the change reaches it in the first run after it is
back in service. Then, outside the lock (the health timer keeps running), it waits until no node of the
batch runs a job, at most `wait_s`. Nothing is ever cancelled: a node whose jobs outlast the wait is put
back in service (its rollout drain lifted) and skipped, unchanged, for the next run.

`resume_batch` lifts the rollout's own drain from the nodes that passed their checks, and no other.

Planned drains and resumes spend no drain budget: the batch size bounds them, and `opsctl health
--drain`'s budget stays for faults.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from opsctl.actor.act import DRAIN, REBOOT, Actor, Change, cap_reason
from opsctl.actor.result import ActionResult
from opsctl.clients import Clients
from opsctl.config.schema import Config
from opsctl.errors import ConfigError, ExitCode
from opsctl.health.findings import resume_own
from opsctl.slurm import OWNED_PREFIX, Slurm, SlurmNode
from opsctl.slurm.reach import reach

RULE = "provision"
PASSED = "the rollout's change passed its checks"


@dataclass
class BatchOutcome:
    ready: list[str] = field(default_factory=list)  # out of service and running no job: change them now
    skipped: dict[str, str] = field(default_factory=dict)  # node -> why it is left unchanged this run
    drained: list[str] = field(default_factory=list)  # drained by this call
    held: dict[str, str] = field(default_factory=dict)  # out of service already: node -> its state and reason
    lines: list[str] = field(default_factory=list)
    action: ActionResult = field(default_factory=ActionResult)  # what the actor did; skipped as above

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.FAILING if self.skipped else ExitCode.OK


def reason_for(change: str, config: Config) -> str:
    text = " ".join(change.split())
    if not text:
        raise ConfigError("--change must say what changes (it is the drain reason)")
    return cap_reason(f"{OWNED_PREFIX}{RULE} {text}", config.safety.reason_max_length)


def drain_batch(config: Config, slurm: Slurm, hostlist: str, change: str, wait_s: float, poll_s: float = 5.0,
                clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                now: float | None = None) -> BatchOutcome:
    reason = reason_for(change, config)
    now = time.time() if now is None else now
    outcome = BatchOutcome()
    with Actor(config, slurm, now, result=outcome.action) as actor:
        names = slurm.expand(hostlist)
        nodes = actor.nodes()
        unknown = [n for n in names if n not in nodes]
        if unknown:
            raise ConfigError(f"unknown Slurm node(s): {', '.join(unknown)}")
        # An earlier rollout's drain is kept only where opsctl may still touch the node: one that a person has
        # since put in a maintenance reservation, or that Slurm holds otherwise, is left as it is.
        earlier = [n for n in names if nodes[n].drained and nodes[n].reason_rules() == [RULE] and reach(nodes[n]).ok]
        for name in names:
            node = nodes[name]
            if node.out_of_service and name not in earlier:
                outcome.held[name] = node.state_text + (f" ({node.reason})" if node.reason else "")
        changes = [Change(node=n, event=DRAIN, seen=nodes[n], reason=reason, checks=(RULE,), evidence=change,
                          budget=False) for n in names if n not in outcome.held and n not in earlier]
        acted = actor.apply(changes) if changes else None
    for name in earlier:
        outcome.drained.append(name)
        outcome.lines.append(f"kept {name}: drained by an earlier rollout ({nodes[name].reason})")
    for made in acted.made if acted else []:
        outcome.drained.append(made.node)
        outcome.lines.append(f"drained {made.node}: {reason}")
    for dropped, why in acted.dropped if acted else []:
        outcome.skipped[dropped.node] = why
    for name, held in outcome.held.items():
        outcome.skipped[name] = f"out of service already, {held}: left as it is until it is back in service"
    waiting = [n for n in names if n not in outcome.skipped]
    busy = _wait_for_jobs(slurm, waiting, wait_s, poll_s, clock, sleep)
    outcome.ready = [n for n in waiting if n not in busy]
    if busy:
        why = f"jobs still ran after {wait_s:.0f} s; never forced: back in service, unchanged"
        outcome.skipped.update(dict.fromkeys(busy, why))
        _, lines = resume_own(config, slurm, [n for n in busy if n in outcome.drained], RULE,
                              "its jobs outlasted the rollout's wait", False, now, budget=False)
        outcome.lines += lines
    outcome.lines += [f"skipped {n}: {why}" for n, why in outcome.skipped.items()]
    outcome.action.skipped.update(outcome.skipped)
    outcome.lines += [f"ready {n}: no job runs there" for n in outcome.ready]
    return outcome


def _wait_for_jobs(slurm: Slurm, names: list[str], wait_s: float, poll_s: float, clock: Callable[[], float],
                   sleep: Callable[[float], None]) -> list[str]:
    """The nodes of `names` that still run a job when the wait is over (none: they all ended in time)."""
    deadline = clock() + wait_s
    while True:
        nodes: dict[str, SlurmNode] = slurm.nodes()
        busy = [n for n in names if n in nodes and nodes[n].runs_jobs]
        if not busy or clock() >= deadline:
            return busy
        sleep(min(poll_s, max(0.0, deadline - clock())))


def reboot_batch(config: Config, slurm: Slurm, hostlist: str, change: str, wait_s: float, poll_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 now: float | None = None, result: ActionResult | None = None) -> tuple[list[str], list[str]]:
    """Reboot through Slurm the nodes of `hostlist` that the rollout drained and that run no job
    (`scontrol reboot ASAP nextstate=DOWN reason=opsctl:provision <change>`, through the actor), so that
    Slurm knows: nothing is scheduled there meanwhile, and the node returns DOWN until `resume_batch`.
    Then wait, at most `wait_s`, until Slurm shows each one registered again: slurmctld clears the reboot
    only for a node whose slurmd reports a boot after the request. (the nodes back, a line per node)."""
    reason = reason_for(change, config)
    now = time.time() if now is None else now
    lines = []
    with Actor(config, slurm, now, result=result) as actor:
        names = slurm.expand(hostlist)
        nodes = actor.nodes()
        ready = [n for n in names if n in nodes and nodes[n].drained and nodes[n].reason_rules() == [RULE]
                 and not nodes[n].runs_jobs and reach(nodes[n]).ok]
        lines += [f"refused {n}: {_not_ready(nodes.get(n))}" for n in names if n not in ready]
        changes = [Change(node=n, event=REBOOT, seen=nodes[n], reason=reason, checks=(RULE,), evidence=change,
                          budget=False) for n in ready]
        acted = actor.apply(changes) if changes else None
    lines += [f"refused {c.node}: {why}" for c, why in (acted.dropped if acted else [])]
    rebooting = [c.node for c in (acted.made if acted else [])]
    deadline = clock() + wait_s
    while True:
        current = slurm.nodes()
        # Slurm marks a node that missed ResumeTimeout DOWN, its reason ending "reboot timed out".
        away = [n for n in rebooting if n in current and (current[n].down_for_reboot
                                                         or current[n].reason.endswith("reboot timed out"))]
        if not away or clock() >= deadline:
            break
        sleep(min(poll_s, max(0.0, deadline - clock())))
    back = [n for n in rebooting if n not in away]
    lines += [f"back {n}: registered again after its reboot ({reason})" for n in back]
    lines += [f"not back {n}: not registered with Slurm again within {wait_s:.0f} s (still rebooting or not "
              "responding, or its reboot timed out); left DOWN" for n in away]
    return back, lines


def _not_ready(node: SlurmNode | None) -> str:
    if node is None:
        return "not a Slurm node"
    judged = reach(node)
    if not judged.ok and node.reason_rules() == [RULE]:
        return judged.why
    return "not drained by a rollout, or jobs still run there"


def resume_batch(config: Config, slurm: Slurm, hostlist: str, now: float | None = None) -> tuple[list[str], list[str]]:
    """(the nodes resumed, a line each): those of `hostlist` whose drain is the rollout's own, or that came
    back DOWN from its reboot."""
    now = time.time() if now is None else now
    return resume_own(config, slurm, slurm.expand(hostlist), RULE, PASSED, False, now, budget=False, rebooted=True)


# ---- what `opsctl rollout drain|reboot|resume` call --------------------------------------------------------
def rollout_drain(clients: Clients, hostlist: str, change: str, wait_s: float) -> BatchOutcome:
    return drain_batch(clients.config(acting=True), clients.slurm(), hostlist, change, wait_s)


def rollout_reboot(clients: Clients, hostlist: str, change: str,
                   wait_s: float) -> tuple[list[str], list[str], ActionResult]:
    """(the nodes back, a line per node, what the actor did)."""
    action = ActionResult()
    back, lines = reboot_batch(clients.config(acting=True), clients.slurm(), hostlist, change, wait_s, result=action)
    return back, lines, action


def rollout_resume(clients: Clients, hostlist: str) -> tuple[list[str], list[str], ActionResult]:
    """(the nodes resumed, a line per node, what the actor did)."""
    config, slurm = clients.config(acting=True), clients.slurm()
    action = ActionResult()
    resumed, lines = resume_own(config, slurm, slurm.expand(hostlist), RULE, PASSED, False, time.time(),
                                budget=False, rebooted=True, result=action)
    return resumed, lines, action
