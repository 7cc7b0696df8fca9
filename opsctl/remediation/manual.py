"""What a person does by hand: `opsctl drain`, `opsctl resume`, `opsctl nodes`, `opsctl history`.

Manual drains carry `opsctl:manual <text>`, which `opsctl health --resume` never lifts. Both commands
take the same lock as automatic runs and refuse to touch a node drained by someone else.
"""

from opsctl.config.schema import Config
from opsctl.errors import ConfigError, ExitCode, SafetyStop
from opsctl.remediation.audit import AuditLog
from opsctl.remediation.state import RunLock
from opsctl.slurm import MANUAL_PREFIX, Slurm, SlurmNode


def _targets(slurm: Slurm, hostlist: str) -> tuple[list[str], dict[str, SlurmNode]]:
    names = slurm.expand(hostlist)
    nodes = slurm.nodes()
    unknown = [n for n in names if n not in nodes]
    if unknown:
        raise ConfigError(f"unknown Slurm node(s): {', '.join(unknown)}")
    return names, nodes


def manual_drain(config: Config, slurm: Slurm, hostlist: str, text: str,
                 max_length: int | None = None) -> tuple[ExitCode, list[str]]:
    text = " ".join(text.split())
    if not text:
        raise ConfigError("--reason must not be empty")
    max_length = max_length or config.safety.reason_max_length
    reason = f"{MANUAL_PREFIX} {text}"
    if len(reason) > max_length:
        reason = reason[: max_length - 3] + "..."
    audit = AuditLog(config.audit_log)
    try:
        with RunLock(config.state_dir):
            names, nodes = _targets(slurm, hostlist)
            refused = [n for n in names if (nodes[n].out_of_service or nodes[n].reason) and not nodes[n].owned]
            for name in refused:
                audit.write("refuse", node=name, reason=nodes[name].reason, state=nodes[name].state_text,
                            evidence=text, detail=f"not-owned: {nodes[name].state_text} "
                            + ("with a reason opsctl did not set" if nodes[name].reason else "out of service"))
            todo = [n for n in names if n not in refused]
            if todo:
                slurm.drain(todo, reason)
                for name in todo:
                    audit.write("drain", node=name, checks=["manual"], evidence=text, reason=reason)
    except SafetyStop as err:
        audit.write("refuse", node=hostlist, detail=str(err))
        raise
    lines = [f"drained {n}: {reason}" for n in todo]
    lines += [f"refused {n}: drained by someone else ({nodes[n].reason or nodes[n].state})" for n in refused]
    return (ExitCode.SAFETY_STOP if refused else ExitCode.OK), lines


def manual_resume(config: Config, slurm: Slurm, hostlist: str, force: bool = False) -> tuple[ExitCode, list[str]]:
    audit = AuditLog(config.audit_log)
    try:
        with RunLock(config.state_dir):
            names, nodes = _targets(slurm, hostlist)
            refused = [n for n in names if nodes[n].reason and not nodes[n].owned and not force]
            for name in refused:
                audit.write("refuse", node=name, reason=nodes[name].reason, state=nodes[name].state_text,
                            detail="not-owned: drained by someone else; use --force to resume it anyway")
            todo = [n for n in names if n not in refused]
            if todo:
                slurm.resume(todo)
                for name in todo:
                    audit.write("resume", node=name, checks=["manual"], reason=nodes[name].reason,
                                detail="forced" if force and not nodes[name].owned else "")
    except SafetyStop as err:
        audit.write("refuse", node=hostlist, detail=str(err))
        raise
    lines = [f"resumed {n}" for n in todo]
    lines += [f"refused {n}: drained by someone else ({nodes[n].reason}); --force resumes it" for n in refused]
    return (ExitCode.SAFETY_STOP if refused else ExitCode.OK), lines
