"""The metric families opsctl exports and their current values, free of any I/O.

Counters and the duration histogram add up over runs. A one-shot run starts from the values of the
textfile the previous run wrote (`restore`), so the timer's counters only ever grow, as Prometheus
expects of a counter. The gauges of the last completed run (`per_run`) are replaced as a whole by the
next completed run; a run that fails keeps them, so a brief Prometheus outage does not make every node
vanish from the dashboards. Per-node series carry the label `slurm_node`: where node_exporter serves
the textfile, its target already has a `node` label (the head node's name).
"""

import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

Labels = tuple[str, ...]


@dataclass(frozen=True)
class Family:
    name: str  # the exposed name (a counter's ends in _total)
    kind: str  # counter, gauge or histogram
    help: str
    labels: tuple[str, ...] = ()
    per_run: bool = False  # a snapshot of the last completed run


RESULTS = {0: "ok", 1: "failing", 2: "usage", 3: "source-down", 4: "safety-stop"}
SAFETY_RULES = ("circuit-breaker", "budget", "not-owned", "lock")
STATUS_CODES = {"ok": 0, "warn": 1, "fail": 2, "unknown": 3}
DURATION_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, math.inf)

RUNS = Family("opsctl_runs_total", "counter", "opsctl health runs, by result: ok (exit 0), failing (1), "
              "usage (2), source-down (3), safety-stop (4).", ("result",))
DURATION = Family("opsctl_run_duration_seconds", "histogram", "Wall time of opsctl health runs.")
DRAINS = Family("opsctl_drains_total", "counter", "Nodes drained by opsctl health, per rule in the drain reason.",
                ("rule_id",))
RESUMES = Family("opsctl_resumes_total", "counter", "Nodes resumed by opsctl health, per rule of the lifted drain.",
                 ("rule_id",))
REFUSALS = Family("opsctl_refusals_total", "counter", "Actions a safety rule refused: circuit-breaker, budget, "
                  "not-owned (drained by someone else), lock (another acting run).", ("safety_rule",))
LAST_RUN = Family("opsctl_last_run_timestamp_seconds", "gauge", "When the last run ended, whatever its result.")
LAST_SUCCESS = Family("opsctl_last_success_timestamp_seconds", "gauge",
                      "When the last run ended that read Prometheus and Slurm and judged every node.")
NODES = Family("opsctl_nodes", "gauge", "Nodes per opsctl status in the last completed run.", ("status",), True)
NODE_STATUS = Family("opsctl_node_status", "gauge", "Each node's status in the last completed run: 0 ok, 1 warn, "
                     "2 fail, 3 unknown (no fresh data).", ("slurm_node",), True)
BREAKER = Family("opsctl_circuit_breaker_tripped", "gauge",
                 "1 when the circuit breaker stopped the last completed run from acting.", (), True)
SLURM_NODES = Family("opsctl_slurm_nodes", "gauge", "Slurm nodes per state (drained and draining apart) in the last "
                     "completed run.", ("state",), True)
DRAINED = Family("opsctl_node_drained", "gauge", "1 for each drained node; owner: opsctl, opsctl-manual or other.",
                 ("slurm_node", "owner"), True)
NEEDS_PERSON = Family("opsctl_node_needs_person", "gauge", "1 for each node that opsctl drained for a rule that "
                      "never auto-resumes (or that is no longer in the catalog).", ("slurm_node", "rule_id"), True)
FAMILIES = (RUNS, DURATION, DRAINS, RESUMES, REFUSALS, LAST_RUN, LAST_SUCCESS, NODES, NODE_STATUS, BREAKER,
            SLURM_NODES, DRAINED, NEEDS_PERSON)


@dataclass
class RunFacts:
    """What one completed run saw and did, in the terms of the metric families."""

    node_status: dict[str, str] = field(default_factory=dict)  # node -> ok | warn | fail | unknown
    breaker_tripped: bool = False
    slurm_states: dict[str, int] = field(default_factory=dict)  # state -> nodes
    drained: dict[str, str] = field(default_factory=dict)  # node -> owner
    needs_person: dict[str, list[str]] = field(default_factory=dict)  # node -> rule ids
    drains: list[str] = field(default_factory=list)  # one rule id per drained node and rule
    resumes: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)  # one safety rule per refusal
    drain_rules: list[str] = field(default_factory=list)  # rule ids that may drain (their counters start at 0)
    resume_rules: list[str] = field(default_factory=list)


