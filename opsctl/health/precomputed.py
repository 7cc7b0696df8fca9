"""Rule results that Prometheus has already computed: the catalog as recording rules, and their reading.

Each catalog rule becomes a rule group of its own, but for the XID rules, which share one (xid_group:
their raw series read once per round, opsctl/health/xid_inputs.py). The expensive part, the rule's
expression over every device of the fleet, runs once per round; what follows runs over its result, which
holds only the devices that are not certainly ok (an empty result for a healthy GPU):

  0. record: opsctl:health_unhealthy        (a rule with a healthy value, Rule.healthy)
     expr:   (<expr>) != <healthy>, or the catalog's `unhealthy` (Rule.unhealthy)
     the series with any other value, NaN and infinities kept: stage 1 reads these instead of the
     expression, which then runs once per round instead of twice (the condition reads it twice).
     [a rule with `candidates` records those first, as opsctl:health_candidates, and its `unhealthy`
     reads them: a filter that reads the fleet once, then the arithmetic over the few series it kept]
  1. record: opsctl:health_condition        (a rule opsctl holds: Rule.plot_expr without its hold)
     expr:   <Rule.condition_expr()> or <heartbeat: vector(time()), opsctl_heartbeat="1">
     the devices whose value breaches, or is NaN or infinite, now, each with its value.
  2. record: opsctl:health_breach
     expr:   the hold over stage 1's own history: the series present at each of the last
             catalog.hold_samples() evaluations (one every recording interval over the hold, its first
             sample included: a series that appeared breaching has held for no time), with the least
             breaching of those values (catalog.least_breaching)
             or stage 1's heartbeat (its value is the time of stage 1's evaluation), when stage 1 ran
             at every round of the hold; else it is marked opsctl_heartbeat="young" and opsctl reads the
             rule directly (the rules were just loaded, Prometheus restarted, or rounds were missed)
             [or stage 1's breaching series now, marked opsctl_pending="1", for a rule that drains]

A rule whose expr holds by itself (a ${hold} window) has stage 1 only, recorded as opsctl:health_breach:
its condition is its answer. Both carry {opsctl_rule: <id>, opsctl_expr: <hash of the expression>}.

Rules in one group run in order at one evaluation timestamp, and each rule's results are written before
the next one runs ("Rules within a group are run sequentially at a regular interval, with the same
evaluation time": prometheus.io/docs/prometheus/latest/configuration/recording_rules/), so stage 2 reads
stage 1 of the same round. The hold is sampled at the recording interval: the direct path (catalog.held)
samples its subquery at the same interval, so both decide alike; with the default recording interval
(the scrape interval) that is every scrape. The stages join nothing over the whole fleet: stage 0
and stage 1 filter by comparisons with a number, stage 2 reads a few series (what the rule's own
expression joins it joins once per round; the XID inputs' one join, the gauge only where the windowed
count is missing, runs once for every XID rule). The pending series (plan.py's circuit breaker
counts those nodes) and the heartbeat come from stage 1's evaluation of the same round: a stage 1 that
failed to evaluate (a timeout, a store down) leaves stage 2 an old heartbeat, so no result is read as new.

`opsctl health` reads opsctl:health_breach with one query. A rule's results are used when its heartbeat is
there, carries the hash of the expression opsctl would run (a config changed since the export, another
cluster's catalog on the same Prometheus: the hash differs), and is younger than two recording intervals.
Any other rule is queried directly, as before; the run says which path it took and why. Decisions are the
same on both paths (tests/component/test_health_evaluate.py compares them, and VictoriaMetrics, on every
test; bench/health_scale.py at 16,384 nodes).
"""

import hashlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from opsctl.config.schema import Config, duration_seconds
from opsctl.health import xid_inputs
from opsctl.health.catalog import (
    CANDIDATES_PLACEHOLDER,
    PENDING_LABEL,
    Rule,
    condition,
    hold_samples,
    least_breaching,
    promql_number,
)
from opsctl.prom.client import Sample

