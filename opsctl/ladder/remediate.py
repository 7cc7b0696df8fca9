"""One `opsctl remediate` run, and `opsctl hold`: read Slurm, the audit log and the holds; plan each node's next
step on the ladder (opsctl/ladder/plan.py); make the steps through the actor; write an RMA
bundle for each node handed to the vendor.

The actor takes the run lock (the health run's: the two never act at once), compares and sets against
Slurm, records the reset and reboot budgets before scontrol and audits each step: `opsctl history NODE`
shows the node's whole ladder. With --dry-run nothing changes and each step is audited as `would-<step>`.
"""

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opsctl.actor.act import HOLD, RELEASE, RMA, Actor, Change
from opsctl.actor.audit import current_user
from opsctl.actor.ledger import Ledger, stamp
from opsctl.actor.result import ActionResult
from opsctl.actor.state import State
from opsctl.bmc import PowerControl
from opsctl.clients import Clients
from opsctl.config.schema import Config
from opsctl.errors import ConfigError, ExitCode
from opsctl.health.xid import xid_catalog
from opsctl.ladder.hold import held_reason, holdable, is_held, released_reason
from opsctl.ladder.plan import Budgets, LadderDecision, LadderPlan, plan_ladder, refuse_reboots
from opsctl.ladder.reasons import BOARD_RESTARTS, serial_of
from opsctl.slurm import Slurm, SlurmNode

# Where the node keeps its side of the evidence (opsctl/ladder/node_step.py): the head never logs in.
NODE_EVIDENCE = ("on the node: <state_dir>/validation/<UTC time>-<step>/ (dcgmi-diag.json, nvidia-smi-q.txt, "
                 "nvidia-bug-report.log.gz)")


@dataclass
class RemediateResult:
    plan: LadderPlan
    made: list[str] = field(default_factory=list)  # nodes whose step was made
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (node, why): Slurm changed since the plan
    failed: list[str] = field(default_factory=list)  # nodes whose step was not made: a BMC that did not power-cycle
    bundles: list[Path] = field(default_factory=list)
    dry_run: bool = False
    action: ActionResult = field(default_factory=ActionResult)  # what the actor did, refused and skipped

    @property
    def exit_code(self) -> ExitCode:
        if self.failed:
            return ExitCode.SOURCE_DOWN
        return ExitCode.SAFETY_STOP if self.plan.stop or self.dropped else ExitCode.OK


def remediate(config: Config, slurm: Slurm, dry_run: bool, now: float | None = None,
              power: PowerControl | None = None) -> RemediateResult:
    now = time.time() if now is None else now
    action = ActionResult()
    with Actor(config, slurm, now, result=action, power=power) as actor:
        cluster = actor.nodes()
        records, _ = actor.ledger.audit_records()
        state = actor.state
        budgets = Budgets(resets=len(state.budgets.recent("resets", now)),
                          reboots=len(state.budgets.recent("reboots", now)),
                          resumes=len(state.budgets.recent("resumes", now)))
        plan = plan_ladder(cluster, xid_catalog(), records, set(state.holds.load()), budgets, config, now)
        if any(d.action in BOARD_RESTARTS for d in plan.decisions) and actor.refuses_reboots():  # asked only if needed
            refuse_reboots(plan)
        result = RemediateResult(plan, dry_run=dry_run, action=action)
        changes = [_change(d) for d in plan.changing()]
        for decision in plan.decisions:
            if decision.action.startswith("skip:") and decision.action not in ("skip:rma", "skip:unvalidated"):
                actor.refuse(decision.node, f"{decision.action.removeprefix('skip:')}: {decision.detail}".rstrip(": "),
                             checks=(decision.fault.rule,) if decision.fault else (), seen=decision.seen,
                             dry_run=dry_run)
            elif decision.action in ("skip:rma", "skip:unvalidated"):
                actor.skip(decision.node, f"{decision.action.removeprefix('skip:')}: {decision.detail}")
        if dry_run:
            for change in changes:
                actor.would(change)
            return result
        acted = actor.apply(changes) if changes else None
        if acted is not None:
            result.made = [c.node for c in acted.made]
            result.dropped = [(c.node, why) for c, why in acted.dropped]
            result.failed = [c.node for c in acted.failed]
            rmas = [change for change in acted.made if change.event == RMA]
            if rmas:
                records, _ = actor.ledger.audit_records()  # with the RMA's own record
            for change in rmas:
                result.bundles.append(write_bundle(actor.ledger, change, records, now))
    return result


