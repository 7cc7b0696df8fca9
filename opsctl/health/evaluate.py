"""Turn PromQL answers into one verdict per node: ok, warn, fail or unknown, with evidence.

`gather` issues a fixed number of queries however many nodes there are: three (presence, scrape age,
identity), one for the rule results that Prometheus recorded (opsctl.health.precomputed), one per rule
whose recorded results are missing or stale, presence again, plus one listing the jobs only when a
configured job has no target. None needs Slurm: a run reads Slurm's nodes meanwhile.
`judge` is the pure decision over their answers; `evaluate` does both.

Each rule's answer holds, beside its held breaches, the series whose condition holds now but whose hold
has not yet elapsed, marked `opsctl_pending="1"` (Rule.judged_expr; the recorded results carry them too).
They become a verdict's `pending` checks, which no status, report or action reads: only the circuit
breaker counts them (opsctl/health/plan.py), so a fault that reaches many nodes a scrape apart stops
the run before the first node's hold completes.

Errors: a configured job that the source does not know is a config error (exit 2); a source with no
`up` series at all, or whose answers may be partial, is a source error (exit 3; --watch goes on).
"""

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from opsctl.config.schema import Config, duration_seconds
from opsctl.errors import ConfigError, SourceUnavailable
from opsctl.health import precomputed
from opsctl.health.catalog import PENDING_LABEL, Rule
from opsctl.health.identity import XID_GAUGE, XID_WINDOW, Identities, Target, TargetInfo, identity_query
from opsctl.prom.client import PromQuery, Sample

# dcgm-exporter's default XID count window (--xid-count-window-size), used when the label is absent.
DEFAULT_XID_WINDOW_S = 300.0
STATUS_ORDER = {"ok": 0, "warn": 1, "fail": 2, "unknown": 3}
# The device labels a check names its device by (its JSON key); any other (a node check's `finding`) is "hca".
KINDS = ("gpu", "mount", "target", "nid", "firmware", "nvlink", "pcie", "nvswitch")


@dataclass
class Check:
    id: str
    severity: str
    # fail | warn | handled (an event opsctl already acted on) | unknown (no usable data) | pending (its
    # condition holds now, its hold has not yet elapsed: in NodeVerdict.pending only)
    status: str
    device: str = ""  # "gpu3", "mlx5_0", or "" for a node-wide check
    kind: str = ""  # "gpu", "hca", "mount" (a storage mount point), "target" (a Lustre OST or MDT), "nid" (LNet),
    # "firmware" (a GPU's component and versions: gpu3 vbios 96.00.89.00.01 (most run 96.00.A5.00.03)), "nvlink"
    # (a GPU's link: gpu1 link3), "pcie" (a GPU or HCA on the PCIe bus: gpu3, mlx5_2), "nvswitch" (an NVSwitch
    # and its SXid: 00000000:C7:00.0 sxid 20034) or ""
    value: float | None = None
    threshold: float | None = None
    op: str = ""
    evidence: str = ""
    action: str = "report"
    xid: int | None = None
    memory: str = "none"  # window | level | none: how long the event counts as handled once acted on
    window_s: float = DEFAULT_XID_WINDOW_S