RECORD = "opsctl:health_breach"
CONDITION = "opsctl:health_condition"  # stage 1 of a held rule: the devices not certainly ok now
RULE_LABEL = "opsctl_rule"
EXPR_LABEL = "opsctl_expr"
HEARTBEAT_LABEL = "opsctl_heartbeat"
GROUP_PREFIX = "opsctl-precomputed-"
UNHEALTHY = "opsctl:health_unhealthy"  # stage 0 of a rule with a healthy value: the series without it
CANDIDATES = "opsctl:health_candidates"  # before stage 0, where the catalog filters first (Rule.candidates)
XID_GROUP = GROUP_PREFIX + "xid"  # the XID rules that share their inputs (xid_inputs)
YOUNG = "young"  # a heartbeat of stage 2 whose stage 1 has not yet recorded a whole hold
QUERY = RECORD  # every rule's results and heartbeats: small, whatever the cluster's size
HEARTBEAT = f'label_replace(vector(time()), "{HEARTBEAT_LABEL}", "1", "", "")'


def expr_hash(rule: Rule) -> str:
    """What the recorded results were computed from: 16 hex digits of what a direct run asks for the rule
    (Rule.judged_expr: its hold, sampled at the recording interval, and the pending series), so results
    recorded from another expression or interval are not used."""
    return hashlib.sha256(rule.judged_expr().encode()).hexdigest()[:16]


def _selector(rule: Rule, metric: str, **labels: str) -> str:
    matchers = {RULE_LABEL: rule.id, EXPR_LABEL: expr_hash(rule), **labels}
    return metric + "{" + ", ".join(f'{k}="{v}"' for k, v in matchers.items()) + "}"


def condition_expr(rule: Rule, over: str = "") -> str:
    """Stage 1: the devices not certainly ok now, and the heartbeat of this evaluation. `over`: the rule's
    expression as it reads a shared stage (xid_inputs.rewrite), else its own."""
    not_ok = condition(over, rule.op, rule.threshold) if over else rule.condition_expr()
    return f"{not_ok} or {HEARTBEAT}"


def hold_expr(rule: Rule) -> str:
    """Stage 2 of a held rule, over stage 1's recorded history (see the module docstring). Stage 1 runs
    every Rule.step (the recording interval): the window holds the last hold_samples() rounds and no more,
    whether the engine's windows include their start (Prometheus 2) or not (Prometheus 3, MetricsQL)."""
    samples = hold_samples(rule.hold, rule.step)
    step_ms = duration_seconds(rule.step) * 1000
    window_ms = (samples - 1) * step_ms + step_ms // 2
    now = _selector(rule, CONDITION, **{HEARTBEAT_LABEL: ""})
    window = f"{now}[{window_ms}ms]"
    held = f"({least_breaching(window, rule.op, rule.threshold)}) and (count_over_time({window}) >= {samples})"
    # Stage 1's heartbeat, when stage 1 ran at every round of the hold; else marked young: the history
    # cannot hold anything yet (the rules were just loaded, Prometheus restarted or missed rounds), so
    # opsctl reads the rule directly until it can.
    beat = _selector(rule, CONDITION, **{HEARTBEAT_LABEL: "1"})
    whole = f"count_over_time({beat}[{window_ms}ms]) >= {samples}"
    young = f'label_replace({beat} unless on() ({whole}), "{HEARTBEAT_LABEL}", "{YOUNG}", "", "")'
    out = f"{held} or ({beat} and on() ({whole})) or {young}"
    if rule.pending_expr():
        out += f' or label_replace({now} {rule.op} {promql_number(rule.threshold)}, "{PENDING_LABEL}", "1", "", "")'
    return out


