"""Pure decisions: which nodes to drain, resume or escalate, and when the safety limits say stop.

Nothing here talks to Slurm or Prometheus, and nothing here changes a verdict: the plan is a set of
Decisions, one per node that gets an action; `opsctl.health.run` carries it out.

The safety limits count the whole judged cluster (every GPU node in `slurm.partitions`; every node
there when none has a GPU), whatever `--nodes` narrows the acting to: two scoped runs never drain what
one full run refuses, and CPU-only nodes in the same partition never raise the breaker's threshold.
"""

import math
from dataclasses import dataclass, field, replace

from opsctl.actor.act import cap_reason
from opsctl.config.schema import SafetyConfig
from opsctl.health.catalog import Rule
from opsctl.health.evaluate import Check, NodeVerdict, Report
from opsctl.health.evidence import Evidence
from opsctl.health.ladder_reason import (
    BOARD_RESTARTS,
    GPU,
    NEW_FAULT,
    RESET,
    ladder_reach,
    open_faults,
    step_words,
    under_ladder,
    with_new_step_faults,
)
from opsctl.slurm.base import OWNED_PREFIX, SlurmNode
from opsctl.slurm.reach import HANDS_OFF, reach


@dataclass(frozen=True)
class Decision:
    node: str
    action: str  # drain, would-drain, resume, would-resume, escalate, would-escalate, skip:<why>
    detail: str = ""  # why, in words, for the audit log
    checks: tuple[Check, ...] = ()  # the checks behind a drain or an escalation
    reason: str = ""  # the Slurm reason that a drain or an escalation sets
    seen: SlurmNode | None = None  # Slurm as planned: the change is made only if it is still so
    healthy_s: float = 0.0  # a resume: how long the node has been healthy
    values: tuple[dict[str, object], ...] = ()  # the metric values behind it: {rule, device, value, threshold}
    eligible_at: float | None = None  # a resume that waits out safety.resume_after: when it may happen (Unix time)


def check_values(checks: tuple[Check, ...] | list[Check]) -> tuple[dict[str, object], ...]:
    return tuple({"rule": c.id, "device": c.device, "value": c.value, "threshold": c.threshold} for c in checks)


@dataclass(frozen=True)
class BreakerCount:
    """What the circuit breaker counted, over every judged node: the nodes that newly fail, those whose
    condition holds now but whose hold has not yet elapsed (pending), and those the remediation ladder
    holds out of service for a reset or a reboot; and the limit it held their sum to."""

    failing: int
    pending: int
    ladder: int
    limit: float

    @property
    def all(self) -> int:
        return self.failing + self.pending + self.ladder

    def text(self) -> str:
        """'7 nodes newly fail', with the pending and the ladder's nodes when it counted any."""
        if not self.pending and not self.ladder:
            return f"{self.failing} nodes newly fail"
        return (f"{self.failing} nodes newly fail, {self.pending} pending (failing now, their hold not yet "
                f"elapsed) and {self.ladder} on the remediation ladder (a reset or a reboot): {self.all} in all")


@dataclass
class Plan:
    decisions: dict[str, Decision] = field(default_factory=dict)
    stop: str = ""  # set when a safety limit stopped (some of) the run: exit 4
    breaker: bool = False  # the circuit breaker tripped: nothing at all is changed
    counted: BreakerCount | None = None  # what the breaker counted; None when the run planned no drains
    outage: str = ""  # the shared domain the breaker named ("storage", "fabric"), whose failing nodes it stands for
    outage_nodes: tuple[str, ...] = ()
    healthy_since: dict[str, float] = field(default_factory=dict)

    def action(self, node: str) -> str:
        decision = self.decisions.get(node)
        return decision.action if decision else "none"

    def with_action(self, *actions: str) -> list[Decision]:
        return [d for d in self.decisions.values() if d.action in actions]

    def drains(self) -> dict[str, list[Decision]]:
        """reason -> the drains that share it (one scontrol call each)."""
        out: dict[str, list[Decision]] = {}
        for decision in self.with_action("drain"):
            out.setdefault(decision.reason, []).append(decision)
        return out

    def refusals(self) -> list[Decision]:
        return [d for d in self.decisions.values() if d.action.startswith("skip:") and d.detail]

    def set(self, decision: Decision) -> None:
        self.decisions[decision.node] = decision