@dataclass
class NodeVerdict:
    node: str
    status: str = "ok"
    checks: list[Check] = field(default_factory=list)
    in_slurm: bool = True
    # What a draining rule sees now whose hold has not yet elapsed, on a device where it does not already
    # hold: counted by the circuit breaker only, never part of the status.
    pending: list[Check] = field(default_factory=list)

    def drain_checks(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail" and c.action == "drain"]

    def breaching(self, rule_id: str) -> bool:
        return any(c.id == rule_id and c.status in ("fail", "warn", "handled", "unknown") for c in self.checks)


@dataclass
class Report:
    nodes: dict[str, NodeVerdict]
    rules: list[Rule]
    queries: int = 0
    query_seconds: float = 0.0
    time: float = 0.0
    query_time: float | None = None  # the moment (Unix seconds, the source's clock) whose data every rule read
    # when the oldest rule answer was computed: query_time, less the age of the oldest recorded results used
    data_time: float | None = None
    warnings: list[str] = field(default_factory=list)  # the source said its answers may be partial
    identities: Identities | None = None
    rule_results: str = "direct"  # precomputed, mixed or direct: where the rules' answers came from
    rule_results_note: str = ""  # why some rules were queried directly although recorded results were wanted


class Memory(Protocol):
    """What opsctl already acted on (kept by remediation): a check it covers is `handled`."""

    def covers(self, node: str, check: Check, now: float) -> bool: ...


def presence_queries(config: Config) -> tuple[str, str]:
    jobs = f'job=~"{"|".join(config.prometheus.jobs.values())}"'
    return f"up{{{jobs}}}", f"time() - timestamp(up{{{jobs}}})"


@dataclass
class Gathered:
    """Every answer a run judges from (gather): none of them needs Slurm, so Slurm's nodes can be read while
    Prometheus computes them."""

    up: list[Sample]
    ages: list[Sample]
    reported: list[Sample]
    answers: dict[str, list[Sample]]
    found: precomputed.Precomputed
    moment: float | None
    queries: int
    started: float  # time.monotonic() before the first query
    warnings: list[str]  # the source said these answers may be partial


def evaluate(client: PromQuery, rules: list[Rule], config: Config, slurm_nodes: Iterable[str],
             memory: Memory | None = None, now: float | None = None, ignore: Iterable[str] = ()) -> Report:
    """Run every query, then judge. Any failed query raises SourceUnavailable before a verdict exists.
    Nodes in `ignore` (Slurm nodes outside the judged partitions) get no verdict at all."""
    return verdicts(gather(client, rules, config), rules, config, slurm_nodes, memory, now, ignore)


def gather(client: PromQuery, rules: list[Rule], config: Config) -> Gathered:
    """Every query of a run; any failed one raises SourceUnavailable.

    The rules read the data as it stood when the first `up` answer was computed (`Report.query_time`),
    however long the run takes. A scrape that began before that moment can still land during the run: a
    failed one (a hung node's timeout) marks its series stale, so a rule read after it would find nothing
    and call the node ok. `up` is read again, at the same moment, after the rules, and a target counts as
    up only where both reads say so (the second read reaches back as far as the recorded results used)."""
    started = time.monotonic()
    up_q, age_q = presence_queries(config)
    recorded = config.prometheus.recording_rules == "auto"
    first = [up_q, age_q, identity_query(config)] + ([precomputed.QUERY] if recorded else [])
    results = client.query_many(first)
    up, ages, reported = results[0], results[1], results[2]
    for sample in up:
        if not sample.labels.get("job") or not sample.labels.get("instance"):
            raise SourceUnavailable(f"presence query: an `up` series without job and instance labels: "
                                    f"{sample.labels!r}")
    _check_jobs(client, config, up)
    moment = up[0].at or None  # a source that gives no time (a test's fake) is read at its present
    found = precomputed.read(results[3], rules, config) if recorded else precomputed.everything_direct(rules)
    # A rule without fresh recorded results runs as the exported alert's expression (with the pending
    # series beside it, in the same query): Prometheus filters by the threshold, so answers carry only
    # breaching (or non-finite) series, small at any cluster size.
    direct = client.query_many([rule.judged_expr() for rule in found.direct], at=moment)
    up = up_in_both(up, client.query(up_since(up_q, found, config), at=moment))
    answers = {**found.answers, **{rule.id: samples for rule, samples in zip(found.direct, direct, strict=True)}}
    return Gathered(up, ages, reported, answers, found, moment, len(first) + len(found.direct) + 1, started,
                    list(client.warnings))


def verdicts(gathered: Gathered, rules: list[Rule], config: Config, slurm_nodes: Iterable[str],
             memory: Memory | None = None, now: float | None = None, ignore: Iterable[str] = ()) -> Report:
    """judge() over what gather() read, with where the answers came from and what they cost."""
    found, moment = gathered.found, gathered.moment
    report = judge(rules, gathered.answers, Identities(gathered.up, gathered.reported, config), gathered.ages,
                   set(slurm_nodes), config, memory, time.time() if now is None else now, set(ignore))
    report.queries = gathered.queries
    report.query_time = moment
    report.data_time = None if moment is None else moment - (found.oldest if found.answers else 0.0)
    report.rule_results, report.rule_results_note = found.path, found.note()
    report.query_seconds = time.monotonic() - gathered.started
    report.warnings = gathered.warnings
    return report


def up_since(up_q: str, found: precomputed.Precomputed, config: Config) -> str:
    """`up` for its second read. Recorded results are as old as the evaluation that wrote them, and a
    target whose scrape had failed then is missing from them: it counts as down until every recorded
    result used is younger than that scrape (a scrape interval more, for the scrape the evaluation saw)."""
    if not found.answers:
        return up_q
    window = math.ceil(found.oldest + float(duration_seconds(config.prometheus.scrape_interval)))
    return f"min_over_time({up_q}[{window}s])"


def up_in_both(before: list[Sample], after: list[Sample]) -> list[Sample]:
    """The first read's `up` series, each down unless the second read says up too (a target gone from
    the second read is down)."""
    later = {(s.labels.get("job"), s.labels.get("instance")): s.value for s in after}
    return [Sample(s.labels, min(s.value, later.get((s.labels.get("job"), s.labels.get("instance")), 0.0)), s.at)
            for s in before]


def _check_jobs(client: PromQuery, config: Config, up: list[Sample]) -> None:
    """A configured job without any target is a config error, not a cluster of unknown nodes; but a
    source without any `up` series at all (a Prometheus restarted without its data, a Thanos with a
    store down), or one that says its answers may be partial, is a data source problem (exit 3)."""
    present = {s.labels.get("job", "") for s in up}
    missing = [(source, job) for source, job in config.prometheus.jobs.items() if job not in present]
    if not missing:
        return
    jobs = sorted({s.labels.get("job", "") for s in client.query("count by (job) (up)")} - {""})
    url = getattr(client, "shown_url", None)  # PromClientImpl's, credentials redacted
    where = f"Prometheus at {url}" if isinstance(url, str) else "Prometheus"
    if not jobs:
        raise SourceUnavailable(f"{where} has no `up` series at all (restarted without its data, or a store is "
                                "down): no target can be judged")
    if client.warnings:
        raise SourceUnavailable(f"{where} has no target of job {missing[0][1]!r} and says its answers may be "
                                f"partial: {client.warnings[0]}")
    source, job = missing[0]
    hint = " (or null if the site runs no node_exporter)" if source == "node" else ""
    raise ConfigError(f"config key prometheus.jobs.{source}: Prometheus has no target of job {job!r}{hint}; "
                      f"its jobs are: {', '.join(jobs) or 'none'}")


def _sources(identities: Identities, ages: list[Sample], config: Config) -> dict[str, dict[str, Check]]:
    """node -> source -> a check that says why that source's data cannot be used (absent when it can)."""
    stale_after = duration_seconds(config.prometheus.stale_after)
    age_of = {(s.labels.get("job", ""), s.labels.get("instance", "")): s.value for s in ages}
    problems: dict[str, dict[str, Check]] = {}
    # A target whose names disagree makes every node it may be unknown: the one it is filed under and
    # the one it says it is (two targets with swapped labels: neither node can be judged). A node's
    # evidence is about its own target first.
    conflicted = [info for info in identities.targets.values() if info.conflict]
    for info in conflicted:
        problems.setdefault(info.name, {}).setdefault(info.source, _conflict_check(info.conflict))
    for info in conflicted:
        for node in sorted(info.conflict_names - {info.name}):
            problems.setdefault(node, {}).setdefault(info.source, _conflict_check(info.conflict))
    for node, by_source in identities.by_node().items():
        for source, targets in by_source.items():
            if source in problems.get(node, {}):
                continue
            if len(targets) > 1:
                names = ", ".join(sorted(t.instance for t, _ in targets))
                problems.setdefault(node, {})[source] = _conflict_check(f"{source} targets {names} all name {node}")
                continue
            target, _ = targets[0]
            state = "up" if identities.up.get(target) == 1 else "down"
            age = age_of.get((target.job, target.instance))
            if state == "up" and (age is None or not math.isfinite(age) or age > stale_after):
                state = "stale"
            if state != "up":
                problems.setdefault(node, {})[source] = _data_check(source, state)
    return problems


def _conflict_check(why: str) -> Check:
    return Check(id="identity-conflict", severity="fail", status="unknown", evidence=why)


def _data_check(source: str, state: str) -> Check:
    return Check(id=f"data-{source}", severity="fail", status="unknown", evidence=f"{source} exporter {state}")


def check_for(rule: Rule, sample: Sample) -> Check:
    device, kind = "", ""
    if rule.device_label:
        raw = sample.labels.get(rule.device_label)
        if raw is None:
            raise SourceUnavailable(f"rule {rule.id}: series without the {rule.device_label!r} label: "
                                    f"{sample.labels!r}")
        kind = rule.device_label if rule.device_label in KINDS else "hca"
        device = f"gpu{raw}" if kind == "gpu" else raw
    memory, window_s = rule.memory, float(duration_seconds(rule.hold))
    # A windowed count of events (XIDs, SXids): an event acted on counts as handled for the count's window.
    window = sample.labels.get("window_size_in_ms", "")
    if window.isdigit():
        window_s = int(window) / 1000.0
    evidence = rule.format_evidence(device, sample.value) if math.isfinite(sample.value) else \
        f"{device} value={sample.value}".strip()
    xid = rule.xid
    if rule.xid is not None or rule.xid_series:
        if rule.xid_series:
            xid = _series_xid(sample, windowed=window.isdigit())
            if xid is not None and window.isdigit():
                evidence = f"{device} xid={xid} {rule.format_evidence('', sample.value)}".strip()
        if window.isdigit():
            if sample.labels.get("xid_source") == "kernel":  # opsctl node check's count, not DCGM's
                evidence = f"{evidence} (kernel log)"
        else:
            # The last-XID gauge: it never shows a repeat, so an XID acted on stays handled until it changes.
            memory = "level" if memory != "none" else memory
            if xid is not None and (sample.labels.get("xid_source") == "gauge" or rule.xid_series):
                evidence = f"{device} xid={xid} (last-XID gauge; no windowed count)".strip()
    status = rule.severity if math.isfinite(sample.value) else "unknown"
    return Check(id=rule.id, severity=rule.severity, status=status, device=device, kind=kind, value=sample.value,
                 threshold=rule.threshold, op=rule.op, evidence=evidence, action=rule.action, xid=xid,
                 memory=memory, window_s=window_s)


def _series_xid(sample: Sample, windowed: bool) -> int | None:
    """An XID family's code: the windowed count's `xid` label, or the last-XID gauge's value."""
    if windowed:
        raw = sample.labels.get("xid", "")
        return int(raw) if raw.isdigit() else None
    return int(sample.value) if math.isfinite(sample.value) and sample.value == int(sample.value) else None


def judge(rules: list[Rule], answers: dict[str, list[Sample]], identities: Identities, ages: list[Sample],
          slurm_nodes: set[str], config: Config, memory: Memory | None = None, now: float = 0.0,
          ignore: set[str] | None = None) -> Report:
    ignore = ignore or set()
    problems = _sources(identities, ages, config)
    nodes: dict[str, NodeVerdict] = {name: NodeVerdict(name) for name in slurm_nodes}
    for name in identities.by_node():
        if name not in ignore:
            nodes.setdefault(name, NodeVerdict(name, in_slurm=False))
    for rule in rules:
        for sample in answers.get(rule.id, []):
            name = identities.node_of(sample.labels)
            if not name:
                raise SourceUnavailable(f"rule {rule.id}: a series names no target (keep job and instance, the "
                                        f"${{by}} labels, in its by() clause): {sample.labels!r}")
            if name in ignore or (math.isfinite(sample.value) and not rule.breaches(sample.value)):
                continue
            _place(nodes.setdefault(name, NodeVerdict(name, in_slurm=False)), rule, sample, memory, now)
    xid_rules = any(rule.xid is not None for rule in rules) and config.catalog.xid_source == "auto"
    by_node = identities.by_node()
    for name, verdict in nodes.items():
        found = problems.get(name, {})
        for source in config.prometheus.jobs:
            known = source in by_node.get(name, {})
            if source in found:
                verdict.checks.append(found[source])
            elif not known:
                verdict.checks.append(_data_check(source, "missing"))
        if xid_rules and "dcgm" not in found:
            verdict.checks += _xid_data(by_node, name)
        held = {(c.id, c.device) for c in verdict.checks}
        verdict.pending = sorted((c for c in verdict.pending if (c.id, c.device) not in held),
                                 key=lambda c: (c.id, c.device))
        statuses = [c.status for c in verdict.checks if c.status != "handled"]
        verdict.status = max(statuses or ["ok"], key=STATUS_ORDER.__getitem__)
        verdict.checks.sort(key=lambda c: (-STATUS_ORDER.get(c.status, 0), c.id, c.device))
    return Report(nodes=dict(sorted(nodes.items())), rules=rules, time=now, identities=identities)


def _place(verdict: NodeVerdict, rule: Rule, sample: Sample, memory: Memory | None, now: float) -> None:
    """One breaching series of a rule onto its node's verdict: a check (handled when opsctl already acted
    on that event), or one marked pending: a pending check of a draining rule, unless opsctl already
    acted on that event (it is the same event, not one coming)."""
    pending = sample.labels.get(PENDING_LABEL) == "1"
    if pending:
        sample = Sample({k: v for k, v in sample.labels.items() if k != PENDING_LABEL}, sample.value, sample.at)
    check = check_for(rule, sample)
    covered = memory is not None and check.memory != "none" and check.status != "unknown" \
        and memory.covers(verdict.node, check, now)
    if not pending:
        check.status = "handled" if covered else check.status
        verdict.checks.append(check)
    elif rule.action == "drain" and check.status != "unknown" and not covered:
        check.status = "pending"
        verdict.pending.append(check)


def _xid_data(by_node: dict[str, dict[str, list[tuple[Target, TargetInfo]]]], node: str) -> list[Check]:
    """A dcgm target that exports neither XID metric is reported: its XIDs would go unseen."""
    for _, info in by_node.get(node, {}).get("dcgm", []):
        if not info.metrics & {XID_GAUGE, XID_WINDOW}:
            return [Check(id="xid-data", severity="warn", status="warn",
                          evidence=f"dcgm exporter exports neither {XID_WINDOW} nor {XID_GAUGE}: XIDs go unseen")]
    return []