class MetricsState(Collector):
    """Every family's samples; also a prometheus_client collector of them (safe across threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.values: dict[str, dict[Labels, float]] = {f.name: {} for f in FAMILIES if f.kind != "histogram"}
        self.buckets = [0.0] * len(DURATION_BUCKETS)  # cumulative, as exposed
        self.duration_sum = 0.0
        for result in RESULTS.values():
            self.values[RUNS.name][(result,)] = 0.0
        for rule in SAFETY_RULES:
            self.values[REFUSALS.name][(rule,)] = 0.0

    # ---- updates ----------------------------------------------------------------------------
    def record_run(self, exit_code: int, seconds: float, now: float) -> None:
        with self._lock:
            self._add(RUNS, (RESULTS.get(exit_code, "usage"),))
            for index, bound in enumerate(DURATION_BUCKETS):
                if seconds <= bound:
                    self.buckets[index] += 1
            self.duration_sum += seconds
            self.values[LAST_RUN.name][()] = now

    def record_refusal(self, safety_rule: str) -> None:
        with self._lock:
            self._add(REFUSALS, (safety_rule,))

    def record_completed(self, facts: RunFacts, now: float) -> None:
        with self._lock:
            self.values[LAST_SUCCESS.name][()] = now
            for family, rules in ((DRAINS, facts.drain_rules), (RESUMES, facts.resume_rules)):
                for rule in rules:
                    self.values[family.name].setdefault((rule,), 0.0)
            for family, events in ((DRAINS, facts.drains), (RESUMES, facts.resumes), (REFUSALS, facts.refusals)):
                for label in events:
                    self._add(family, (label,))
            for family in FAMILIES:
                if family.per_run:
                    self.values[family.name] = {}
            statuses = list(facts.node_status.values())
            for status in STATUS_CODES:
                self.values[NODES.name][(status,)] = float(statuses.count(status))
            for node, status in facts.node_status.items():
                self.values[NODE_STATUS.name][(node,)] = float(STATUS_CODES[status])
            self.values[BREAKER.name][()] = float(facts.breaker_tripped)
            for state, count in facts.slurm_states.items():
                self.values[SLURM_NODES.name][(state,)] = float(count)
            for node, owner in facts.drained.items():
                self.values[DRAINED.name][(node, owner)] = 1.0
            for node, rules in facts.needs_person.items():
                for rule in rules:
                    self.values[NEEDS_PERSON.name][(node, rule)] = 1.0

    def _add(self, family: Family, labels: Labels, amount: float = 1.0) -> None:
        self.values[family.name][labels] = self.values[family.name].get(labels, 0.0) + amount

    # ---- the previous textfile --------------------------------------------------------------
    def restore(self, text: str) -> None:
        """Take over the samples of a textfile this module wrote; anything else in it is ignored."""
        by_name = {f.name: f for f in FAMILIES}
        with self._lock:
            for parsed in text_string_to_metric_families(text):
                for sample in parsed.samples:
                    if sample.name.startswith(DURATION.name):
                        self._restore_duration(sample.name, sample.labels, sample.value)
                        continue
                    family = by_name.get(sample.name)
                    if family is not None and set(sample.labels) == set(family.labels):
                        self.values[family.name][tuple(sample.labels[k] for k in family.labels)] = sample.value

    def _restore_duration(self, name: str, labels: dict[str, str], value: float) -> None:
        if name == f"{DURATION.name}_sum":
            self.duration_sum = value
        elif name == f"{DURATION.name}_bucket" and "le" in labels:
            bound = float(labels["le"])
            if bound in DURATION_BUCKETS:
                self.buckets[DURATION_BUCKETS.index(bound)] = value

    # ---- exposition -------------------------------------------------------------------------
    def collect(self) -> Iterable[Metric]:
        with self._lock:
            values = {name: dict(samples) for name, samples in self.values.items()}
            buckets, total = list(self.buckets), self.duration_sum
        for family in FAMILIES:
            if family.kind == "histogram":
                yield HistogramMetricFamily(family.name, family.help, sum_value=total, buckets=[
                    ("+Inf" if math.isinf(b) else str(b), count) for b, count in zip(DURATION_BUCKETS, buckets,
                                                                                      strict=True)])
                continue
            maker = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
            metric = maker(family.name, family.help, labels=family.labels)
            for labels, value in sorted(values[family.name].items()):
                metric.add_metric(list(labels), value)
            yield metric