def drain_reason(checks: list[Check], max_length: int) -> str:
    """'opsctl:<rule-id>[,<rule-id>...] <evidence>; <evidence>', cut to max_length with '...'."""
    ids = ",".join(dict.fromkeys(c.id for c in checks))
    return cap_reason(f"{OWNED_PREFIX}{ids} " + "; ".join(c.evidence for c in checks), max_length)


def escalated_reason(node: SlurmNode, checks: list[Check], max_length: int) -> str:
    """opsctl's reason with the rules of a new event that needs a person appended to it."""
    rules = ",".join(dict.fromkeys([*node.reason_rules(), *(c.id for c in checks)]))
    tail = node.reason.split(" ", 1)[1] if " " in node.reason else ""
    return cap_reason(f"{OWNED_PREFIX}{rules} " + "; ".join([t for t in (tail, *(c.evidence for c in checks)) if t]),
                      max_length)


def counted_nodes(cluster: dict[str, SlurmNode]) -> dict[str, SlurmNode]:
    """The nodes the safety limits count: the GPU nodes (their Gres names a gpu), or every node when none
    has one (a site whose slurm.conf declares no Gres)."""
    gpu = {name: node for name, node in cluster.items() if node.has_gpus}
    return gpu or cluster


def out_of_service_room(cluster: dict[str, SlurmNode], safety: SafetyConfig,
                        only_opsctl: bool = False) -> tuple[int, str]:
    """(how many more nodes may go out of service, the refusal's words when none may). `only_opsctl` counts
    the nodes out of service with an opsctl reason alone (a node's own check cannot judge the others)."""
    counted = counted_nodes(cluster)
    total = len(counted)
    out_now = sum(1 for node in counted.values() if node.out_of_service and (node.owned or not only_opsctl))
    room = max(0, math.floor(safety.max_out_of_service_fraction * total + 1e-9) - out_now)
    what = " with an opsctl reason" if only_opsctl else ""
    return room, (f"{out_now} of {total} nodes are out of service{what}; draining more would pass "
                  f"safety.max_out_of_service_fraction {safety.max_out_of_service_fraction:g}")


def breaker_limit(safety: SafetyConfig, cluster_nodes: int) -> float:
    return max(float(safety.breaker_min_nodes), safety.breaker_fraction * cluster_nodes)


def unknown_stop(report: Report, cluster: dict[str, SlurmNode], safety: SafetyConfig) -> str:
    """Too many judged nodes without usable data: monitoring looks broken (exit 4, read-only runs too)."""
    counted = counted_nodes(cluster)
    total = len(counted)
    unknown = sum(1 for n in counted if n in report.nodes and report.nodes[n].status == "unknown")
    if total and unknown > safety.unknown_max_fraction * total:
        return (f"circuit breaker: {unknown} of {total} nodes have no usable data (more than "
                f"{safety.unknown_max_fraction:.0%}); monitoring looks broken, acting on none")
    return ""


# What many nodes failing the rules of one shared domain at once is, rather than as many node faults.
SHARED_CAUSES = {"storage": "a storage outage",
                 "fabric": "a fleet-wide NVSwitch fabric fault (Fabric Manager down or not matching the driver)"}


def shared_outage(report: Report, candidates: list[str], rules: list[Rule]) -> tuple[str, str]:
    """('storage', 'storage (lustre-import-down lustre-OST0002), a storage outage rather than node faults')
    when every failing node fails only rules of one shared domain (SHARED_CAUSES): many nodes losing the same
    shared storage, or their fabric, at once is one outage, not many node faults; else ('', '')."""
    domains = {r.id: r.domain for r in rules}
    checks = [c for name in candidates for c in report.nodes[name].drain_checks()]
    found = {domains.get(c.id) for c in checks}
    if len(found) != 1 or (domain := found.pop()) not in SHARED_CAUSES:
        return "", ""
    what = sorted({f"{c.id} {c.device}".strip() for c in checks})
    shown = ", ".join(what[:3]) + (f", +{len(what) - 3} more" if len(what) > 3 else "")
    return domain, f"{domain} ({shown}), {SHARED_CAUSES[domain]} rather than node faults"


