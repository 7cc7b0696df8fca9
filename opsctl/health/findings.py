"""Drains for what a node-side test found rather than Prometheus: the fabric test's slow or dead rails,
the InfiniBand precheck of provisioning.

The same safety rules as `opsctl health --drain`, through the same plan (plan.plan_drains): the run
lock, ownership (a drain, a reason or a state opsctl did not set is left alone), the drain budget,
the out-of-service limit and the circuit breaker (which counts the nodes that the remediation ladder
holds for a reset or a reboot beside the failing ones), then compare and set against Slurm and one audit
record per drain or refusal. Before any of them, the caller's own breaker: when more than
`max_fail_fraction` of the tested nodes fail, the fault is in what they share (the fabric, the subnet
manager), not in the nodes, and nothing is drained.
"""

import time

from opsctl.actor.act import DRAIN, RESUME, Actor, Change
from opsctl.actor.result import ActionResult
from opsctl.config.schema import Config
from opsctl.errors import ExitCode, worst
from opsctl.health.evaluate import Check, NodeVerdict, Report
from opsctl.health.plan import plan_drains
from opsctl.slurm import Slurm
from opsctl.slurm.partitions import select_partitions


def failing_check(rule: str, device: str, evidence: str, value: float | None = None,
                  threshold: float | None = None) -> Check:
    return Check(id=rule, severity="fail", status="fail", device=device, kind="hca" if device else "",
                 value=value, threshold=threshold, op="<" if threshold is not None else "", evidence=evidence,
                 action="drain")


def shared_cause(failing: int, tested: int, max_fail_fraction: float, what: str, cause: str = "in the fabric") -> str:
    """The stop line when too many of the tested nodes fail at once ("" when they do not)."""
    if tested and failing > max(1.0, max_fail_fraction * tested):
        return (f"circuit breaker: {failing} of {tested} tested nodes fail {what} (more than "
                f"{max_fail_fraction:.0%}): the fault is {cause}, not in the nodes; draining none")
    return ""


def drain_findings(config: Config, slurm: Slurm, found: dict[str, list[Check]], stop: str, dry_run: bool,
                   now: float | None = None, result: ActionResult | None = None) -> ActionResult:
    """Drain the nodes of `found` (node -> its failing checks) unless `stop` (the caller's breaker) is set.

    A node that is not a Slurm node of the judged partitions (an inventory that names nodes by FQDN while
    slurm.conf uses short names) is named `skip:not-in-slurm` and makes the result exit 2: a culprit that
    cannot be drained must never read as a clean run. The actor fills `result` (a new one when None), which
    is returned."""
    now = time.time() if now is None else now
    result = ActionResult() if result is None else result
    with Actor(config, slurm, now, result=result) as actor:
        if stop:
            for node, checks in sorted(found.items()):
                actor.refuse(node, stop, [c.id for c in checks], dry_run=dry_run)
            result.stop = stop
            result.lines.append(stop)
            result.exit_code = ExitCode.SAFETY_STOP
            return result
        cluster = select_partitions(actor.nodes(), config.slurm.partitions)
        report = Report(nodes={n: NodeVerdict(n, status="fail", checks=list(c), in_slurm=n in cluster)
                               for n, c in found.items() if c}, rules=[])
        plan = plan_drains(report, cluster, [], config.safety, len(actor.state.budgets.recent("drains", now)), dry_run)
        for decision in plan.refusals():
            actor.refuse(decision.node, decision.detail, [c.id for c in found[decision.node]], decision.seen,
                         dry_run=dry_run)
            result.lines.append(f"refused {decision.node}: {decision.detail}")
        for decision in plan.with_action("skip:not-in-slurm"):
            detail = (f"not-in-slurm: {decision.node} is not a Slurm node of the judged partitions (do the "
                      "inventory and slurm.conf name nodes alike?)")
            actor.refuse(decision.node, detail, [c.id for c in found[decision.node]], dry_run=dry_run)
            result.lines.append(f"skip:not-in-slurm {decision.node}: {detail.split(': ', 1)[1]}")
            result.exit_code = ExitCode.USAGE
        changes = [Change(node=d.node, event=DRAIN, seen=d.seen, reason=d.reason, checks=rule_ids(found[d.node]),
                          evidence="; ".join(c.evidence for c in found[d.node]), values=d.values)
                   for d in plan.with_action("drain", "would-drain") if d.seen is not None]
        if dry_run:
            for change in changes:
                actor.would(change)
                result.lines.append(f"would drain {change.node}: {change.reason}")
                result.drained.append(change.node)
        elif changes:
            acted = actor.apply(changes)
            result.lines += [f"refused {c.node}: {why}" for c, why in acted.dropped]
            result.lines += [f"drained {c.node}: {c.reason}" for c in acted.made]
            result.drained += [c.node for c in acted.made]
    if plan.stop:
        result.stop = plan.stop
        result.lines.append(plan.stop)
        result.exit_code = worst(result.exit_code, ExitCode.SAFETY_STOP)
    return result


def rule_ids(checks: list[Check]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(c.id for c in checks))


def resume_own(config: Config, slurm: Slurm, passed: list[str], rule: str, detail: str, dry_run: bool,
               now: float, budget: bool = True, rebooted: bool = False,
               result: ActionResult | None = None) -> tuple[list[str], list[str]]:
    """Resume the passing nodes whose drain is `rule`'s alone (opsctl:<rule> ...), and no other (compare
    and set): (the nodes resumed, one line each, `resumed <node>: <detail>`). `rebooted`: also those that
    came back DOWN with that reason from its reboot through Slurm. The actor records in `result` (the
    caller's ActionResult, when it keeps one) what it did, would do and refused."""
    with Actor(config, slurm, now, result=result) as actor:
        before = actor.nodes()
        changes = [Change(node=n, event=RESUME, seen=before[n], checks=(rule,), detail=detail, budget=budget)
                   for n in passed if n in before and before[n].reason_rules() == [rule]
                   and (before[n].resumable or (rebooted and before[n].back_from_reboot))]
        if dry_run:
            for change in changes:
                actor.would(change)
            return [c.node for c in changes], [f"would resume {c.node}: {detail}" for c in changes]
        made = actor.apply(changes).made if changes else []
    return [c.node for c in made], [f"resumed {c.node}: {detail}" for c in made]


def quarantine_outcome(config: Config, slurm: Slurm, found: dict[str, list[Check]], passed: list[str], stop: str,
                       rule: str, detail: str, dry_run: bool, now: float) -> ActionResult:
    """A provisioning check's decision for all its nodes: drain those of `found` unless `stop`, then
    resume the `passed` ones from `rule`'s own drain (`detail` says why). Exit 1 when a node failed. One
    ActionResult, filled by both actors, says all that was done."""
    outcome = ActionResult()
    if found or stop:
        drain_findings(config, slurm, found, stop, dry_run, now=now, result=outcome)
    outcome.drained.sort()
    if not stop:
        resumed, lines = resume_own(config, slurm, passed, rule, detail, dry_run, now, result=outcome)
        outcome.resumed, outcome.lines = resumed, outcome.lines + lines
    outcome.exit_code = worst(ExitCode.FAILING if found else ExitCode.OK, outcome.exit_code)
    return outcome