def _change(decision: LadderDecision) -> Change:
    assert decision.seen is not None and decision.fault is not None
    # The ladder's steps are the actor's events by the same names (opsctl/actor/act.py).
    return Change(node=decision.node, event=decision.action, seen=decision.seen, reason=decision.reason,
                  checks=(decision.fault.rule,), evidence=decision.fault.gpu, detail=decision.detail)


def write_bundle(ledger: Ledger, change: Change, records: list[dict[str, Any]], now: float) -> Path:
    """What a vendor ticket needs from the head: the node's history from the audit log, what the ladder knew
    of the fault, and the GPU's serial that the node's failed validation named. The node keeps its own side
    (the failing diagnostics' JSON, `nvidia-smi -q`, nvidia-bug-report where it exists) under its state
    directory, docs/remediation.md."""
    history = [r for r in records if r.get("node") == change.node]
    summary = {"node": change.node, "gpu": change.evidence, "rule": change.checks[0] if change.checks else "",
               "reason": change.reason, "why": change.detail, "slurm_state": change.seen.state_text,
               "time": stamp(now), "by": current_user(), "xid_catalog": _catalog_entry(change),
               "gpu_serial": serial_of(change.seen.reason) or serial_of(change.reason),
               "node_evidence": NODE_EVIDENCE}
    return ledger.write_rma_bundle(change.node, now, {
        "history.jsonl": "".join(json.dumps(r, sort_keys=True) + "\n" for r in history),
        "summary.json": json.dumps(summary, indent=1, sort_keys=True) + "\n"})


def _catalog_entry(change: Change) -> dict[str, Any] | None:
    words = change.seen.reason.split()
    codes = [int(w[4:]) for w in words if w.startswith("xid=") and w[4:].isdigit()]
    rule = change.checks[0] if change.checks else ""
    if rule.startswith("xid-") and rule[4:].isdigit():
        codes = [int(rule[4:])]
    entry = xid_catalog().entries.get(codes[0]) if codes else None
    if entry is None:
        return None
    return {"xid": entry.code, "mnemonic": entry.mnemonic, "description": entry.description,
            "nvidia_immediate_resolution": entry.immediate, "source": xid_catalog().source}


def set_hold(config: Config, slurm: Slurm, names: list[str], why: str, release: bool) -> list[str]:
    """Take nodes off the ladder (`opsctl hold`) or hand them back (--release): under the run lock, audited.
    A node on opsctl's own drain carries the hold in its Slurm reason too (opsctl/ladder/hold.py), where the
    node reads it and takes no step; any other node keeps its state and reason, and only the head's ladder
    leaves it alone."""
    now = time.time()
    with Actor(config, slurm, now) as actor:
        known = actor.nodes()
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ConfigError(f"unknown Slurm node(s): {', '.join(unknown)}")
        state: State = actor.state
        holds = state.holds.load()
        lines, marked = [], []
        for name in names:
            if release:
                if holds.pop(name, None) is None and not is_held(known[name]):
                    lines.append(f"{name}: not held")
                    continue
                lines.append(f"released {name}: back on the remediation ladder")
            else:
                holds[name] = {"since": now, "user": current_user(), "why": why}
                lines.append(f"held {name}: the remediation ladder leaves it alone")
            marked.append(name)
        actor.ledger.save_holds(holds)
        changes = [_hold_change(known[name], why, release) for name in marked]
        made = {c.node for c in actor.apply([c for c in changes if c is not None]).made}
        for name in (n for n in marked if n not in made):
            actor.ledger.audit("release" if release else "hold", node=name, detail=why, now=now,
                               state=known[name].state_text, reason=known[name].reason)
    return lines


def _hold_change(node: SlurmNode, why: str, release: bool) -> Change | None:
    """The hold's word put into (or taken out of) opsctl's own reason; None when the reason has nothing to mark."""
    if release:
        reason = released_reason(node.reason)
    else:
        reason = held_reason(node.reason) if holdable(node) else node.reason
    if reason == node.reason:
        return None
    return Change(node=node.name, event=RELEASE if release else HOLD, seen=node, reason=reason, detail=why,
                  budget=False)


# ---- what `opsctl remediate` and `opsctl hold` call ---------------------------------------------------------
def remediate_round(clients: Clients, dry_run: bool) -> RemediateResult:
    return remediate(clients.config(acting=not dry_run), clients.slurm(), dry_run, power=clients.power())


def hold(clients: Clients, hostlist: str, why: str, release: bool) -> list[str]:
    slurm = clients.slurm()
    return set_hold(clients.config(acting=True), slurm, slurm.expand(hostlist), " ".join(why.split()), release)
