"""What a person does by hand: `opsctl drain`, `opsctl resume`, `opsctl nodes`, `opsctl history`.

Manual drains carry `opsctl:manual <text>`, which `opsctl health --resume` never lifts. Both commands
take the same lock as automatic runs and refuse to touch a node drained by someone else.
"""

import time

from opsctl.actor.act import DRAIN, RESUME, Actor, Change, cap_reason
from opsctl.actor.ledger import Ledger
from opsctl.actor.result import ActionResult
from opsctl.clients import Clients
from opsctl.config.schema import Config
from opsctl.errors import ConfigError, ExitCode, SafetyStop
from opsctl.slurm import MANUAL_PREFIX, Slurm, SlurmNode


def _targets(slurm: Slurm, hostlist: str) -> tuple[list[str], dict[str, SlurmNode]]:
    names = slurm.expand(hostlist)
    nodes = slurm.nodes()
    unknown = [n for n in names if n not in nodes]
    if unknown:
        raise ConfigError(f"unknown Slurm node(s): {', '.join(unknown)}")
    return names, nodes


def manual_drain(config: Config, slurm: Slurm, hostlist: str, text: str,
                 max_length: int | None = None) -> ActionResult:
    text = " ".join(text.split())
    if not text:
        raise ConfigError("--reason must not be empty")
    reason = cap_reason(f"{MANUAL_PREFIX} {text}", max_length or config.safety.reason_max_length)
    return _act(config, slurm, hostlist, DRAIN, reason, text, force=False)


def manual_resume(config: Config, slurm: Slurm, hostlist: str, force: bool = False) -> ActionResult:
    return _act(config, slurm, hostlist, RESUME, "", "", force)


def _act(config: Config, slurm: Slurm, hostlist: str, event: str, reason: str, text: str,
         force: bool) -> ActionResult:
    """A person's drain or resume of the nodes of `hostlist`, through the actor; a node drained by someone
    else is refused (a resume with --force takes it anyway, and the audit record says so)."""
    now = time.time()
    result = ActionResult()
    try:
        with Actor(config, slurm, now, result=result) as actor:
            names, nodes = _targets(slurm, hostlist)
            refused = [n for n in names if _foreign(nodes[n], event) and not force]
            for name in refused:
                node = nodes[name]
                actor.refuse(name, "not-owned: " + (
                    "drained by someone else; use --force to resume it anyway" if event == RESUME
                    else f"{node.state_text} " + ("with a reason opsctl did not set" if node.reason
                                                  else "out of service")), seen=node, evidence=text)
            changes = [Change(node=n, event=event, seen=nodes[n], reason=reason, checks=("manual",), evidence=text,
                              detail="forced" if force and event == RESUME and not nodes[n].owned else "")
                       for n in names if n not in refused]
            acted = actor.apply(changes) if changes else None
    except SafetyStop as err:
        Ledger(config).audit("refuse", node=hostlist, detail=str(err))
        raise
    made = acted.made if acted else []
    lines = [f"drained {c.node}: {reason}" if event == DRAIN else f"resumed {c.node}" for c in made]
    lines += [f"refused {c.node}: {why}" for c, why in (acted.dropped if acted else [])]
    if event == DRAIN:
        lines += [f"refused {n}: drained by someone else ({nodes[n].reason or nodes[n].state})" for n in refused]
    else:
        lines += [f"refused {n}: drained by someone else ({nodes[n].reason}); --force resumes it" for n in refused]
    done = [c.node for c in made]
    result.lines = lines
    result.drained, result.resumed = (done, []) if event == DRAIN else ([], done)
    result.exit_code = ExitCode.SAFETY_STOP if refused or (acted and acted.dropped) else ExitCode.OK
    return result


def _foreign(node: SlurmNode, event: str) -> bool:
    if event == RESUME:
        return bool(node.reason) and not node.owned
    # opsctl's words that a resume left on a node in service are no one's drain (SlurmNode.leftover).
    return (node.out_of_service or bool(node.reason)) and not node.owned and not node.leftover


# ---- what `opsctl nodes`, `drain` and `resume` call ---------------------------------------------------------
def list_nodes(clients: Clients) -> dict[str, SlurmNode]:
    return clients.slurm().nodes()


def drain_nodes(clients: Clients, hostlist: str, reason: str) -> ActionResult:
    return manual_drain(clients.config(acting=True), clients.slurm(), hostlist, reason)


def resume_nodes(clients: Clients, hostlist: str, force: bool) -> ActionResult:
    return manual_resume(clients.config(acting=True), clients.slurm(), hostlist, force)
