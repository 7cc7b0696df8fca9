"""One `opsctl health` run, as a straight line: read, judge, evidence, plan, act, report.

Order matters for safety: the lock is taken first, Slurm and Prometheus are read completely (side by
side: at thousands of nodes each takes seconds, and neither needs the other), and only then is anything
changed. Any failure to read, and any answer that Prometheus marks as partial, stops
the run before a single node is touched. The changes go through the one actor (actor/act.py),
which compares and sets against Slurm, writes the intent (handled events, budgets) before scontrol and
audits after it.
"""

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TypeVar

from opsctl.actor.act import DRAIN, ESCALATE, RESUME, Actor, Change
from opsctl.actor.ledger import Ledger
from opsctl.actor.memory import HandledMemory, records_for
from opsctl.actor.result import ActionResult
from opsctl.config.schema import Config, duration_seconds
from opsctl.errors import ConfigError, ExitCode, OpsctlError, redact, worst
from opsctl.health.catalog import Rule, load_catalog
from opsctl.health.evaluate import Report, gather, verdicts
from opsctl.health.evidence import Evidence, read_evidence
from opsctl.health.plan import Decision, Plan, plan_drains, plan_resumes, resume_candidates, unknown_stop, without
from opsctl.prom.client import PromQuery
from opsctl.slurm import Slurm, SlurmNode
from opsctl.slurm.partitions import select_partitions

T = TypeVar("T")


@dataclass(frozen=True)
class RunOptions:
    drain: bool = False
    resume: bool = False
    dry_run: bool = False
    scope: str | None = None  # a Slurm hostlist: act on (and show) these nodes only

    @property
    def planning(self) -> bool:
        """--dry-run alone means "show the drain plan"."""
        return self.drain or self.resume or self.dry_run

    @property
    def drains(self) -> bool:
        return self.drain or (self.dry_run and not self.resume)

    @property
    def acting(self) -> bool:
        return (self.drain or self.resume) and not self.dry_run


@dataclass
class RunResult:
    report: Report
    exit_code: ExitCode
    plan: Plan = field(default_factory=Plan)
    seconds: float = 0.0
    options: RunOptions = field(default_factory=RunOptions)
    done: list[str] = field(default_factory=list)
    started: float = 0.0  # the run's clock (Unix time): what the JSON `time` and --watch lines show
    cluster: dict[str, SlurmNode] = field(default_factory=dict)  # the judged nodes as Slurm showed them
    after: dict[str, SlurmNode] = field(default_factory=dict)  # ... and as the run left them
    action: ActionResult = field(default_factory=ActionResult)  # what the actor did, would do, refused, skipped


class RunAborted(OpsctlError):
    """A run stopped by an error after it had changed some nodes: `done` lists exactly which."""

    def __init__(self, cause: Exception, done: list[str]):
        message = str(cause) if isinstance(cause, OpsctlError) else f"unexpected error: {type(cause).__name__}: {cause}"
        super().__init__(message, cause.exit_code if isinstance(cause, OpsctlError) else ExitCode.SOURCE_DOWN)
        self.done = done


def run_health(config: Config, options: RunOptions, prom: PromQuery, slurm: Slurm, now: float | None = None,
               done: list[str] | None = None) -> RunResult:
    """`done` collects a line per change made, so that the caller can show them if the run fails."""
    started = time.monotonic()
    done = [] if done is None else done
    now = time.time() if now is None else now
    ledger = Ledger(config)
    try:
        with Actor(config, slurm, now, done=done, lock=options.acting) as actor:
            return Run(config, options, load_catalog(config), prom, actor, now, started).execute()
    except Exception as err:
        if options.planning:
            with contextlib.suppress(OpsctlError):  # the audit log itself may be what failed
                detail = str(err) if isinstance(err, OpsctlError) else f"unexpected error: {type(err).__name__}: {err}"
                ledger.audit("refuse" if not done else "error",
                             detail=redact(detail + (f"; done before it: {'; '.join(done)}" if done else "")),
                             dry_run=options.dry_run)
        if done and not isinstance(err, RunAborted):
            raise RunAborted(err, list(done)) from err
        raise


