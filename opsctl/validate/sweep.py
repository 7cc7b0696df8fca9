"""`opsctl validate --idle`: one sweep of active validation over the idle GPU nodes (docs/validate.md).

1. Choose: GPU nodes of the judged partitions (slurm.partitions; within --nodes when given) that are IDLE
   with no flag and no reason, whose last validation is older than `validate.interval`, the longest
   unvalidated first, at most `validate.max_nodes_per_sweep`. A node in the validation queue (`opsctl
   suspects --queue`) goes first, however recently it was validated, and leaves the queue once validated.
   A node that runs a job waits for a sweep that finds it idle.
2. Submit one exclusive job per node to `validate.partition`, which the slurm_common role makes low
   priority, hidden and root only: users' pending jobs go first. It runs `validate.job_command`,
   `opsctl node validate --textfile ...`, which writes the results for node_exporter.
3. Wait for the jobs to end, at most `validate.job_timeout`. A job that has not started by then (a user's
   job took the node first) or has not ended is cancelled, and its node waits for the next sweep.
4. Wait until Prometheus has each validated node's new results, and the catalog rule `validate` has judged
   the failed ones, then run `opsctl health --drain` over those nodes: a failed node is drained by the
   same path as every drain (ownership, budgets, the breaker, the audit log).
"""

import time
from dataclasses import dataclass, field

from opsctl.actor.ledger import Ledger
from opsctl.config.schema import Config, duration_seconds
from opsctl.errors import ConfigError
from opsctl.health.catalog import load_catalog
from opsctl.health.evaluate import Report, evaluate
from opsctl.prom.client import PromQuery
from opsctl.slurm import Slurm, SlurmNode
from opsctl.slurm.base import ENDED_JOB_STATES, JobSpec, SlurmJobs
from opsctl.slurm.partitions import select_partitions
from opsctl.validate.node import DIAG, NCCL, RESULT_TIMES, TIMESTAMP

JOB_NAME = "opsctl-validate"
RULE = "validate"
TESTS = (DIAG, NCCL)
POLL_S = 2.0
# A node's clock may be behind the head's: its results count as new from this long before the submission.
CLOCK_SKEW_S = 30.0


