"""Positive evidence that a rule is ok on a node: the rule's own expression, without its threshold
filter, must return the node's series, every value finite and not breaching. A series that vanished
is not ok: it is `no-data`.

One query per rule asked about, however many nodes: rules that resume candidates were drained for,
and rules whose handled events may be forgotten once they read ok again.
"""

import math
from dataclasses import dataclass, field

from opsctl.health.catalog import Rule
from opsctl.health.evaluate import Report
from opsctl.prom.client import PromQuery


@dataclass
class Evidence:
    status: str = "no-data"  # ok | failing | unknown (NaN or infinite) | no-data
    values: list[tuple[str, float]] = field(default_factory=list)  # (device or "", value)

    def add(self, rule: Rule, device: str, value: float) -> None:
        self.values.append((device, value))
        if not math.isfinite(value):
            self.status = "unknown"
        elif rule.breaches(value):
            self.status = "unknown" if self.status == "unknown" else "failing"
        elif self.status == "no-data":
            self.status = "ok"


def read_evidence(client: PromQuery, rules: list[Rule], wanted: dict[str, set[str]],
                  report: Report) -> dict[tuple[str, str], Evidence]:
    """(node, rule id) -> Evidence for every node of wanted[rule id]."""
    asked = [rule for rule in rules if wanted.get(rule.id)]
    if not asked or report.identities is None:
        return {}
    answers = client.query_many([rule.expr for rule in asked])
    report.queries += len(asked)
    found: dict[tuple[str, str], Evidence] = {}
    for rule, samples in zip(asked, answers, strict=True):
        nodes = wanted[rule.id]
        for node in nodes:
            found[(node, rule.id)] = Evidence()
        for sample in samples:
            node = report.identities.node_of(sample.labels)
            if node in nodes:
                device = sample.labels.get(rule.device_label, "") if rule.device_label else ""
                if rule.device_label == "gpu" and device:
                    device = f"gpu{device}"
                found[(node, rule.id)].add(rule, device, sample.value)
    return found
