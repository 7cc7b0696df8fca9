"""Drains for what a node-side test found rather than Prometheus: the fabric test's slow or dead rails,
the InfiniBand precheck of provisioning.

The same safety rules as `opsctl health --drain`, through the same plan (plan.plan_drains): the run
lock, ownership (a drain, a reason or a state opsctl did not set is left alone), the drain budget,
the out-of-service limit and the circuit breaker, then compare and set against Slurm and one audit
record per drain or refusal. Before any of them, the caller's own breaker: when more than
`max_fail_fraction` of the tested nodes fail, the fault is in what they share (the fabric, the subnet
manager), not in the nodes, and nothing is drained.
"""

import time
from dataclasses import dataclass, field

from opsctl.config.schema import Config
from opsctl.errors import ExitCode
from opsctl.health.evaluate import Check, NodeVerdict, Report
from opsctl.remediation.audit import AuditLog
from opsctl.remediation.plan import Plan, plan_drains
from opsctl.remediation.state import RunLock, StateDir
from opsctl.slurm import Slurm
from opsctl.slurm.partitions import select_partitions


@dataclass
class FindingsResult:
    plan: Plan = field(default_factory=Plan)
    lines: list[str] = field(default_factory=list)  # what was done or refused, one line each
    drained: list[str] = field(default_factory=list)  # drained, or with dry_run would be
    exit_code: ExitCode = ExitCode.OK


def failing_check(rule: str, device: str, evidence: str, value: float | None = None,
                  threshold: float | None = None) -> Check:
    return Check(id=rule, severity="fail", status="fail", device=device, kind="hca" if device else "",
                 value=value, threshold=threshold, op="<" if threshold is not None else "", evidence=evidence,
                 action="drain")


def shared_cause(failing: int, tested: int, max_fail_fraction: float, what: str) -> str:
    """The stop line when too many of the tested nodes fail at once ("" when they do not)."""
    if tested and failing > max(1.0, max_fail_fraction * tested):
        return (f"circuit breaker: {failing} of {tested} tested nodes fail {what} (more than "
                f"{max_fail_fraction:.0%}): the fault is in the fabric, not in the nodes; draining none")
    return ""


def drain_findings(config: Config, slurm: Slurm, found: dict[str, list[Check]], stop: str, dry_run: bool,
                   now: float | None = None) -> FindingsResult:
    """Drain the nodes of `found` (node -> its failing checks) unless `stop` (the caller's breaker) is set."""
    now = time.time() if now is None else now
    audit = AuditLog(config.audit_log)
    result = FindingsResult()
    if stop:
        for node, checks in sorted(found.items()):
            audit.write("refuse", node=node, checks=[c.id for c in checks], detail=stop, dry_run=dry_run, now=now)
        result.plan.stop, result.plan.breaker = stop, True
        result.lines.append(stop)
        result.exit_code = ExitCode.SAFETY_STOP
        return result
    state = StateDir(config.state_dir)
    with RunLock(config.state_dir):
        cluster = select_partitions(slurm.nodes(), config.slurm.partitions)
        report = Report(nodes={n: NodeVerdict(n, status="fail", checks=list(c), in_slurm=n in cluster)
                               for n, c in found.items() if c}, rules=[])
        plan = plan_drains(report, cluster, [], config.safety, len(state.recent("drains", now)), dry_run)
        result.plan = plan
        for decision in plan.refusals():
            seen = decision.seen
            audit.write("refuse", node=decision.node, checks=[c.id for c in found[decision.node]],
                        detail=decision.detail, dry_run=dry_run, now=now, reason=seen.reason if seen else "",
                        state=seen.state_text if seen else "")
            result.lines.append(f"refused {decision.node}: {decision.detail}")
        for reason, batch in plan.drains().items():
            current = slurm.nodes()  # compare and set: only nodes still as the plan saw them
            names = [d.node for d in batch if d.seen is not None and d.node in current
                     and current[d.node].same_as(d.seen)]
            if not names:
                continue
            slurm.drain(names, reason)
            for name in names:
                audit.write("drain", node=name, checks=[c.id for c in found[name]], reason=reason, now=now,
                            evidence="; ".join(c.evidence for c in found[name]))
                result.lines.append(f"drained {name}: {reason}")
                result.drained.append(name)
            state.record("drains", len(names), now)
        for decision in plan.with_action("would-drain"):
            audit.write("would-drain", node=decision.node, checks=[c.id for c in decision.checks],
                        reason=decision.reason, dry_run=True, now=now)
            result.lines.append(f"would drain {decision.node}: {decision.reason}")
            result.drained.append(decision.node)
    if plan.stop:
        result.lines.append(plan.stop)
        result.exit_code = ExitCode.SAFETY_STOP
    return result