def unhealthy_expr(rule: Rule, candidates: str = "") -> str:
    """Stage 0 of a rule with a healthy value: its series with any other value, NaN and infinities
    included (`!=` keeps them). The condition drops a certainly-ok value anyway, so judging these decides
    the same as judging every series, and the expression runs once per round instead of twice. The
    catalog's `unhealthy`, where a rule has one, spells the same series with fewer joins; `candidates`:
    what its ${candidates} reads (the recorded step), by default the rule's candidates inline."""
    if not rule.unhealthy:
        return f"({rule.plot_expr or rule.expr}) != {promql_number(rule.healthy or 0.0)}"
    return rule.unhealthy.replace(CANDIDATES_PLACEHOLDER, candidates or f"({rule.candidates})")


def recording_rules(rule: Rule) -> list[dict[str, Any]]:
    """The rule's group's rules, in the order they run."""
    labels = {RULE_LABEL: rule.id, EXPR_LABEL: expr_hash(rule)}
    first: list[dict[str, Any]] = []
    over = ""
    if rule.healthy is not None:
        recorded = _selector(rule, CANDIDATES) if rule.candidates else ""
        if recorded:
            first.append({"record": CANDIDATES, "expr": rule.candidates, "labels": labels})
        first.append({"record": UNHEALTHY, "expr": unhealthy_expr(rule, recorded), "labels": labels})
        over = _selector(rule, UNHEALTHY)
    if not rule.plot_expr:
        return [*first, {"record": RECORD, "expr": condition_expr(rule, over), "labels": labels}]
    return [*first, {"record": CONDITION, "expr": condition_expr(rule, over), "labels": labels},
            {"record": RECORD, "expr": hold_expr(rule), "labels": labels}]


def _labelled(rule: Rule, expr: str) -> str:
    """expr's series with the rule's two labels, where one recording rule records several catalog rules."""
    inner = f'label_replace({expr}, "{RULE_LABEL}", "{rule.id}", "", "")'
    return f'label_replace({inner}, "{EXPR_LABEL}", "{expr_hash(rule)}", "", "")'


def xid_group(rules: list[tuple[Rule, xid_inputs.Rewritten]], src: xid_inputs.Sources) -> dict[str, Any]:
    """The XID rules' group (opsctl/health/xid_inputs.py): their raw series read once into
    opsctl:xid_input, then every rule's stage 1 in one recording rule and every rule's stage 2 (or its
    only stage) in another, each rule's series under its own labels, as its own group would record them."""
    names = sorted(set().union(*(rewritten.inputs for _, rewritten in rules)))
    shared = " or ".join(f'label_replace({src.expr(name)}, "{xid_inputs.INPUT_LABEL}", "{name}", "", "")'
                         for name in names)
    held = [(rule, rewritten) for rule, rewritten in rules if rule.plot_expr]
    stage1 = [_labelled(rule, condition_expr(rule, rewritten.expr)) for rule, rewritten in held]
    last = [f"({hold_expr(rule)})" for rule, _ in held]
    last += [_labelled(rule, condition_expr(rule, rewritten.expr)) for rule, rewritten in rules
             if not rule.plot_expr]
    out = [{"record": xid_inputs.INPUT, "expr": shared}]
    if stage1:
        out.append({"record": CONDITION, "expr": " or ".join(stage1)})
    out.append({"record": RECORD, "expr": " or ".join(last)})
    return {"name": XID_GROUP, "interval": rules[0][0].step, "rules": out}


def recording_groups(rules: list[Rule], config: Config) -> list[dict[str, Any]]:
    """Every group runs every prometheus.recording_interval: the interval the holds were written for
    (Rule.step, from the same config), so stage 2's window always spans the rounds it counts. The XID
    rules that read the shared XID inputs share one group; every other rule has a group of its own."""
    src = xid_inputs.sources(config)
    shared = [(rule, rewritten) for rule in rules if (rewritten := xid_inputs.rewrite(rule, src))]
    in_shared = {rule.id for rule, _ in shared}
    own = [{"name": GROUP_PREFIX + rule.id, "interval": rule.step, "rules": recording_rules(rule)}
           for rule in rules if rule.id not in in_shared]
    return ([xid_group(shared, src)] if shared else []) + own


