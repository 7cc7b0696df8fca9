"""Each running job's verdict from its nodes' values (opsctl.jobhealth.signals): pure, so that tests give it any
values they like.

  hung      NVLink and InfiniBand moved nothing on any node of the job over the window (a synchronous job
            whose ranks all wait), and the job has run longer than the window. The node named is the one
            whose GPUs are idle while its peers spin (each waits in a busy loop for it); when none stands
            out, the job is hung with no node named. A node idle while its peers spin is named hung even
            when some traffic still moves (the others may still be talking to each other).
  slow      a node is an outlier of its own job (opsctl.jobhealth.score): its slowest GPU's SM clock, its
            graphics engine activity or its InfiniBand traffic low, or its GPU power high (the slow node
            computes while its peers wait at low power), or it has clock event reasons that at most half
            of the job's nodes have.
  ok        neither.
  starting  the job has run less than the window: its window holds the time before it, so nothing is said.
  no data   Prometheus holds no series of any of its nodes.
  one node  a job on one node has no peer to compare it with (`opsctl why` of one; job-health skips them).
A node of which Prometheus holds no series is listed under `no_data` and never named; the others are judged
among themselves. A verdict is a reason to look, never a drain (docs/job-health.md).
"""

import statistics
from dataclasses import dataclass
from typing import Any

from opsctl.config.schema import JobHealthConfig
from opsctl.health.units import clock_events
from opsctl.jobhealth import score
from opsctl.jobhealth.signals import CLOCK_EVENTS, GPU_UTIL, GPU_UTIL_MIN, IB, NVLINK, SCORED
from opsctl.slurm.base import RunningJob
from opsctl.slurm.hostlist import hostlist_expression

HUNG, SLOW, OK, STARTING, NO_DATA, ONE_NODE = "hung", "slow", "ok", "starting", "no data", "one node"
# node -> signal name -> value
Values = dict[str, dict[str, float]]


@dataclass(frozen=True)
class Finding:
    verdict: str  # hung | slow
    node: str  # "" for a hung job none of whose nodes stands out
    signal: str  # a signal's name, or "traffic" (NVLink and InfiniBand together)
    value: float | None
    median: float | None  # the job's median (of the other nodes, for an idle node)
    score: float | None  # the robust score, for a scored signal
    words: str  # "gpu041: sm clock 1200 MHz, job median 1980 MHz"


@dataclass(frozen=True)
class JobHealth:
    job: RunningJob
    verdict: str
    findings: tuple[Finding, ...]
    no_data: tuple[str, ...]
    values: Values  # the job's nodes' values, for --json
    window: float  # job_health.window, seconds
    queries: int | None = None  # `opsctl why` of one running job: the queries its answer took

    def named(self) -> list[str]:
        """The nodes a finding names, in order, once each."""
        return list(dict.fromkeys(f.node for f in self.findings if f.node))


def judge(job: RunningJob, values: Values, now: float, config: JobHealthConfig) -> JobHealth:
    mine = {node: values[node] for node in job.nodes if values.get(node)}
    no_data = tuple(node for node in job.nodes if node not in mine)
    if len(job.nodes) < 2:
        return JobHealth(job, ONE_NODE, (), no_data, mine, config.window)
    if not mine:
        return JobHealth(job, NO_DATA, (), no_data, {}, config.window)
    if job.start is None or now - job.start < config.window:
        return JobHealth(job, STARTING, (), no_data, mine, config.window)
    findings = hung(mine, config) or slow(mine, config)
    verdict = findings[0].verdict if findings else OK
    return JobHealth(job, verdict, tuple(findings), no_data, mine, config.window)


def _of(values: Values, signal: str) -> dict[str, float]:
    return {node: own[signal] for node, own in values.items() if signal in own}


