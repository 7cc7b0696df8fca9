"""Read the metric facts off one health run's result; the run itself never knows it is measured."""

from dataclasses import replace

from opsctl.health.catalog import Rule
from opsctl.metrics.state import RunFacts
from opsctl.remediation.run import RunResult
from opsctl.slurm.base import SlurmNode

# plan_drains words every breaker stop so (opsctl/remediation/plan.py); a unit test holds both to it.
BREAKER_STOP = "circuit breaker"


def slurm_state(node: SlurmNode) -> str:
    """sinfo's wording: a drained node is `drained` once idle (or down), `draining` while jobs still run."""
    if node.drained:
        return "drained" if node.state in ("idle", "down", "drained", "drain") else "draining"
    return node.state or "unknown"


def needs_person(node: SlurmNode, rules: dict[str, Rule]) -> list[str]:
    """The rules of an opsctl drain that `--resume` will never lift: a person has to act."""
    if not (node.drained and node.owned) or node.manual:
        return []
    return [r for r in node.reason_rules() if r not in rules or not rules[r].auto_resume]


def after_run(result: RunResult) -> dict[str, SlurmNode]:
    """Slurm's nodes as the run left them: read before it acted, then its own drains and resumes applied."""
    slurm = dict(result.slurm_nodes)
    if result.options.dry_run:
        return slurm
    for reason, nodes in result.plan.drains.items():
        for name in nodes:
            if name in slurm:
                slurm[name] = replace(slurm[name], flags=(*slurm[name].flags, "DRAIN"), reason=reason)
    for name in result.plan.resumes:
        if name in slurm:
            slurm[name] = replace(slurm[name], flags=tuple(f for f in slurm[name].flags if f != "DRAIN"), reason="")
    return slurm


def run_facts(result: RunResult) -> RunFacts:
    rules = {rule.id: rule for rule in result.report.rules}
    slurm = after_run(result)
    facts = RunFacts(
        node_status={name: verdict.status for name, verdict in result.report.nodes.items()},
        breaker_tripped=result.plan.stop.startswith(BREAKER_STOP),
        drain_rules=sorted(r.id for r in rules.values() if r.action == "drain"),
        resume_rules=sorted(r.id for r in rules.values() if r.action == "drain" and r.auto_resume),
    )
    for name, node in slurm.items():
        state = slurm_state(node)
        facts.slurm_states[state] = facts.slurm_states.get(state, 0) + 1
        if node.drained:
            facts.drained[name] = node.owner or "other"
        person = needs_person(node, rules)
        if person:
            facts.needs_person[name] = person
    if not result.options.dry_run:
        for nodes in result.plan.drains.values():
            for name in nodes:
                facts.drains += list(dict.fromkeys(c.id for c in result.plan.checks.get(name, [])))
        for name in result.plan.resumes:
            before = result.slurm_nodes.get(name)
            facts.resumes += before.reason_rules() if before else []
        facts.refusals = [why for _node, why, _detail in result.plan.refusals]
    return facts