def pending_nodes(report: Report, cluster: dict[str, SlurmNode], candidates: list[str],
                  resumed_after: dict[str, float] | None) -> list[str]:
    """The nodes that a draining rule's condition holds on now, its hold not yet elapsed, and that a drain
    could reach once it has: in Slurm, with usable data, in service, held by no one, not newly resumed,
    and not already failing (those count as failing). A fault that reaches many nodes a scrape or two
    apart shows here on all of them before its hold has completed on the first."""
    out, failing = [], set(candidates)
    for name, verdict in report.nodes.items():
        node = cluster.get(name)
        if not verdict.pending or node is None or name in failing or verdict.status == "unknown":
            continue
        if node.out_of_service or node.held_by_slurm or node.foreign_reason or name in (resumed_after or {}):
            continue
        out.append(name)
    return out


def ladder_holds(node: SlurmNode) -> bool:
    """The remediation ladder has this node out of service for a GPU reset, a reboot or a power cycle right now: its
    reason is that step's (`opsctl:reset gpu3 xid-79 ...`, opsctl/health/ladder_reason.py, whose words the
    ladder reads too)."""
    words = step_words(node.reason) if node.owned and not node.manual and node.out_of_service else None
    return words is not None and words.step in (RESET, *BOARD_RESTARTS)


def ladder_nodes(cluster: dict[str, SlurmNode]) -> list[str]:
    return [name for name, node in cluster.items() if ladder_holds(node)]


def _held(node: SlurmNode) -> str:
    return f"Slurm holds it {node.state_text}"


def breaker_detail(stop: str) -> str:
    """The audit detail of a node the circuit breaker left alone (the stop text names the breaker once)."""
    return "circuit-breaker: " + stop.removeprefix("circuit breaker: ")


def new_ladder_faults(node: SlurmNode, drain: list[Check]) -> list[Check]:
    """The drain checks of a node under the remediation ladder whose rule, or GPU, its reason does not list yet
    (opsctl/health/ladder_reason.py); none for a node not under the ladder."""
    if not under_ladder(node):
        return []
    gpus, rules = open_faults(node)
    return [c for c in drain if c.id not in rules or (GPU.match(c.device) and c.device not in gpus)]


def ladder_reason(node: SlurmNode, new: list[Check], max_length: int) -> str:
    """The ladder's reason with the new faults in it: an entry drain gains their rules and evidence, a step
    their GPUs and rules (a pass becomes unchecked: it did not check them)."""
    words = step_words(node.reason)
    if words is None:
        return escalated_reason(node, new, max_length)
    added = with_new_step_faults(words, [c.device for c in new if GPU.match(c.device)], [c.id for c in new],
                                 "; ".join(c.evidence for c in new))
    return cap_reason(added.reason, max_length)