class Clock:
    """How a sweep waits: the real monotonic clock (tests pass one that jumps)."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@dataclass
class NodeValidation:
    node: str
    job: str = ""
    result: str = ""  # pass, fail, not-checked, or skip:<why> for a node this sweep left alone
    detail: str = ""


@dataclass
class Sweep:
    nodes: dict[str, NodeValidation] = field(default_factory=dict)

    @property
    def validated(self) -> list[str]:
        return sorted(n for n, v in self.nodes.items() if v.result in ("pass", "fail", "not-checked"))


def _why_not(node: SlurmNode, last: float | None, now: float, config: Config) -> str:
    if not node.has_gpus:
        return "skip:no-gpus"
    if node.state != "idle" or node.flags or node.reason:
        return "skip:busy" if node.runs_jobs else "skip:not-idle"
    if last is not None and now - last < duration_seconds(config.validate.interval):
        return "skip:validated-recently"
    return ""


def choose(cluster: dict[str, SlurmNode], last: dict[str, float], scope: set[str] | None, now: float,
           config: Config, limit: int | None = None, queued: frozenset[str] = frozenset()) -> Sweep:
    """Which nodes this sweep validates (at most `limit`, else validate.max_nodes_per_sweep), and why it
    leaves each other node of the scope alone. The `queued` nodes go first, however recently validated."""
    sweep = Sweep()
    ready = []
    for name, node in sorted(cluster.items()):
        if scope is not None and name not in scope:
            continue
        why = _why_not(node, None if name in queued else last.get(name), now, config)
        sweep.nodes[name] = NodeValidation(name, result=why)
        if not why:
            ready.append(name)
    ready.sort(key=lambda n: (n not in queued, last.get(n, 0.0)))
    for name in ready[config.validate.max_nodes_per_sweep if limit is None else limit:]:
        sweep.nodes[name].result = "skip:sweep-full"
    return sweep


def submit(config: Config, jobs: SlurmJobs, sweep: Sweep, reservation: str = "") -> None:
    minutes = max(1, int(duration_seconds(config.validate.job_timeout) // 60))
    for name, entry in sweep.nodes.items():
        if not entry.result:
            entry.job = jobs.submit(JobSpec(JOB_NAME, name, config.validate.partition, config.validate.job_command,
                                            minutes, reservation))
            entry.result = "submitted"


def await_jobs(config: Config, jobs: SlurmJobs, sweep: Sweep, clock: Clock) -> None:
    """Until every job has ended or job_timeout has passed; what has not ended then is cancelled."""
    deadline = clock.now() + duration_seconds(config.validate.job_timeout)
    waiting = {v.job: v for v in sweep.nodes.values() if v.job}
    started: set[str] = set()
    while waiting:
        queued = jobs.queued(sorted(waiting))
        for job_id in list(waiting):
            job = queued.get(job_id)
            if job is not None and job.state not in ("PENDING", "CONFIGURING"):
                started.add(job_id)
            if job is None or job.state in ENDED_JOB_STATES:
                entry = waiting.pop(job_id)
                entry.result = "ended" if job_id in started or job is None or job.state != "CANCELLED" \
                    else "skip:cancelled"
        if not waiting or clock.now() > deadline:
            break
        clock.sleep(POLL_S)
    if waiting:
        jobs.cancel(sorted(waiting))
        for job_id, entry in waiting.items():
            never = job_id not in started
            entry.result = "skip:never-started" if never else "not-checked"
            entry.detail = f"job {job_id} cancelled after validate.job_timeout" + (
                " (the node was busy)" if never else "")


def _results(prom: PromQuery, config: Config, report: Report, needed: tuple[str, ...]) -> tuple[
        dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """node -> when each of its result files was written ("": its own run's; a test of `needed` that another run
    records: that run's, node.RESULT_TIMES); node -> "test device" -> value (0 passed, else failed). The times
    are read first, the values after them: a value read after a new time is at least as new."""
    node_job = config.prometheus.jobs.get("node")
    stamps = {"": TIMESTAMP, **{test: RESULT_TIMES[test] for test in needed if test in RESULT_TIMES}}
    times = prom.query_many([f'max by (job, instance, node) ({metric}{{job="{node_job}"}})'
                             for metric in stamps.values()])
    values = prom.query(f'max by (job, instance, node, test, device) (opsctl_node_validate{{job="{node_job}"}})')
    assert report.identities is not None
    when: dict[str, dict[str, float]] = {}
    for test, samples in zip(stamps, times, strict=True):
        for s in samples:
            when.setdefault(report.identities.node_of(s.labels), {})[test] = s.value
    found: dict[str, dict[str, float]] = {}
    for s in values:
        found.setdefault(report.identities.node_of(s.labels), {})[
            f"{s.labels.get('test', '')} {s.labels.get('device', '')}"] = s.value
    return when, found


def await_results(config: Config, prom: PromQuery, sweep: Sweep, since: float, clock: Clock,
                  needed: tuple[str, ...] = (), needed_since: float | None = None) -> None:
    """Until Prometheus has each ended node's results (its own run's newer than `since`, with every test of
    `needed`, and those that another run records with their own time newer than `needed_since`) and the rule
    has judged every failure; a node whose results never come is not checked, never passed."""
    rules = [r for r in load_catalog(config) if r.id == RULE]
    ended = [v for v in sweep.nodes.values() if v.result == "ended"]
    newer = {"": since, **{t: since if needed_since is None else needed_since for t in needed if t in RESULT_TIMES}}
    scrape = duration_seconds(config.prometheus.scrape_interval)
    # Results land within a scrape; a failure's new series is judged once it has held two holds.
    deadline = clock.now() + 8 * scrape + config.prometheus.recording_interval_seconds + 10
    while True:
        report = evaluate(prom, rules, config, [v.node for v in ended])
        when, found = _results(prom, config, report, needed)
        waiting = []
        for entry in ended:
            mine = found.get(entry.node, {})
            judged = {c.device for c in report.nodes[entry.node].checks if c.id == RULE} \
                if entry.node in report.nodes else set()
            failed = sorted(k for k, v in mine.items() if v > 0)
            # With the rule disabled (catalog.disable) nothing judges: the results alone say.
            tests = {k.split(" ", 1)[0] for k in mine}
            written = when.get(entry.node, {})
            old = any(written.get(test, 0.0) < after for test, after in newer.items())
            if old or not set(needed) <= tests or (rules and not set(failed) <= judged):
                waiting.append(entry)
                continue
            entry.result = "fail" if failed else "pass" if tests >= set(TESTS + needed) else "not-checked"
            entry.detail = ", ".join(failed) if failed else ", ".join(
                f"{t} not checked" for t in TESTS + needed if t not in tests)
        ended = waiting
        if not ended or clock.now() > deadline:
            break
        clock.sleep(POLL_S)
    awaited = f"{', '.join(needed)} results" if needed else "results"
    for entry in ended:
        entry.result, entry.detail = "not-checked", f"no new {awaited} in Prometheus (see the job's node)"


def require_node_job(config: Config) -> None:
    if not config.prometheus.jobs.get("node"):
        raise ConfigError("config key prometheus.jobs.node: opsctl validate reads the nodes' results from "
                          "node_exporter's textfile collector; name its job")


def record_validated(config: Config, sweep: Sweep) -> None:
    """The nodes this run validated, now, in the state directory's validated.json (validate.interval); they
    leave the validation queue."""
    ledger = Ledger(config)
    done = ledger.state.validations.load()
    done.update({name: time.time() for name in sweep.validated})
    ledger.save_validations(done)
    queue = ledger.state.validate_queue.load()
    if set(queue) & set(sweep.validated):
        ledger.save_validate_queue({n: v for n, v in queue.items() if n not in sweep.validated})


def run_sweep(config: Config, slurm: Slurm, jobs: SlurmJobs, prom: PromQuery, scope: list[str] | None,
              dry_run: bool, now: float | None = None, clock: "Clock | None" = None) -> Sweep:
    now = time.time() if now is None else now
    clock = clock or Clock()
    require_node_job(config)
    cluster = select_partitions(slurm.nodes(), config.slurm.partitions)
    scope_set = set(scope) if scope is not None else None
    state = Ledger(config).state
    sweep = choose(cluster, state.validations.load(), scope_set, now, config,
                   queued=frozenset(state.validate_queue.load()))
    if dry_run:
        for entry in sweep.nodes.values():
            entry.result = entry.result or "would-validate"
        return sweep
    since = time.time() - CLOCK_SKEW_S
    submit(config, jobs, sweep)
    await_jobs(config, jobs, sweep, clock)
    if any(v.result == "ended" for v in sweep.nodes.values()):
        await_results(config, prom, sweep, since, clock)
    record_validated(config, sweep)
    return sweep
