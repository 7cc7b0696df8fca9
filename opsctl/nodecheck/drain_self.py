"""`opsctl node check --drain-self`: the node drains itself for its own failed checks and resumes itself from
its own drain, through the one actor, within the fleet's limits (docs/health.md, "The node draining itself").

The reason is `opsctl:node-check <check> <device>, ...`; a person's drain, or one that names another rule
too, is left alone (as LBNL NHC does with the drains it did not set), and so is a drain that only reads as
the node's own: the actor judges each reason against what it set (its custody store in the node's state
directory, opsctl/actor/custody.py), so Slurm's own drain that kept the words of an earlier node-check drain
is never resumed.

Its GPU checks (opsctl/nodecheck/gpu.py) drain too, but a resume waits until they were all made: a fabric still
training after a boot is "not yet", not a pass."""

import time

from opsctl.actor.act import DRAIN, RESUME, Actor, Change, cap_reason
from opsctl.actor.result import ActionResult
from opsctl.config.schema import Config
from opsctl.errors import ConfigError, ExitCode
from opsctl.health.plan import out_of_service_room
from opsctl.ib.check import Report
from opsctl.nodecheck.gpu import CHECKS as GPU_CHECKS
from opsctl.nodecheck.gpu import COUNT, GpuReport, every_gpu_failed, slurm_gpus
from opsctl.nodecheck.report import NODE, REASON_PREFIX, RULE, CheckResult
from opsctl.slurm import Slurm, SlurmNode
from opsctl.slurm.partitions import select_partitions
from opsctl.storage.check import CHECKS as STORAGE_CHECKS

NOT_RESPONDING_REASON = "Not responding"  # slurmctld's reason for a node it set DOWN when slurmd stopped answering
REGISTERING_FLAGS = {"NOT_RESPONDING", "COMPLETING"}


def self_reason(found: list[CheckResult], max_length: int) -> str:
    failed = [f"{r.check} {r.device}" for r in found if r.failed]
    return cap_reason(f"{REASON_PREFIX} {', '.join(failed)}", max_length)


def shared_shaped(report: Report | None, found: list[CheckResult], config: Config,
                  gpus: GpuReport | None = None) -> dict[CheckResult, str]:
    """The failed results shaped like a cause that every node shares, each with why. A node sees only itself:
    when the subnet manager is down, a pinned firmware is rolled out, a driver update breaks nvidia_peermem
    or the storage goes away, all 64 nodes fail the same way at once, and only `opsctl health`, which sees
    them all (its breaker), can tell that from a node fault. So these never drain the node itself. Without
    the InfiniBand report (`report` None) only the storage checks can be judged so."""
    shaped: dict[CheckResult, str] = {}
    ports, findings = (report.ports, report.findings) if report else ([], [])
    states = {port.state for port in ports}
    every_rail = next(iter(states)) if len(states) == 1 and states != {"ACTIVE"} else None
    firmware = {f.device for f in findings if f.check == "firmware" and config.ib.firmware}
    for result in (r for r in found if r.failed):
        if result.check in STORAGE_CHECKS:
            shaped[result] = "a storage check (an outage fails every node at once)"
        elif result.check == "ib-port-state" and every_rail:
            shaped[result] = f"every rail is {every_rail} (the subnet manager?)"
        elif result.check == "ib-firmware" and result.device in firmware:
            shaped[result] = f"firmware differs from the pinned {config.ib.firmware} (a fleet-wide rollout?)"
        elif result.check == "ib-kernel-modules":
            shaped[result] = "a kernel module is missing (a driver update on every node?)"
        elif result.check in GPU_CHECKS and gpus is not None and every_gpu_failed(gpus, found):
            shaped[result] = "no GPU answers or no fabric trained (a driver or Fabric Manager change on every node?)"
    return shaped


def registering(node: SlurmNode) -> bool:
    """slurmd starting (its HealthCheckProgram runs before it registers): slurmctld shows the node NOT_RESPONDING,
    in service or DOWN for that alone (Slurm's own "Not responding"), perhaps still COMPLETING a job that the boot
    cut short (registration ends it), and nothing else holds it. Such a node may drain itself: that is what a
    health check at slurmd's start is for."""
    return "NOT_RESPONDING" in node.flags and set(node.flags) <= REGISTERING_FLAGS \
        and node.state in ("idle", "down") and node.reason in ("", NOT_RESPONDING_REASON)


