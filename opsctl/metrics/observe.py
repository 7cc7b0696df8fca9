"""Read the metric facts off one health run's result; the run itself never knows it is measured."""

from opsctl.health.catalog import Rule
from opsctl.health.run import RunResult
from opsctl.metrics.state import RunFacts
from opsctl.slurm.base import SlurmNode


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


def run_facts(result: RunResult) -> RunFacts:
    rules = {rule.id: rule for rule in result.report.rules}
    slurm = result.after or result.cluster  # as the run left them (the actor read them after its changes)
    facts = RunFacts(
        node_status={name: verdict.status for name, verdict in result.report.nodes.items()},
        breaker_tripped=result.plan.breaker,
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
        for decision in result.plan.with_action("drain"):
            facts.drains += list(dict.fromkeys(c.id for c in decision.checks))
        for decision in result.plan.with_action("resume"):
            before = result.cluster.get(decision.node)
            facts.resumes += before.reason_rules() if before else []
        facts.refusals = [d.action.removeprefix("skip:") for d in result.plan.refusals()]
    return facts