def plan_drains(report: Report, cluster: dict[str, SlurmNode], rules: list[Rule], safety: SafetyConfig,
                drains_last_hour: int, dry_run: bool, scope: set[str] | None = None,
                resumed_after: dict[str, float] | None = None) -> Plan:
    """Drain decisions for the nodes in scope (all when None); the limits count the whole cluster.
    `resumed_after`: node -> when opsctl resumed it, for nodes whose resume is newer than this run's data
    (less a scrape): that data may predate the repair the resume followed, so it drains none of them."""
    plan = Plan()
    needs_person = {r.id for r in rules if not r.auto_resume}
    may_resume = {r.id for r in rules if r.auto_resume}
    candidates = []
    for name, verdict in report.nodes.items():
        drain = verdict.drain_checks()
        if not verdict.in_slurm:
            plan.set(Decision(name, "skip:not-in-slurm"))
        elif verdict.status == "unknown":
            if drain:
                plan.set(Decision(name, "skip:unknown"))
        elif verdict.status == "fail" and drain:
            node = cluster[name]
            if node.owned and (node.drained or (node.back_from_reboot and step_words(node.reason) is not None)):
                # Ours already. An event that needs a person turns an auto-resumable drain into one that does;
                # a new fault on a node under the remediation ladder joins what its validation must clear.
                new = [c for c in drain if c.id in needs_person and c.id not in node.reason_rules()]
                ladder = new_ladder_faults(node, drain)
                touch = ladder_reach(node)  # a new fault re-words it: the ladder's own reboot holds nothing
                if (new or ladder) and touch.verdict == HANDS_OFF and not node.manual:
                    plan.set(Decision(name, "skip:" + touch.why.split(":", 1)[0], touch.why, seen=node))
                elif ladder:
                    plan.set(Decision(name, "would-escalate" if dry_run else "escalate", checks=tuple(ladder),
                                      detail=f"{NEW_FAULT}: " + ", ".join(f"{c.device} {c.id}".strip() for c in ladder),
                                      reason=ladder_reason(node, ladder, safety.reason_max_length), seen=node,
                                      values=check_values(ladder)))
                elif new and not node.manual and set(node.reason_rules()) <= may_resume:
                    plan.set(Decision(name, "would-escalate" if dry_run else "escalate", checks=tuple(new),
                                      reason=escalated_reason(node, new, safety.reason_max_length), seen=node,
                                      values=check_values(new)))
                else:
                    plan.set(Decision(name, "skip:already-drained"))
            elif not (judged := reach(node, take=True)).ok:  # the one judgement (opsctl/slurm/reach.py)
                plan.set(Decision(name, "skip:" + judged.why.split(":", 1)[0], judged.why, seen=node))
            elif name in (resumed_after or {}):
                plan.set(Decision(name, "skip:resumed-since-data", "resumed-since-data: opsctl resumed it after "
                                  "the data this run read; the next run judges newer data", seen=node))
            else:
                candidates.append(name)
    total = len(counted_nodes(cluster))
    limit = breaker_limit(safety, total)
    stop = unknown_stop(report, cluster, safety)
    plan.counted = BreakerCount(len(candidates), len(pending_nodes(report, cluster, candidates, resumed_after)),
                                len(ladder_nodes(cluster)), limit)
    if candidates and plan.counted.all > limit:
        stop = (f"circuit breaker: {plan.counted.text()}, more than the limit {limit:g} (max of "
                f"{safety.breaker_min_nodes} nodes and {safety.breaker_fraction:.0%} of {total}); acting on none")
        domain, outage = shared_outage(report, candidates, rules)
        if outage:
            stop = f"circuit breaker: {outage}; {stop.removeprefix('circuit breaker: ')}"
            plan.outage, plan.outage_nodes = domain, tuple(sorted(candidates))
    acting = [n for n in sorted(candidates) if scope is None or n in scope]
    if stop:
        plan.stop, plan.breaker = stop, True
        for name in acting:
            plan.set(Decision(name, "skip:circuit-breaker", breaker_detail(stop), seen=cluster[name]))
        return _narrow(plan, scope)
    budget = max(0, min(safety.max_drains_per_run, safety.max_drains_per_hour - drains_last_hour))
    room, full = out_of_service_room(cluster, safety)
    for index, name in enumerate(acting):
        if index >= min(budget, room):
            if room < budget:
                why, detail = "out-of-service-limit", full
            else:
                why, detail = "budget", (f"drain budget spent ({safety.max_drains_per_run} per run, "
                                         f"{safety.max_drains_per_hour} per hour)")
            plan.set(Decision(name, f"skip:{why}", f"{why}: {detail}", seen=cluster[name]))
            plan.stop = plan.stop or f"{detail}: {len(acting) - index} failing nodes left as they are"
            continue
        checks = report.nodes[name].drain_checks()
        plan.set(Decision(name, "would-drain" if dry_run else "drain", checks=tuple(checks),
                          reason=drain_reason(checks, safety.reason_max_length), seen=cluster[name],
                          values=check_values(checks)))
    return _narrow(plan, scope)


def _narrow(plan: Plan, scope: set[str] | None) -> Plan:
    if scope is not None:
        plan.decisions = {n: d for n, d in plan.decisions.items() if n in scope}
    return plan


