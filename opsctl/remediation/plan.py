"""Pure decisions: which nodes to drain or resume, and when the safety limits say stop.

Nothing here talks to Slurm or Prometheus; `opsctl.remediation.run` carries the plan out.
"""

from dataclasses import dataclass, field

from opsctl.config.schema import SafetyConfig
from opsctl.health.catalog import Rule
from opsctl.health.evaluate import Check, HandledXid, Report
from opsctl.slurm.base import OWNED_PREFIX, SlurmNode


@dataclass
class Plan:
    drains: dict[str, list[str]] = field(default_factory=dict)  # reason -> nodes that share it
    resumes: list[str] = field(default_factory=list)
    refusals: list[tuple[str, str, str]] = field(default_factory=list)  # (node, why, detail)
    stop: str = ""  # set when a safety limit stopped the run (exit 4)
    handled: list[HandledXid] = field(default_factory=list)
    healthy_since: dict[str, float] = field(default_factory=dict)
    checks: dict[str, list[Check]] = field(default_factory=dict)  # node -> checks behind its action


def drain_reason(checks: list[Check], max_length: int) -> str:
    """'opsctl:<rule-id>[,<rule-id>...] <evidence>; <evidence>', cut to max_length with '...'."""
    ids = ",".join(dict.fromkeys(c.id for c in checks))
    text = f"{OWNED_PREFIX}{ids} " + "; ".join(c.evidence for c in checks)
    return text if len(text) <= max_length else text[: max_length - 3] + "..."


def breaker_limit(safety: SafetyConfig, cluster_nodes: int) -> float:
    return max(float(safety.breaker_min_nodes), safety.breaker_fraction * cluster_nodes)


def plan_drains(report: Report, slurm: dict[str, SlurmNode], safety: SafetyConfig, drains_last_hour: int,
                dry_run: bool, now: float) -> Plan:
    plan = Plan()
    candidates = []
    for name, verdict in report.nodes.items():
        drain = verdict.drain_checks()
        if not verdict.in_slurm:
            verdict.action = "skip:not-in-slurm"
            continue
        if verdict.status == "unknown":
            verdict.action = "skip:unknown" if drain else "none"
            continue
        if verdict.status != "fail" or not drain:
            continue
        node = slurm[name]
        if node.out_of_service:
            # Never touch a node that is already out: ours keeps its first reason, others' are theirs.
            verdict.action = "skip:already-drained" if node.owned else "skip:not-owned"
            if not node.owned:
                plan.refusals.append((name, "not-owned", f"already {node.state} ({node.reason or 'no reason'})"))
            continue
        candidates.append(name)
        plan.checks[name] = drain

    total = len(slurm)
    unknown = sum(1 for v in report.nodes.values() if v.in_slurm and v.status == "unknown")
    limit = breaker_limit(safety, total)
    if len(candidates) > limit:
        plan.stop = (f"circuit breaker: {len(candidates)} nodes newly fail, more than the limit "
                     f"{limit:g} (max of {safety.breaker_min_nodes} nodes and {safety.breaker_fraction:.0%} "
                     f"of {total}); acting on none")
    elif total and unknown > safety.unknown_max_fraction * total:
        plan.stop = (f"circuit breaker: {unknown} of {total} nodes have no data (more than "
                     f"{safety.unknown_max_fraction:.0%}); monitoring looks broken, acting on none")
    if plan.stop:
        for name in candidates:
            report.nodes[name].action = "skip:circuit-breaker"
            plan.refusals.append((name, "circuit-breaker", plan.stop))
        return plan

    budget = max(0, min(safety.max_drains_per_run, safety.max_drains_per_hour - drains_last_hour))
    for index, name in enumerate(sorted(candidates)):
        verdict = report.nodes[name]
        if index >= budget:
            verdict.action = "skip:budget"
            plan.refusals.append((name, "budget", f"drain budget spent ({safety.max_drains_per_run} per run, "
                                                  f"{safety.max_drains_per_hour} per hour)"))
            plan.stop = plan.stop or f"drain budget spent: {len(candidates) - budget} failing nodes left as they are"
            continue
        verdict.action = "would-drain" if dry_run else "drain"
        checks = plan.checks[name]
        plan.drains.setdefault(drain_reason(checks, safety.reason_max_length), []).append(name)
        plan.handled += [HandledXid(node=name, gpu=c.device.removeprefix("gpu"), xid=c.xid, time=now,
                                    count=c.value or 0.0) for c in checks if c.xid is not None]
    return plan


def plan_resumes(report: Report, slurm: dict[str, SlurmNode], rules: list[Rule], healthy_since: dict[str, float],
                 resume_after_s: float, dry_run: bool, now: float, plan: Plan | None = None) -> Plan:
    """Resume only opsctl's own automatic drains whose rules are all evaluable, resumable and ok again."""
    plan = plan or Plan()
    by_id = {rule.id: rule for rule in rules}
    since = {}
    for name, node in sorted(slurm.items()):
        if not (node.drained and node.owned) or node.manual:
            continue
        verdict = report.nodes.get(name)
        rule_ids = node.reason_rules()
        why = ""
        if verdict is None or verdict.status == "unknown":
            why = "unknown"
        elif not rule_ids or any(r not in by_id for r in rule_ids):
            why = "rule-unknown"
        elif any(not by_id[r].auto_resume for r in rule_ids):
            why = "needs-person"
        elif any(verdict.breaching(r) for r in rule_ids):
            why = "still-failing"
        elif verdict.status == "fail":
            why = "other-failing"
        if why or verdict is None:
            if verdict is not None and verdict.action == "none":
                verdict.action = f"skip:{why}"
            continue
        since[name] = healthy_since.get(name, now)
        waited = now - since[name]
        if waited < resume_after_s:
            verdict.action = "skip:healthy-period"
            continue
        verdict.action = "would-resume" if dry_run else "resume"
        plan.resumes.append(name)
    plan.healthy_since = since
    return plan
