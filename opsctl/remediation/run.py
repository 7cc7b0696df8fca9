"""One `opsctl health` run: evaluate, then (with --drain / --resume) plan and act, auditing everything.

Order matters for safety: the lock is taken first, Slurm and Prometheus are read completely, and only
then is anything changed. Any failure to read, and any answer that Prometheus marks as partial, stops
the run before a single node is touched. Right before each `scontrol` change Slurm is read again, and
a node whose state or reason changed since the plan is left alone. Handled events are written before
the change, as an intent, and settled after it.
"""

import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from opsctl.config.schema import Config, duration_seconds
from opsctl.errors import ConfigError, ExitCode, OpsctlError, SourceUnavailable, worst
from opsctl.health.catalog import Rule, load_catalog
from opsctl.health.evaluate import Report, evaluate
from opsctl.health.evidence import Evidence, read_evidence
from opsctl.prom.client import PromQuery, redact
from opsctl.remediation.audit import AuditLog
from opsctl.remediation.memory import HandledMemory, records_for
from opsctl.remediation.plan import Decision, Plan, plan_drains, plan_resumes, resume_candidates, unknown_stop, without
from opsctl.remediation.state import RunLock, StateDir
from opsctl.slurm import Slurm, SlurmNode
from opsctl.slurm.partitions import select_partitions


@dataclass
class RunOptions:
    drain: bool = False
    resume: bool = False
    dry_run: bool = False
    scope: str | None = None  # a Slurm hostlist: act on (and show) these nodes only


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
    if options.dry_run and not (options.drain or options.resume):
        options.drain = True  # --dry-run alone means "show the drain plan"
    acting = (options.drain or options.resume) and not options.dry_run
    planning = options.drain or options.resume
    done = [] if done is None else done
    now = time.time() if now is None else now
    audit = AuditLog(config.audit_log)
    rules = load_catalog(config)
    lock = RunLock(config.state_dir) if acting else contextlib.nullcontext()
    try:
        with lock:
            result = Run(config, options, rules, prom, slurm, audit, StateDir(config.state_dir), done,
                         now).execute()
    except Exception as err:
        if planning:
            with contextlib.suppress(OpsctlError):  # the audit log itself may be what failed
                detail = str(err) if isinstance(err, OpsctlError) else f"unexpected error: {type(err).__name__}: {err}"
                audit.write("refuse" if not done else "error",
                            detail=redact(detail + (f"; done before it: {'; '.join(done)}" if done else "")),
                            dry_run=options.dry_run)
        if done:
            raise RunAborted(err, done) from err
        raise
    result.seconds = time.monotonic() - started
    result.options = options
    result.done = done
    result.started = now
    return result


