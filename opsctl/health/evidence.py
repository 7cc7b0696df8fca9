"""Positive evidence that a rule is ok on a node: the rule's own expression, without its threshold
filter, must return the node's series, every value finite and not breaching. A series that vanished
is not ok: it is `no-data`.

Evidence is per device. A rule over devices that have a series whether they are healthy or not (GPUs,
device_label `gpu`; InfiniBand HCAs, device_label `device`) must return every device it covers on the
node: the devices the config expects on every node (Rule.devices: GPUs 0 to hardware.gpus_per_node - 1,
and the rails of ib.rails that hardware.ib_devices selects) and every device that the drain named. One
of them without a series, or NaN, makes the evidence `no-data`, whatever the other devices read: a node
drained for `ib-down mlx5_3` stays drained while mlx5_3 has no series, even if seven rails read ACTIVE.

The devices a drain named come from its Slurm reason, `opsctl:<rule-ids> <evidence>; <evidence>`
(opsctl.health.plan.drain_reason): each evidence starts with its device (Rule.format_evidence).
The reason is the record of the drain that the planner itself trusts (it reads the rule ids from it);
the report cannot name a device whose series is gone, since a missing series yields no check. A piece of
the reason counts for a rule only when it reads as that rule's evidence template with a device of the
rule's kind in front, so a truncated reason (`...`) or another rule's evidence names nothing.

Node check results (device_label finding, mount, target, nid) name a device only while it fails (a
passing check is written on device "node"), so their evidence stays per rule, not per device.

One query per rule asked about, however many nodes: rules that resume candidates were drained for,
and rules whose handled events may be forgotten once they read ok again.
"""

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from opsctl.health.catalog import Rule
from opsctl.health.evaluate import Report
from opsctl.health.units import PLACEHOLDER
from opsctl.prom.client import PromQuery
from opsctl.slurm.base import OWNED_PREFIX

# The device labels whose devices export a series while healthy, and what one looks like in a reason.
PER_DEVICE = {"gpu": re.compile(r"gpu(\d+)"), "device": re.compile(r"[A-Za-z0-9_.:-]+")}


@dataclass
class Evidence:
    status: str = "no-data"  # ok | failing | unknown (NaN or infinite) | no-data
    values: list[tuple[str, float]] = field(default_factory=list)  # (device or "", value)
    missing: list[str] = field(default_factory=list)  # devices the rule covers on the node without a series

    def add(self, rule: Rule, device: str, value: float) -> None:
        self.values.append((device, value))
        if not math.isfinite(value):
            self.status = "unknown"
        elif rule.breaches(value):
            self.status = "unknown" if self.status == "unknown" else "failing"
        elif self.status == "no-data":
            self.status = "ok"

    def require(self, devices: set[str]) -> None:
        """Every device of `devices` must have a series: one that has none turns ok into no-data."""
        self.missing = sorted(devices - {device for device, _ in self.values})
        if self.missing and self.status == "ok":
            self.status = "no-data"


def _shown(rule: Rule, raw: str) -> str:
    return f"gpu{raw}" if rule.device_label == "gpu" else raw


def _template(rule: Rule) -> re.Pattern[str]:
    """The rule's evidence as a pattern: its device, a space, the template with any value in its places."""
    literal = [re.escape(part) for part in PLACEHOLDER.split(rule.evidence)[::3]]
    return re.compile(r"(\S+) " + ".*".join(literal))


def named_devices(reason: str, rules: list[Rule]) -> dict[str, set[str]]:
    """rule id -> the devices (as evidence shows them: gpu3, mlx5_3) that an opsctl reason names for it,
    for the rules of the reason that judge devices with a series of their own (PER_DEVICE)."""
    if not reason.startswith(OWNED_PREFIX) or " " not in reason:
        return {}
    head, tail = reason[len(OWNED_PREFIX):].split(" ", 1)
    by_id = {rule.id: rule for rule in rules}
    mine = [by_id[r] for r in head.split(",") if r in by_id and by_id[r].device_label in PER_DEVICE]
    found: dict[str, set[str]] = {}
    for piece in tail.split("; "):
        for rule in mine:
            match = _template(rule).fullmatch(piece.strip())
            if match and PER_DEVICE[rule.device_label].fullmatch(match.group(1)):
                found.setdefault(rule.id, set()).add(match.group(1))
    return found


def read_evidence(client: PromQuery, rules: list[Rule], wanted: dict[str, set[str]], report: Report,
                  reasons: Mapping[str, str] | None = None) -> dict[tuple[str, str], Evidence]:
    """(node, rule id) -> Evidence for every node of wanted[rule id]. `reasons`: node -> its Slurm reason,
    whose named devices the evidence must cover too."""
    asked = [rule for rule in rules if wanted.get(rule.id)]
    if not asked or report.identities is None:
        return {}
    answers = client.query_many([rule.expr for rule in asked], at=report.query_time)
    report.queries += len(asked)
    named = {node: named_devices(reason, asked) for node, reason in (reasons or {}).items()}
    found: dict[tuple[str, str], Evidence] = {}
    for rule, samples in zip(asked, answers, strict=True):
        nodes = wanted[rule.id]
        for node in nodes:
            found[(node, rule.id)] = Evidence()
        for sample in samples:
            node = report.identities.node_of(sample.labels)
            if node in nodes:
                raw = sample.labels.get(rule.device_label, "") if rule.device_label else ""
                found[(node, rule.id)].add(rule, _shown(rule, raw) if raw else "", sample.value)
        if rule.device_label in PER_DEVICE:
            expected = {_shown(rule, device) for device in rule.devices}
            for node in nodes:
                found[(node, rule.id)].require(expected | named.get(node, {}).get(rule.id, set()))
    return found