def resume_candidates(report: Report, cluster: dict[str, SlurmNode], rules: list[Rule],
                      scope: set[str] | None = None) -> dict[str, set[str]]:
    """rule id -> nodes that opsctl drained for it and may resume once it reads ok (they need evidence)."""
    by_id = {rule.id: rule for rule in rules}
    wanted: dict[str, set[str]] = {}
    for name, node in cluster.items():
        verdict = report.nodes.get(name)
        rule_ids = node.reason_rules()
        if (scope is not None and name not in scope) or not node.resumable or verdict is None \
                or verdict.status in ("unknown", "fail") or not rule_ids:
            continue
        if all(r in by_id and by_id[r].auto_resume and not verdict.breaching(r) for r in rule_ids):
            for rule_id in rule_ids:
                wanted.setdefault(rule_id, set()).add(name)
    return wanted


def _resume_refusal(node: SlurmNode, verdict: NodeVerdict | None, rule_ids: list[str], by_id: dict[str, Rule],
                    evidence: dict[tuple[str, str], Evidence]) -> str:
    if verdict is None or verdict.status == "unknown":
        return "unknown"
    if not rule_ids or any(r not in by_id for r in rule_ids):
        return "rule-unknown"
    if any(not by_id[r].auto_resume for r in rule_ids):
        return "needs-person"
    if not node.resumable:
        return "slurm-state"
    if any(verdict.breaching(r) for r in rule_ids):
        return "still-failing"
    if verdict.status == "fail":
        return "other-failing"
    found = [evidence.get((node.name, r), Evidence()) for r in rule_ids]
    if any(e.status == "failing" for e in found):
        return "still-failing"
    if any(e.status != "ok" for e in found):
        return "no-data"  # a series that vanished, or NaN: no positive evidence
    return ""


def plan_resumes(report: Report, cluster: dict[str, SlurmNode], rules: list[Rule],
                 evidence: dict[tuple[str, str], Evidence], healthy_since: dict[str, float], resume_after_s: float,
                 safety: SafetyConfig, resumes_last_hour: int, dry_run: bool, now: float,
                 scope: set[str] | None = None, plan: Plan | None = None) -> Plan:
    """Resume only opsctl's own automatic drains whose rules all read ok, with positive evidence, for
    safety.resume_after, within the resume budget."""
    plan = plan or Plan()
    by_id = {rule.id: rule for rule in rules}
    since: dict[str, float] = {}
    ready = []
    for name, node in sorted(cluster.items()):
        if (scope is not None and name not in scope) or not (node.drained and node.owned) or node.manual:
            continue
        why = _resume_refusal(node, report.nodes.get(name), node.reason_rules(), by_id, evidence)
        if why:
            if plan.action(name) == "none":
                detail = f"slurm-state: {_held(node)}" if why == "slurm-state" else ""
                plan.set(Decision(name, f"skip:{why}", detail, seen=node))
            continue
        since[name] = healthy_since.get(name, now)
        if now - since[name] < resume_after_s:
            plan.set(Decision(name, "skip:healthy-period", seen=node, eligible_at=since[name] + resume_after_s))
            continue
        ready.append(name)
    plan.healthy_since = since
    budget = max(0, min(safety.max_resumes_per_run, safety.max_resumes_per_hour - resumes_last_hour))
    for index, name in enumerate(ready):
        if plan.breaker:
            plan.set(Decision(name, "skip:circuit-breaker", breaker_detail(plan.stop), seen=cluster[name]))
        elif index >= budget:
            why = (f"budget: resume budget spent ({safety.max_resumes_per_run} per run, "
                   f"{safety.max_resumes_per_hour} per hour)")
            plan.set(Decision(name, "skip:budget", why, seen=cluster[name]))
            plan.stop = plan.stop or f"resume budget spent: {len(ready) - index} healthy nodes left drained"
        else:
            values = tuple({"rule": r, "device": device, "value": value, "threshold": by_id[r].threshold}
                           for r in cluster[name].reason_rules() for device, value in evidence[(name, r)].values)
            plan.set(Decision(name, "would-resume" if dry_run else "resume", seen=cluster[name],
                              healthy_s=now - since[name], values=values))
    return plan


def without(plan: Plan, node: str, why: str) -> None:
    """A planned change dropped at the last moment (Slurm changed under it)."""
    plan.set(replace(plan.decisions[node], action=f"skip:{why.split(':', 1)[0]}", detail=why))
