"""Turn PromQL answers into one verdict per node: ok, warn, fail or unknown, with evidence.

`evaluate` issues a fixed number of queries (one per rule plus two for presence and staleness),
however many nodes there are; `judge` is the pure decision over their answers.
"""

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from opsctl.config.schema import Config, duration_seconds
from opsctl.errors import SourceUnavailable
from opsctl.health.catalog import Rule
from opsctl.health.mapping import node_name
from opsctl.prom.client import PromQuery, Sample

# dcgm-exporter's default XID count window (--xid-count-window-size), used when the label is absent.
DEFAULT_XID_WINDOW_S = 300.0
STATUS_ORDER = {"ok": 0, "warn": 1, "fail": 2, "unknown": 3}


@dataclass
class Check:
    id: str
    severity: str
    status: str  # fail | warn | handled (an XID opsctl already acted on) | unknown (no data)
    device: str = ""  # "gpu3", "mlx5_0", or "" for a node-wide check
    kind: str = ""  # "gpu", "hca" or ""
    value: float | None = None
    threshold: float | None = None
    op: str = ""
    evidence: str = ""
    action: str = "report"
    xid: int | None = None
    window_s: float = DEFAULT_XID_WINDOW_S


@dataclass
class NodeVerdict:
    node: str
    status: str = "ok"
    checks: list[Check] = field(default_factory=list)
    in_slurm: bool = True
    action: str = "none"

    def drain_checks(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail" and c.action == "drain"]

    def breaching(self, rule_id: str) -> bool:
        return any(c.id == rule_id and c.status in ("fail", "warn", "handled") for c in self.checks)


@dataclass
class Report:
    nodes: dict[str, NodeVerdict]
    rules: list[Rule]
    queries: int = 0
    query_seconds: float = 0.0
    time: float = 0.0


@dataclass(frozen=True)
class HandledXid:
    node: str
    gpu: str
    xid: int
    time: float
    count: float


def presence_queries(config: Config) -> tuple[str, str]:
    jobs = f'job=~"{config.prometheus.dcgm_job}|{config.prometheus.node_job}"'
    return f"up{{{jobs}}}", f"time() - timestamp(up{{{jobs}}})"


def evaluate(client: PromQuery, rules: list[Rule], config: Config, slurm_nodes: Iterable[str],
             handled: Sequence[HandledXid] = (), now: float | None = None) -> Report:
    """Run every query, then judge. Any failed query raises SourceUnavailable before a verdict exists."""
    started = time.monotonic()
    up_q, age_q = presence_queries(config)
    # Rules run as the exported alert's expression: Prometheus filters by the threshold, so answers
    # carry only breaching series (small at any cluster size) and alerts and opsctl agree exactly.
    results = client.query_many([up_q, age_q] + [rule.alert_expr() for rule in rules])
    up, ages = results[0], results[1]
    answers = {rule.id: samples for rule, samples in zip(rules, results[2:], strict=True)}
    elapsed = time.monotonic() - started
    report = judge(rules, answers, up, ages, set(slurm_nodes), config, handled,
                   time.time() if now is None else now)
    report.queries = 2 + len(rules)
    report.query_seconds = elapsed
    return report


def _name(sample: Sample, config: Config, what: str) -> str:
    name = node_name(sample.labels, config.node_mapping)
    if name is None:
        raise SourceUnavailable(f"{what}: a series has no node, Hostname, hostname or instance label: "
                                f"{sample.labels!r}")
    return name


def _sources(up: list[Sample], ages: list[Sample], config: Config) -> dict[str, dict[str, str]]:
    """node -> {"dcgm": "up"|"down"|"stale"|"missing", "node": ...}."""
    by_job = {config.prometheus.dcgm_job: "dcgm", config.prometheus.node_job: "node"}
    stale_after = duration_seconds(config.prometheus.stale_after)
    state: dict[str, dict[str, str]] = {}
    for sample in up:
        source = by_job.get(sample.labels.get("job", ""))
        if source is None:
            raise SourceUnavailable(f"presence query: series without a known job label: {sample.labels!r}")
        node = state.setdefault(_name(sample, config, "presence query"), {})
        # Two targets for one node and job: one that is down makes the node's data incomplete.
        if node.get(source) != "down":
            node[source] = "up" if sample.value == 1 else "down"
    for sample in ages:
        source = by_job.get(sample.labels.get("job", ""))
        node = state.get(_name(sample, config, "staleness query"), {})
        if source in node and node[source] == "up" and sample.value > stale_after:
            node[source] = "stale"
    return state


def _suppressed(check: Check, node: str, handled: Sequence[HandledXid], now: float, xid_source: str) -> bool:
    """True when this XID was already acted on and the data cannot show a repeat of it."""
    for rec in handled:
        if (rec.node, rec.gpu, rec.xid) != (node, check.device.removeprefix("gpu"), check.xid):
            continue
        if xid_source == "gauge":
            return True  # the last-XID gauge can never show a repeat
        # The event happened no later than we acted, so within one window of that it is the same
        # event unless the windowed count went up.
        if now - rec.time <= check.window_s and (check.value or 0) <= rec.count:
            return True
    return False


def judge(rules: list[Rule], answers: dict[str, list[Sample]], up: list[Sample], ages: list[Sample],
          slurm_nodes: set[str], config: Config, handled: Sequence[HandledXid] = (), now: float = 0.0) -> Report:
    sources = _sources(up, ages, config)
    nodes: dict[str, NodeVerdict] = {name: NodeVerdict(name) for name in slurm_nodes}
    for name in sources:
        nodes.setdefault(name, NodeVerdict(name, in_slurm=False))
    for rule in rules:
        for sample in answers.get(rule.id, []):
            name = _name(sample, config, f"rule {rule.id}")
            if not rule.breaches(sample.value):
                continue
            device, kind = "", ""
            if rule.device_label:
                raw = sample.labels.get(rule.device_label)
                if raw is None:
                    raise SourceUnavailable(f"rule {rule.id}: series without the {rule.device_label!r} label: "
                                            f"{sample.labels!r}")
                kind = "gpu" if rule.device_label == "gpu" else "hca"
                device = f"gpu{raw}" if kind == "gpu" else raw
            window = sample.labels.get("window_size_in_ms", "")
            check = Check(id=rule.id, severity=rule.severity, status=rule.severity, device=device, kind=kind,
                          value=sample.value, threshold=rule.threshold, op=rule.op,
                          evidence=rule.format_evidence(device, sample.value), action=rule.action, xid=rule.xid,
                          window_s=int(window) / 1000.0 if window.isdigit() else DEFAULT_XID_WINDOW_S)
            if rule.xid is not None and _suppressed(check, name, handled, now, config.catalog.xid_source):
                check.status = "handled"
            nodes.setdefault(name, NodeVerdict(name, in_slurm=False)).checks.append(check)
    for name, verdict in nodes.items():
        state = sources.get(name, {})
        for source in ("dcgm", "node"):
            if state.get(source, "missing") != "up":
                verdict.checks.append(Check(id=f"data-{source}", severity="fail", status="unknown",
                                            evidence=f"{source} exporter {state.get(source, 'missing')}"))
        statuses = [c.status for c in verdict.checks if c.status != "handled"]
        verdict.status = max(statuses or ["ok"], key=STATUS_ORDER.__getitem__)
        verdict.checks.sort(key=lambda c: (-STATUS_ORDER.get(c.status, 0), c.id, c.device))
    return Report(nodes=dict(sorted(nodes.items())), rules=rules, time=now)
