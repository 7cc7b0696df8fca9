"""Rule results that Prometheus has already computed: the catalog as recording rules, and their reading.

Each catalog rule becomes a rule group of its own with one recording rule:

    record: opsctl:health_breach
    labels: {opsctl_rule: <id>, opsctl_expr: <hash of the expression>}
    expr:   (<Rule.alert_expr()>) or label_replace(vector(time()), "opsctl_heartbeat", "1", "", "")
              [or <Rule.pending_expr()>, for a rule that drains]

so Prometheus writes, every `prometheus.recording_interval`, one series per breaching, NaN or infinite
device (the labels of the direct answer, which the verdict needs, plus the two above), one per device
whose condition holds now but whose hold has not yet elapsed, marked `opsctl_pending="1"` (the circuit
breaker counts those nodes: opsctl/health/plan.py), and one heartbeat whose value is the time of that
evaluation. The heartbeat and the pending series are part of the same expression: a rule that failed to
evaluate (a timeout, a store down) writes no heartbeat, so its old results are never read as new, and
the pending series are always of the same evaluation as the breaches beside them. One group per rule
lets Prometheus evaluate them side by side on a head node's cores, and a slow rule delays only itself.

`opsctl health` reads them all with one query. A rule's results are used when its heartbeat is there,
carries the hash of the expression opsctl would run (a config changed since the export, another cluster's
catalog on the same Prometheus: the hash differs), and is younger than two recording intervals. Any
other rule is queried directly, as before; the run says which path it took and why. Decisions are the
same on both paths: the recorded series are the direct answer as of the last evaluation, less the two
labels above (tests/component/test_health_evaluate.py compares them, and VictoriaMetrics, on every test).
"""

import hashlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from opsctl.config.schema import Config
from opsctl.health.catalog import Rule
from opsctl.prom.client import Sample

RECORD = "opsctl:health_breach"
RULE_LABEL = "opsctl_rule"
EXPR_LABEL = "opsctl_expr"
HEARTBEAT_LABEL = "opsctl_heartbeat"
GROUP_PREFIX = "opsctl-precomputed-"
QUERY = RECORD  # every rule's results and heartbeats: small, whatever the cluster's size


def expr_hash(rule: Rule) -> str:
    """What the recorded results were computed from: 16 hex digits of what a direct run asks for the rule
    (Rule.judged_expr), so results recorded without the pending series (an older export) are not used."""
    return hashlib.sha256(rule.judged_expr().encode()).hexdigest()[:16]


def recorded_expr(rule: Rule) -> str:
    """The direct answer (Rule.judged_expr: the breaches, then the pending series) with the heartbeat."""
    heartbeat = f'label_replace(vector(time()), "{HEARTBEAT_LABEL}", "1", "", "")'
    pending = rule.pending_expr()
    return f"({rule.alert_expr()}) or {heartbeat}" + (f" or {pending}" if pending else "")


def recording_groups(rules: list[Rule], config: Config) -> list[dict[str, Any]]:
    interval = f"{config.prometheus.recording_interval_seconds:g}s"
    return [{"name": GROUP_PREFIX + rule.id, "interval": interval, "rules": [{
        "record": RECORD, "expr": recorded_expr(rule),
        "labels": {RULE_LABEL: rule.id, EXPR_LABEL: expr_hash(rule)}}]} for rule in rules]


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
