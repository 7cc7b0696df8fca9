"""One `opsctl health` run: evaluate, then (with --drain / --resume) plan and act, auditing everything.

Order matters for safety: the lock is taken first, Slurm and Prometheus are read completely, and only
then is anything changed. Any failure to read stops the run before a single node is touched.
"""

import contextlib
import time
from dataclasses import dataclass, field

from opsctl.config.schema import Config, duration_seconds
from opsctl.errors import ConfigError, ExitCode, OpsctlError, SafetyStop, SourceUnavailable, worst
from opsctl.health.catalog import Rule, load_catalog
from opsctl.health.evaluate import Report, evaluate
from opsctl.prom.client import PromClientImpl, PromQuery
from opsctl.remediation.audit import AuditLog
from opsctl.remediation.plan import Plan, plan_drains, plan_resumes
from opsctl.remediation.state import RunLock, StateDir
from opsctl.slurm import Slurm, SlurmNode, make_slurm


@dataclass
class RunOptions:
    drain: bool = False
    resume: bool = False
    dry_run: bool = False
    prometheus_url: str | None = None
    scope: str | None = None  # a Slurm hostlist: judge and act on these nodes only


@dataclass
class RunResult:
    report: Report
    exit_code: ExitCode
    plan: Plan = field(default_factory=Plan)
    seconds: float = 0.0
    options: RunOptions = field(default_factory=RunOptions)
    slurm_nodes: dict[str, SlurmNode] = field(default_factory=dict)  # as read before acting


def _checks_of(plan: Plan, node: str) -> list[str]:
    return [c.id for c in plan.checks.get(node, [])]


def run_health(config: Config, options: RunOptions, prom: PromQuery | None = None, slurm: Slurm | None = None,
               now: float | None = None) -> RunResult:
    started = time.monotonic()
    if options.dry_run and not (options.drain or options.resume):
        options.drain = True  # --dry-run alone means "show the drain plan"
    acting = (options.drain or options.resume) and not options.dry_run
    planning = options.drain or options.resume
    audit = AuditLog(config.audit_log)
    state = StateDir(config.state_dir)
    rules = load_catalog(config)
    prom = prom or PromClientImpl.from_config(config.prometheus, options.prometheus_url)
    slurm = slurm or make_slurm(config)
    lock = RunLock(config.state_dir) if acting else contextlib.nullcontext()
    try:
        with lock:
            result = _run_locked(config, options, rules, prom, slurm, audit, state, now)
    except (SourceUnavailable, SafetyStop) as err:
        if planning:
            audit.write("refuse", detail=str(err), dry_run=options.dry_run)
        raise
    result.seconds = time.monotonic() - started
    result.options = options
    return result


def _run_locked(config: Config, options: RunOptions, rules: list[Rule], prom: PromQuery, slurm: Slurm,
                audit: AuditLog, state: StateDir, now: float | None) -> RunResult:
    slurm_nodes = slurm.nodes()
    now = time.time() if now is None else now
    report = evaluate(prom, rules, config, slurm_nodes.keys(), state.handled_xids(), now)
    scoped = slurm_nodes
    if options.scope:
        names = set(slurm.expand(options.scope))
        unknown = sorted(names - set(slurm_nodes))
        if unknown:
            raise ConfigError(f"--nodes: not Slurm nodes: {', '.join(unknown[:5])}")
        # The breaker still measures against the whole cluster; only judging and acting narrow.
        report.nodes = {n: v for n, v in report.nodes.items() if n in names}
        scoped = {n: node for n, node in slurm_nodes.items() if n in names}
    plan = Plan()
    code = ExitCode.FAILING if any(v.status == "fail" for v in report.nodes.values()) else ExitCode.OK
    if options.drain:
        plan = plan_drains(report, slurm_nodes, config.safety, len(state.drains_last_hour(now)), options.dry_run, now)
        for node, why, detail in plan.refusals:
            audit.write("refuse", node=node, checks=_checks_of(plan, node), detail=f"{why}: {detail}",
                        dry_run=options.dry_run, now=now)
        if plan.stop:
            code = worst(code, ExitCode.SAFETY_STOP)
        _drain(plan, slurm, audit, state, options.dry_run, now)
    if options.resume:
        plan = plan_resumes(report, scoped, rules, state.healthy_since(),
                            duration_seconds(config.safety.resume_after), options.dry_run, now, plan)
        _resume(plan, slurm_nodes, slurm, audit, state, options.dry_run, now)
    return RunResult(report=report, exit_code=code, plan=plan, slurm_nodes=slurm_nodes)


def _drain(plan: Plan, slurm: Slurm, audit: AuditLog, state: StateDir, dry_run: bool, now: float) -> None:
    drained = 0
    for reason, nodes in plan.drains.items():
        evidence = reason.split(" ", 1)[1] if " " in reason else ""
        if not dry_run:
            try:
                slurm.drain(nodes, reason)
            except OpsctlError as err:
                for node in nodes:
                    audit.write("drain-failed", node=node, checks=_checks_of(plan, node), evidence=evidence,
                                reason=reason, detail=str(err), now=now)
                state.record_drains(drained, now)
                raise
            drained += len(nodes)
        for node in nodes:
            audit.write("would-drain" if dry_run else "drain", node=node, checks=_checks_of(plan, node),
                        evidence=evidence, reason=reason, dry_run=dry_run, now=now)
    if not dry_run and drained:
        state.record_drains(drained, now)
        state.record_xids(plan.handled, now)


def _resume(plan: Plan, slurm_nodes: dict[str, SlurmNode], slurm: Slurm, audit: AuditLog, state: StateDir,
            dry_run: bool, now: float) -> None:
    if not dry_run:
        state.save_healthy_since({n: t for n, t in plan.healthy_since.items() if n not in plan.resumes})
        if plan.resumes:
            try:
                slurm.resume(plan.resumes)
            except OpsctlError as err:
                for node in plan.resumes:
                    audit.write("resume-failed", node=node, reason=slurm_nodes[node].reason, detail=str(err),
                                now=now)
                raise
    for node in plan.resumes:
        audit.write("would-resume" if dry_run else "resume", node=node, checks=slurm_nodes[node].reason_rules(),
                    reason=slurm_nodes[node].reason, dry_run=dry_run, now=now)