def alert_expr(rule: Rule) -> str:
    """The exported alert of a rule whose results are recorded: its recorded breaches (not the pending
    series, not the heartbeat), without the two recording labels: the alert carries the labels of the
    direct answer, and Prometheus does not evaluate the condition twice."""
    breaches = _selector(rule, RECORD, **{HEARTBEAT_LABEL: "", PENDING_LABEL: ""})
    return f'label_replace(label_replace({breaches}, "{RULE_LABEL}", "", "", ""), "{EXPR_LABEL}", "", "", "")'


@dataclass
class Precomputed:
    """What the recorded results give: answers for the rules they cover, and the rules still to query."""

    answers: dict[str, list[Sample]] = field(default_factory=dict)
    direct: list[Rule] = field(default_factory=list)
    why: dict[str, list[str]] = field(default_factory=dict)  # reason -> rule ids read directly for it
    oldest: float = 0.0  # the age in seconds of the oldest recorded results used

    @property
    def path(self) -> str:
        if not self.direct:
            return "precomputed"
        return "mixed" if self.answers else "direct"

    def note(self) -> str:
        """One line when a rule had to be read directly although recorded results were wanted, else ""."""
        if not self.why:
            return ""
        total = len(self.direct) + len(self.answers)
        which = "every rule" if not self.answers else f"{len(self.direct)} of {total} rules"
        reasons = "; ".join(f"{why}: {_ids(ids)}" for why, ids in self.why.items())
        return f"recorded rule results not used for {which}, queried directly ({reasons})"


def _ids(ids: list[str]) -> str:
    return ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")


def read(samples: list[Sample], rules: list[Rule], config: Config) -> Precomputed:
    """Split the answer to QUERY by rule; keep the rules whose heartbeat is there, fresh, and theirs."""
    fresh_for = 2 * config.prometheus.recording_interval_seconds
    wanted = {rule.id: expr_hash(rule) for rule in rules}
    beats: dict[str, list[float]] = defaultdict(list)  # rule id -> ages of heartbeats with our hash
    other_hash: set[str] = set()
    young: set[str] = set()  # rules whose recorded history is shorter than their hold
    results: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        rid = sample.labels.get(RULE_LABEL, "")
        if rid not in wanted:
            continue
        if sample.labels.get(EXPR_LABEL) != wanted[rid]:
            other_hash.add(rid)
            continue
        if sample.labels.get(HEARTBEAT_LABEL) == "1":
            beats[rid].append(sample.at - sample.value)
            continue
        if sample.labels.get(HEARTBEAT_LABEL) == YOUNG:
            young.add(rid)
            continue
        labels = {k: v for k, v in sample.labels.items() if k not in (RULE_LABEL, EXPR_LABEL, "__name__")}
        results[rid].append(Sample(labels=labels, value=sample.value, at=sample.at))
    out = Precomputed()
    for rule in rules:
        ages = beats.get(rule.id)
        if ages and max(ages) <= fresh_for:
            out.answers[rule.id] = results.get(rule.id, [])
            out.oldest = max(out.oldest, max(ages))
            continue
        if ages:
            why = f"older than {fresh_for:g}s (2 x prometheus.recording_interval)"
        elif rule.id in young:
            why = "recorded for less than their hold (rules just loaded, or rounds missed)"
        elif rule.id in other_hash:
            why = "recorded from another expression (export the rules again)"
        else:
            why = "not recorded (opsctl rules export installs the recording rules)"
        out.direct.append(rule)
        out.why.setdefault(why, []).append(rule.id)
    return out


def everything_direct(rules: list[Rule]) -> Precomputed:
    """prometheus.recording_rules: off. No note: the site chose the direct path."""
    return Precomputed(direct=list(rules))