def in_background(call: Callable[[], T]) -> Callable[[], T]:
    """call() on a thread of its own; the function returned waits for it, then returns its result or raises
    its error. A daemon thread: a run that fails meanwhile does not wait on it to exit."""
    outcome: Future[T] = Future()

    def work() -> None:
        try:
            outcome.set_result(call())
        except BaseException as err:  # handed to the waiter, raised there
            outcome.set_exception(err)

    threading.Thread(target=work, name=getattr(call, "__qualname__", "call"), daemon=True).start()
    return outcome.result


class Run:
    def __init__(self, config: Config, options: RunOptions, rules: list[Rule], prom: PromQuery, actor: Actor,
                 now: float, started: float):
        self.config, self.options, self.rules, self.prom = config, options, rules, prom
        self.actor, self.now, self.started = actor, now, started  # started: time.monotonic() at the run's start
        self.state = actor.state  # read here; written through actor.ledger

    def execute(self) -> RunResult:
        slurm_nodes = in_background(self.actor.nodes)
        try:
            gathered = gather(self.prom, self.rules, self.config)
        except Exception:
            # When both go wrong, Slurm's failure (or a --nodes outside it) is the one told, as it was when
            # Slurm was read before Prometheus.
            self._cluster(slurm_nodes())
            raise
        every = slurm_nodes()
        cluster, scope = self._cluster(every)
        memory = self.state.handled.load()
        memory.prune(self.now)
        # Intents whose drain is in Slurm now: the change was made, a crash came before settling it.
        memory.settle(n for n, node in cluster.items() if node.owned)
        self.actor.memory = memory if self.options.acting else None
        report = verdicts(gathered, self.rules, self.config, cluster.keys(), memory, self.now,
                          set(every) - set(cluster))
        plan, after, code = Plan(), cluster, ExitCode.OK
        if report.warnings:
            # Thanos, Mimir or VictoriaMetrics said an answer may be partial: act on nothing.
            if self.options.planning:
                self.actor.refuse("", "partial answer: " + "; ".join(report.warnings[:3]), dry_run=self.options.dry_run)
            code = ExitCode.SOURCE_DOWN
        else:
            evidence = self._evidence(report, cluster, memory, scope)
            plan = self._plan(report, cluster, evidence, scope)
            after = self._act(plan, memory, cluster)
            plan.stop = plan.stop or unknown_stop(report, cluster, self.config.safety)  # read-only runs too
            if plan.stop:
                code = ExitCode.SAFETY_STOP
        if scope is not None:
            report.nodes = {n: v for n, v in report.nodes.items() if n in scope}
        if any(v.status == "fail" for v in report.nodes.values()):
            code = worst(code, ExitCode.FAILING)
        for decision in plan.decisions.values():  # what was left alone without a refusal
            if decision.action.startswith("skip:") and decision.node not in self.actor.result.refused:
                self.actor.skip(decision.node, decision.action.removeprefix("skip:"))
        return RunResult(report=report, exit_code=code, plan=plan, options=self.options, done=self.actor.done,
                         action=self.actor.result,
                         started=self.now, seconds=time.monotonic() - self.started,
                         cluster=_within(cluster, scope), after=_within(after, scope))

    def _cluster(self, every: dict[str, SlurmNode]) -> tuple[dict[str, SlurmNode], set[str] | None]:
        """The nodes of the judged partitions, and those of them that --nodes names (None: all)."""
        cluster = select_partitions(every, self.config.slurm.partitions)
        return cluster, self._scope(cluster)

    def _scope(self, cluster: dict[str, SlurmNode]) -> set[str] | None:
        if not self.options.scope:
            return None
        names = set(self.actor.slurm.expand(self.options.scope))
        outside = sorted(names - set(cluster))
        if outside:
            raise ConfigError(f"--nodes: not Slurm nodes of the judged partitions (slurm.partitions): "
                              f"{', '.join(outside[:5])}")
        return names

    def _evidence(self, report: Report, cluster: dict[str, SlurmNode], memory: HandledMemory,
                  scope: set[str] | None) -> dict[tuple[str, str], Evidence]:
        """Positive evidence for resume candidates, and for level records that may read ok again."""
        wanted = resume_candidates(report, cluster, self.rules, scope) if self.options.resume else {}
        if self.options.acting:
            for rule_id, nodes in memory.level_rules().items():
                wanted.setdefault(rule_id, set()).update(n for n in nodes if n in report.nodes)
        evidence = read_evidence(self.prom, self.rules, wanted, report, {n: s.reason for n, s in cluster.items()})
        by_id = {rule.id: rule for rule in self.rules}
        ok_again = [(node, rule_id, device) for (node, rule_id), found in evidence.items()
                    for device, value in found.values if rule_id in by_id and found.status != "unknown"
                    and not by_id[rule_id].breaches(value)]
        memory.forget(ok_again)
        return evidence

    def _plan(self, report: Report, cluster: dict[str, SlurmNode], evidence: dict[tuple[str, str], Evidence],
              scope: set[str] | None) -> Plan:
        options, safety = self.options, self.config.safety
        plan = Plan()
        if options.drains:
            plan = plan_drains(report, cluster, self.rules, safety, len(self.state.budgets.recent("drains", self.now)),
                               options.dry_run, scope, self._resumed_after(report))
        if options.resume:
            # Too many nodes without data stops resumes too: the same monitoring failure that would hide a
            # fault from --drain would hide it from the resume evidence.
            stop = unknown_stop(report, cluster, safety)
            plan.stop, plan.breaker = plan.stop or stop, plan.breaker or bool(stop)
            plan = plan_resumes(report, cluster, self.rules, evidence, self.state.healthy_since.load(),
                                duration_seconds(safety.resume_after), safety,
                                len(self.state.budgets.recent("resumes", self.now)), options.dry_run, self.now, scope,
                                plan)
        for decision in plan.refusals():
            self.actor.refuse(decision.node, decision.detail, [c.id for c in decision.checks], decision.seen,
                              dry_run=options.dry_run)
        return plan

    def _resumed_after(self, report: Report) -> dict[str, float]:
        """The nodes opsctl resumed after the data this run read was scraped (a scrape interval before the
        data's time): a GPU reset the resume followed may not show in it yet."""
        if report.data_time is None:
            return {}
        scraped = report.data_time - duration_seconds(self.config.prometheus.scrape_interval)
        return {n: t for n, t in self.state.resumes.load().items() if t > scraped}

    def _act(self, plan: Plan, memory: HandledMemory, cluster: dict[str, SlurmNode]) -> dict[str, SlurmNode]:
        """Carry the plan out through the actor; the judged nodes as Slurm shows them after."""
        if not self.options.acting:
            for decision in plan.with_action("would-drain", "would-resume", "would-escalate"):
                self.actor.would(self._change(decision, decision.action.removeprefix("would-")))
            return cluster
        self.actor.ledger.save_handled(memory)
        changes = [self._change(d, DRAIN) for d in plan.with_action("drain")]
        changes += [self._change(d, ESCALATE) for d in plan.with_action("escalate")]
        if self.options.resume:
            resumes = plan.with_action("resume")
            self.actor.ledger.save_healthy_since({n: t for n, t in plan.healthy_since.items()
                                           if n not in {d.node for d in resumes}})
            changes += [self._change(d, RESUME) for d in resumes]
        if not changes:
            return cluster
        acted = self.actor.apply(changes)
        for change, why in acted.dropped:
            without(plan, change.node, why)
        return {n: acted.nodes.get(n, node) for n, node in cluster.items()}

    def _change(self, decision: Decision, event: str) -> Change:
        seen = decision.seen
        assert seen is not None, f"a {event} decision without the Slurm node it rests on"
        checks = tuple(c.id for c in decision.checks) or tuple(seen.reason_rules())
        return Change(node=decision.node, event=event, seen=seen, reason=decision.reason, checks=checks,
                      evidence=decision.reason.split(" ", 1)[1] if " " in decision.reason else "",
                      values=decision.values, handled=tuple(records_for(decision.node, decision.checks, self.now)),
                      healthy_s=decision.healthy_s if event == RESUME else None, detail=decision.detail)


def _within(nodes: dict[str, SlurmNode], scope: set[str] | None) -> dict[str, SlurmNode]:
    return nodes if scope is None else {n: node for n, node in nodes.items() if n in scope}