def hung(values: Values, config: JobHealthConfig) -> list[Finding]:
    window = config.window
    traffic = {node: sum(own[s] for s in (NVLINK.name, IB.name) if s in own) for node, own in values.items()
               if NVLINK.name in own or IB.name in own}
    quiet = len(traffic) == len(values) and all(rate < config.traffic_floor for rate in traffic.values())
    least = _of(values, GPU_UTIL_MIN.name)
    idle = sorted(node for node, util in least.items() if util <= config.idle_util)
    peers = [util for node, util in least.items() if node not in idle]
    # Only a minority stands out: when most GPUs are idle, the job itself is idle (or between steps).
    stands_out = bool(idle) and 2 * len(idle) < len(least) and statistics.median(peers) >= config.busy_util
    if stands_out:
        spin = statistics.median(peers)
        why = "no traffic on any node of the job" if quiet else "the job still moves some traffic"
        return [Finding(HUNG, node, GPU_UTIL_MIN.name, least[node], spin, None,
                        f"{node}: idle while its peers spin: least busy gpu util {least[node]:.0f} % (node mean "
                        f"{values[node].get(GPU_UTIL.name, least[node]):.0f} %), the others' median {spin:.0f} %; "
                        f"{why} over the last {window}") for node in idle]
    if quiet:
        most = max(traffic.values())
        return [Finding(HUNG, "", "traffic", most, None, None,
                        f"no NVLink or InfiniBand traffic on any of the job's {len(values)} nodes over the last "
                        f"{window} (at most {NVLINK.show(most)} on one), and no node stands out")]
    return []


def slow(values: Values, config: JobHealthConfig) -> list[Finding]:
    found = []
    for signal in SCORED:
        if signal.name not in config.signals:
            continue
        odd = score.outliers(_of(values, signal.name), signal.bad, config.mad_floor, config.min_score,
                             config.min_deviation)
        for node, s in odd.items():
            found.append(Finding(SLOW, node, signal.name, s.value, s.median, round(s.score, 1),
                                 f"{node}: {signal.words} {signal.show(s.value)}, job median {signal.show(s.median)} "
                                 f"({signal.bad}, score {s.score:.1f})"))
    if CLOCK_EVENTS.name in config.signals:
        found += odd_clock_events(values)
    return sorted(found, key=lambda f: (-(f.score or 0.0), f.node, f.signal))


def odd_clock_events(values: Values) -> list[Finding]:
    """Clock event reasons (but GPU_IDLE) that some of the job's nodes have and at most half of them: a bit
    that every node has is the job's own (a power cap the site set), not one node's."""
    # The query returns only GPUs with a bit set: a node that DCGM reports on and that it left out has none.
    masks = {node: int(own.get(CLOCK_EVENTS.name, 0)) for node, own in values.items() if GPU_UTIL.name in own}
    if len(masks) < 2:
        return []
    bits = 0
    for mask in masks.values():
        bits |= mask
    odd = 0
    for bit in (1 << i for i in range(bits.bit_length())):
        holders = sum(1 for mask in masks.values() if mask & bit)
        if bits & bit and 2 * holders <= len(masks):
            odd |= bit
    found = []
    for node, mask in sorted(masks.items()):
        if mask & odd:
            holders = sum(1 for m in masks.values() if m & mask & odd)
            found.append(Finding(SLOW, node, CLOCK_EVENTS.name, float(mask & odd), 0.0, None,
                                 f"{node}: clock event reasons {clock_events(mask & odd)}, on {holders} of the "
                                 f"job's {len(masks)} nodes"))
    return found


def headline(health: JobHealth) -> str:
    job = health.job
    nodes = ",".join(hostlist_expression(job.nodes)) or "no nodes"
    return f"job {job.id} ({job.name or '?'}, user {job.user or '?'}): running on {nodes} ({len(job.nodes)} nodes)"


def render(health: JobHealth) -> list[str]:
    lines = [f"{headline(health)}: {health.verdict}"]
    lines += [f"  {finding.words}" for finding in health.findings]
    if health.verdict == STARTING:
        lines.append("  it has run less than job_health.window: its nodes' window still holds the time before it")
    if health.verdict == ONE_NODE:
        lines.append("  a job on one node has no peer to compare its node with: nothing is said")
    if health.no_data:
        lines.append(f"  no data of {','.join(hostlist_expression(health.no_data))}: Prometheus holds no series "
                     "of them, nothing is said about them")
    return lines


def to_json(health: JobHealth) -> dict[str, Any]:
    job = health.job
    named = health.named()
    doc = {
        "job": {"id": job.id, "name": job.name, "user": job.user, "state": "RUNNING", "nodes": list(job.nodes),
                "start": job.start, "end": None},
        "running": True,
        "verdict": health.verdict,
        "culprit": named[0] if named else None,
        "nodes_named": named,
        "window": {"seconds": health.window},
        "verdicts": [{"verdict": f.verdict, "node": f.node or None, "signal": f.signal, "value": f.value,
                      "job_median": f.median, "score": f.score, "words": f.words} for f in health.findings],
        "no_data": list(health.no_data),
        "values": {node: dict(sorted(own.items())) for node, own in sorted(health.values.items())},
    }
    if health.queries is not None:
        doc["queries"] = health.queries
    return doc