def count_against_slurm(gpus: GpuReport, node: SlurmNode) -> list[CheckResult]:
    """The GPU results, gpu-count judged against the GPUs Slurm was told this node has (its gres), where it says."""
    told = slurm_gpus(node.gres)
    if told is None or gpus.answering is None:
        return list(gpus.found)
    return [CheckResult(COUNT, NODE, gpus.answering < told) if r.check == COUNT else r for r in gpus.found]


def drain_self(config: Config, slurm: Slurm, node: str, found: list[CheckResult],
               report: Report | None = None, result: ActionResult | None = None,
               gpus: GpuReport | None = None) -> ActionResult:
    """Drain `node` for its failed checks, or resume it from its own node-check drain; one line says what.

    Through the actor (the lock, compare and set, the audit). A failure shaped like a shared cause
    (shared_shaped) never drains; a drain that would take more nodes out of service with an opsctl reason
    than safety.max_out_of_service_fraction allows is refused; only a drain whose reason names node-check
    and nothing else is resumed (`opsctl:node-check,xid-79 ...` needs a person: the XID is not ours). The
    actor fills `result` (a new one when None), which is returned with the line. `gpus`: the GPU checks, whose
    gpu-count is judged against Slurm's word for the node; a resume waits until they were all made."""
    gpus = gpus or GpuReport(absent=True)
    with Actor(config, slurm, time.time(), result=result) as actor:
        nodes = actor.nodes()
        if node not in nodes:
            raise ConfigError(f"--drain-self: {node} is not a Slurm node (set --node)")
        current = nodes[node]
        found = found + count_against_slurm(gpus, current)
        shaped = shared_shaped(report, found, config, gpus)
        own = [r for r in found if r.failed and r not in shaped]
        not_drained = "; ".join(sorted({f"{r.check} {r.device}: {why}" for r, why in shaped.items()}))
        if own:
            return _drain(config, actor, nodes, current, own)
        if shaped:
            actor.skip(node, f"shaped like a shared cause: {not_drained}")
            return _said(actor, f"{node} not drained: {not_drained}; opsctl health, which sees every node, decides",
                         exit_code=ExitCode.FAILING)
        if current.resumable and current.reason_rules() == [RULE] and not gpus.judged:
            return _said(actor, f"{node} stays drained: {gpus.skipped}")
        if current.resumable and current.reason_rules() == [RULE] and not any(r.failed for r in found):
            made = actor.apply([Change(node=node, event=RESUME, seen=current, checks=(RULE,),
                                       detail="every node check passes")]).made
            if made:
                actor.result.resumed.append(node)
                return _said(actor, f"resumed {node}: every node check passes")
            return _said(actor, f"{node} not resumed: Slurm changed it meanwhile")
        return actor.result


def _said(actor: Actor, line: str, exit_code: ExitCode = ExitCode.OK, stop: str = "") -> ActionResult:
    """The actor's result with the line that says what the run did."""
    result = actor.result
    result.lines.append(line)
    result.exit_code, result.stop = exit_code, stop or result.stop
    return result


def _drain(config: Config, actor: Actor, nodes: dict[str, SlurmNode], current: SlurmNode,
           own: list[CheckResult]) -> ActionResult:
    node, failing = current.name, ExitCode.FAILING
    # opsctl's words left on a node in service (a resume on a release that keeps the reason) hold nothing.
    if not registering(current) and (current.out_of_service or (current.reason and not current.leftover)):
        if current.owned and current.reason.startswith(REASON_PREFIX):
            return _said(actor, f"{node} stays drained: {current.reason}", exit_code=failing)
        actor.skip(node, f"{current.state_text} ({current.reason or 'no reason'})")
        return _said(actor, f"{node} left alone: {current.state_text} ({current.reason or 'no reason'})",
                     exit_code=failing)
    room, full = out_of_service_room(select_partitions(nodes, config.slurm.partitions), config.safety,
                                     only_opsctl=True)
    if room < 1:
        actor.refuse(node, f"out-of-service-limit: {full}", [RULE], current)
        return _said(actor, f"{node} not drained: {full}", exit_code=failing, stop=full)
    reason = self_reason(own, config.safety.reason_max_length)
    made = actor.apply([Change(node=node, event=DRAIN, seen=current, reason=reason, checks=(RULE,),
                               evidence=", ".join(sorted({r.check for r in own})))]).made
    if made:
        actor.result.drained.append(node)
        return _said(actor, f"drained {node}: {reason}", exit_code=failing)
    return _said(actor, f"{node} not drained: Slurm changed it meanwhile", exit_code=failing)