class Run:
    def __init__(self, config: Config, options: RunOptions, rules: list[Rule], prom: PromQuery, slurm: Slurm,
                 audit: AuditLog, state: StateDir, done: list[str], now: float):
        self.config, self.options, self.rules, self.prom, self.slurm = config, options, rules, prom, slurm
        self.audit, self.state, self.done, self.now = audit, state, done, now
        self.acting = (options.drain or options.resume) and not options.dry_run

    def execute(self) -> RunResult:
        options, now = self.options, self.now
        every = self.slurm.nodes()
        cluster = select_partitions(every, self.config.slurm.partitions)
        scope = self._scope(cluster) if options.scope else None
        memory = self.state.handled()
        memory.prune(now)
        # Intents whose drain is in Slurm now: the change was made, a crash came before settling it.
        memory.settle(n for n, node in cluster.items() if node.owned)
        report = evaluate(self.prom, self.rules, self.config, cluster.keys(), memory, now, set(every) - set(cluster))
        plan = Plan()
        code = ExitCode.OK
        if report.warnings:
            # Thanos, Mimir or VictoriaMetrics said an answer may be partial: act on nothing.
            if options.drain or options.resume:
                self.audit.write("refuse", detail="partial answer: " + "; ".join(report.warnings[:3]),
                                 dry_run=options.dry_run, now=now)
            code = ExitCode.SOURCE_DOWN
        else:
            evidence = self._evidence(report, cluster, memory, scope)
            if options.drain:
                plan = plan_drains(report, cluster, self.rules, self.config.safety,
                                   len(self.state.recent("drains", now)), options.dry_run, scope)
            if options.resume:
                plan = plan_resumes(report, cluster, self.rules, evidence, self.state.healthy_since(),
                                    duration_seconds(self.config.safety.resume_after), self.config.safety,
                                    len(self.state.recent("resumes", now)), options.dry_run, now, scope, plan)
            for decision in plan.refusals():
                seen = decision.seen
                self.audit.write("refuse", node=decision.node, checks=[c.id for c in decision.checks],
                                 detail=decision.detail, dry_run=options.dry_run, now=now,
                                 reason=seen.reason if seen else "", state=seen.state_text if seen else "")
            if self.acting:
                self.state.save_handled(memory)
            self._carry_out(plan, memory)
            plan.stop = plan.stop or unknown_stop(report, cluster, self.config.safety)  # read-only runs too
            if plan.stop:
                code = ExitCode.SAFETY_STOP
        if scope is not None:
            report.nodes = {n: v for n, v in report.nodes.items() if n in scope}
        if any(v.status == "fail" for v in report.nodes.values()):
            code = worst(code, ExitCode.FAILING)
        shown = cluster if scope is None else {n: node for n, node in cluster.items() if n in scope}
        return RunResult(report=report, exit_code=code, plan=plan, cluster=shown)

    def _scope(self, cluster: dict[str, SlurmNode]) -> set[str]:
        names = set(self.slurm.expand(self.options.scope or ""))
        outside = sorted(names - set(cluster))
        if outside:
            raise ConfigError(f"--nodes: not Slurm nodes of the judged partitions (slurm.partitions): "
                              f"{', '.join(outside[:5])}")
        return names

    def _evidence(self, report: Report, cluster: dict[str, SlurmNode], memory: HandledMemory,
                  scope: set[str] | None) -> dict[tuple[str, str], Evidence]:
        """Positive evidence for resume candidates, and for level records that may read ok again."""
        wanted = resume_candidates(report, cluster, self.rules, scope) if self.options.resume else {}
        if self.acting:
            for rule_id, nodes in memory.level_rules().items():
                wanted.setdefault(rule_id, set()).update(n for n in nodes if n in report.nodes)
        evidence = read_evidence(self.prom, self.rules, wanted, report)
        by_id = {rule.id: rule for rule in self.rules}
        ok_again = [(node, rule_id, device) for (node, rule_id), found in evidence.items()
                    for device, value in found.values if rule_id in by_id and found.status != "unknown"
                    and not by_id[rule_id].breaches(value)]
        memory.forget(ok_again)
        return evidence

    # ---- carrying the plan out -----------------------------------------------------------------
    def _unchanged(self, plan: Plan, decisions: list[Decision]) -> list[Decision]:
        """Compare and set: read Slurm again; keep the decisions whose node is as the plan saw it."""
        current = self.slurm.nodes()
        kept = []
        for decision in decisions:
            now_seen = current.get(decision.node)
            if decision.seen is not None and now_seen is not None and now_seen.same_as(decision.seen):
                kept.append(decision)
                continue
            state = now_seen.state_text if now_seen else "gone"
            why = f"changed: Slurm changed since the plan (now {state})"
            without(plan, decision.node, why)
            self.audit.write("refuse", node=decision.node, detail=why, now=self.now, state=state,
                             reason=now_seen.reason if now_seen else "")
        return kept

    def _carry_out(self, plan: Plan, memory: HandledMemory) -> None:
        if not self.acting:
            for decision in plan.with_action("would-drain", "would-resume", "would-escalate"):
                self.audit.write(decision.action, node=decision.node, checks=[c.id for c in decision.checks],
                                 reason=decision.reason or (decision.seen.reason if decision.seen else ""),
                                 values=decision.values, dry_run=True, now=self.now)
            return
        for reason, batch in plan.drains().items():
            self._change("drain", plan, batch, memory, functools.partial(self._drain, reason=reason))
        for decision in plan.with_action("escalate"):
            self._change("escalate", plan, [decision], memory, functools.partial(self._set_reason,
                                                                                 reason=decision.reason))
        if not self.options.resume:
            return
        resumes = plan.with_action("resume")
        self.state.save_healthy_since({n: t for n, t in plan.healthy_since.items()
                                       if n not in {d.node for d in resumes}})
        if resumes:
            self._change("resume", plan, resumes, memory, self.slurm.resume)

    def _drain(self, names: list[str], reason: str) -> None:
        self.slurm.drain(names, reason)

    def _set_reason(self, names: list[str], reason: str) -> None:
        self.slurm.set_reason(names, reason)

    def _change(self, event: str, plan: Plan, batch: list[Decision], memory: HandledMemory,
                apply: Callable[[list[str]], None]) -> None:
        batch = self._unchanged(plan, batch)
        if not batch:
            return
        names = [d.node for d in batch]
        for decision in batch:  # the intent first: a crash after scontrol must not lose the memory
            memory.add(records_for(decision.node, decision.checks, self.now))
        self.state.save_handled(memory)
        try:
            apply(names)
        except SourceUnavailable:
            self._settle_after_failure(event, batch, memory)
            raise
        for decision in batch:  # first what was done, so that any later error still lists it
            self._audit_done(event, decision)
        memory.settle(names)
        self.state.save_handled(memory)
        if event in ("drain", "resume"):
            self.state.record(f"{event}s", len(names), self.now)

    def _settle_after_failure(self, event: str, batch: list[Decision], memory: HandledMemory) -> None:
        """scontrol said no: keep the memory of the nodes it changed anyway, forget the rest."""
        try:
            current = self.slurm.nodes()
        except OpsctlError:
            return  # cannot tell: the intents stay, which errs on never draining again
        def made_it(decision: Decision) -> bool:
            node = current.get(decision.node)
            if node is None:
                return False
            return not node.drained if event == "resume" else node.reason == decision.reason

        made = [d.node for d in batch if made_it(d)]
        memory.settle(made)
        memory.drop_intents(d.node for d in batch if d.node not in made)
        self.state.save_handled(memory)
        for decision in batch:
            if decision.node in made:
                self._audit_done(event, decision)
            else:
                self.audit.write(f"{event}-failed", node=decision.node, checks=[c.id for c in decision.checks],
                                 reason=decision.reason, now=self.now)

    def _audit_done(self, event: str, decision: Decision) -> None:
        seen_reason = decision.seen.reason if decision.seen else ""
        evidence = decision.reason.split(" ", 1)[1] if " " in decision.reason else ""
        checks = [c.id for c in decision.checks] or (decision.seen.reason_rules() if decision.seen else [])
        self.done.append(f"{event} {decision.node}" + (f": {decision.reason}" if decision.reason else ""))
        self.audit.write(event, node=decision.node, checks=checks, evidence=evidence,
                         reason=decision.reason or seen_reason, values=decision.values, now=self.now,
                         state=decision.seen.state_text if decision.seen else "",
                         healthy_seconds=decision.healthy_s if event == "resume" else None)
