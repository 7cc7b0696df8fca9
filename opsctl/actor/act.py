"""The one way opsctl changes a node in Slurm: drain, resume, a new reason on its own drain (escalate, and the
remediation ladder's reset, validated, rma and unvalidated steps), and a reboot through Slurm.

Every command that acts on nodes (`opsctl health --drain/--resume`, `drain`, `resume`, `remediate`, `ib
fabric-test --drain`, `ib quarantine`, `hw quarantine`, `rollout drain|resume`, `node check --drain-self`
and `--remediate-self`) builds Changes and hands them to an Actor; nothing else calls the Slurm client's
drain, resume, set_reason or reboot (tests/unit/test_act.py fails if something does).

Every acting path reads the nodes through Actor.nodes(): a reason that reads as opsctl's is judged against
the custody store and Slurm's record of who set it and when (SlurmNode.custody, actor/custody.py), so Slurm's
own drain or DOWN that kept opsctl's words is not opsctl's.

The Actor is entered once per run and holds the run lock for it. For each batch of changes that share one
scontrol call, in this order:

1. compare and set: Slurm is read again, and a change whose node no longer shows what the decision rested
   on (its flags and reason, and whether its base state is in service) is dropped and audited, and so is
   every reboot where slurm.conf sets ReturnToService=2;
2. intent: the handled-event records, the budget (drains and resumes per hour) and the custody entry (what
   this actor sets on the node, actor/custody.py) are written to the state directory before scontrol runs,
   so a crash, SIGKILL or a full audit disk after it still counts the change: the next run can never drain
   past the budget or re-drain what a person repaired, nor mistake its own reason for someone else's;
3. scontrol; after a resume, words that Slurm kept (24.11 and earlier without accounting storage keep a
   node's last reason: `clusteracct_storage_g_node_up()`, SchedMD/slurm cd41b6164d) are replaced with
   `opsctl:resumed`, which is no drain of opsctl's. An empty reason cannot clear them: `update_node()` sets a
   reason only when it is not empty (src/slurmctld/node_mgr.c, checked on 22.05, 24.11 and 26.05);
4. audit: one fsync'd record per change. `done` lists each change as it is made, so that any error after
   it (the audit log's disk full: exit 3; Ctrl-C: exit 130, with an audit record) still says what was done.

`cap_reason` is the one place a reason longer than safety.reason_max_length is cut with "...", for every
command that builds one.
"""

import contextlib
from dataclasses import dataclass, field, replace
from types import TracebackType

from opsctl.actor.custody import effective_user, entry, holds
from opsctl.actor.ledger import Ledger
from opsctl.actor.lock import RunLock
from opsctl.actor.memory import Handled, HandledMemory
from opsctl.actor.result import ActionResult
from opsctl.bmc import PowerControl, power_control
from opsctl.config.schema import Config
from opsctl.errors import Interrupted, OpsctlError, SourceUnavailable
from opsctl.slurm import Slurm, SlurmNode
from opsctl.slurm.base import RESUMED_REASON

DRAIN, RESUME, ESCALATE, REBOOT = "drain", "resume", "escalate", "reboot"
# The remediation ladder's steps that re-word opsctl's own drain (opsctl/ladder/reasons.py): ask the
# node for a GPU reset, record its checks' result, hand the node to the vendor (RMA) or to a person.
RESET, VALIDATED, RMA, UNVALIDATED = "reset", "validated", "rma", "unvalidated"
# A reboot that never came back, off and on again through the node's BMC (opsctl/bmc): the reason first, so that
# Slurm shows the step while it runs, then the BMC.
POWER_CYCLE = "power-cycle"
# `opsctl hold` and its release: the hold's word in (or out of) opsctl's own reason (opsctl/ladder/hold.py).
HOLD, RELEASE = "hold", "release"
# At ReturnToService=2 slurmctld returns a node that registers after a reboot to service, whatever nextstate
# said, before its checks ran (docs/remediation.md): no reboot then, neither the ladder's nor a rollout's.
RETURN_TO_SERVICE_2 = ("slurm.conf sets ReturnToService=2, which returns a rebooted node to service before its "
                       "checks; set it to 1")
REBOOT_REFUSED = f"refused: {RETURN_TO_SERVICE_2}"
# The budget each event spends (a re-wording takes no node out of service; a reset request and a
# reboot spend the ladder's own). A planned rollout's reboot spends none (Change.budget).
BUDGET = {DRAIN: "drains", RESUME: "resumes", RESET: "resets", REBOOT: "reboots", POWER_CYCLE: "reboots"}


def cap_reason(reason: str, max_length: int) -> str:
    """A Slurm reason cut to max_length with '...' (scontrol takes any length; sinfo and people do not)."""
    return reason if len(reason) <= max_length else reason[: max_length - 3] + "..."


@dataclass(frozen=True)
class Change:
    node: str
    event: str  # drain | resume | escalate | reboot | reset | validated | rma | unvalidated
    seen: SlurmNode  # Slurm as the decision saw it: the change is made only if it still shows this
    reason: str = ""  # the reason a drain or an escalation sets
    checks: tuple[str, ...] = ()  # rule ids, for the audit record
    evidence: str = ""
    values: tuple[dict[str, object], ...] = ()  # the metric values behind it
    handled: tuple[Handled, ...] = ()  # handled-event records, written as an intent before scontrol
    healthy_s: float | None = None  # a resume: how long the node has been healthy
    detail: str = ""  # why, in words, for the audit record
    # Spends the drain or resume budget. A planned rollout's changes do not (rollout/batch.py):
    # its batch size bounds them, and the budget stays for faults.
    budget: bool = True

    @property
    def line(self) -> str:
        return f"{self.event} {self.node}" + (f": {self.reason}" if self.reason else "")


@dataclass
class Acted:
    """What one apply did: the changes made, those dropped (node, why), and the nodes as Slurm showed them
    after the last change (so that no caller replays its plan to learn the outcome)."""

    made: list[Change] = field(default_factory=list)
    dropped: list[tuple[Change, str]] = field(default_factory=list)
    failed: list[Change] = field(default_factory=list)
    nodes: dict[str, SlurmNode] = field(default_factory=dict)


class Actor:
    """`with Actor(config, slurm, now) as actor: actor.apply(changes)`; `actor.result` says what was done,
    would be done, refused and skipped (actor/result.py); `actor.done` is its list of changes made."""

    def __init__(self, config: Config, slurm: Slurm, now: float, memory: HandledMemory | None = None,
                 done: list[str] | None = None, lock: bool = True, result: ActionResult | None = None,
                 power: PowerControl | None = None):
        self.config, self.slurm, self.now = config, slurm, now
        self._power = power  # the nodes' BMCs (power cycles): bmc's client unless handed one
        self.ledger = Ledger(config)
        self.audit, self.state = self.ledger.audit_log, self.ledger.state
        self.memory = memory
        self.result = ActionResult() if result is None else result
        if done is not None:  # the caller's list, which it shows if the run fails
            self.result.done = done
        self._lock: contextlib.AbstractContextManager[object] = (
            RunLock(config.state_dir) if lock else contextlib.nullcontext())
        self._return_to_service: int | None = None
        self._user = effective_user()
        self._custody_before: dict[str, dict[str, object] | None] = {}

    def __enter__(self) -> "Actor":
        self._lock.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._lock.__exit__(kind, err, trace)

    @property
    def done(self) -> list[str]:
        return self.result.done

    def nodes(self) -> dict[str, SlurmNode]:
        """Slurm's nodes, each reason that reads as opsctl's judged against the custody store (SlurmNode.custody)."""
        return self._judged(self.slurm.nodes())

    def _judged(self, nodes: dict[str, SlurmNode]) -> dict[str, SlurmNode]:
        words = {name: node for name, node in nodes.items() if node.opsctl_words}
        if not words:
            return nodes
        records, resumed = self.state.custody.load(), self.state.resumes.load()
        return {**nodes, **{name: replace(node, custody=holds(node, records.get(name), resumed.get(name),
                                                                {self._user}))
                            for name, node in words.items()}}

    def refuses_reboots(self) -> bool:
        """slurm.conf sets ReturnToService=2 (REBOOT_REFUSED); read from Slurm once per run, when first asked."""
        if self._return_to_service is None:
            self._return_to_service = self.slurm.return_to_service()
        return self._return_to_service == 2

    def refuse(self, node: str, detail: str, checks: tuple[str, ...] | list[str] = (), seen: SlurmNode | None = None,
               dry_run: bool = False, evidence: str = "") -> None:
        """An audit record of a change opsctl decided not to make, and why."""
        self.result.refused[node or "*"] = detail
        self.audit.write("refuse", node=node, checks=checks, detail=detail, dry_run=dry_run, now=self.now,
                         reason=seen.reason if seen else "", state=seen.state_text if seen else "",
                         evidence=evidence)

    def would(self, change: Change) -> None:
        """The audit record of a --dry-run: what apply would have done."""
        self.result.would.append(change.line)
        self.audit.write(f"would-{change.event}", node=change.node, checks=change.checks, dry_run=True,
                         reason=change.reason or change.seen.reason, values=change.values, now=self.now)

    def apply(self, changes: list[Change]) -> Acted:
        """Make the changes, one scontrol call per event and reason, each batch compared and set first."""
        acted = Acted()
        try:
            for batch in _batches(changes):
                self._apply_batch(batch, acted)
        except KeyboardInterrupt:
            with contextlib.suppress(OpsctlError):
                self.audit.write("interrupted", now=self.now, detail="Ctrl-C; done before it: "
                                 + ("; ".join(self.done) or "nothing"))
            raise Interrupted(list(self.done)) from None
        except OpsctlError as err:
            if self.done and not getattr(err, "done", None):
                err.done = list(self.done)  # type: ignore[attr-defined]  # shown by the CLI, exit code kept
            raise
        return acted

    def _apply_batch(self, batch: list[Change], acted: Acted) -> None:
        current = self.nodes()
        acted.nodes = current
        kept = []
        for change in batch:
            now_seen = current.get(change.node)
            # The reason's words unchanged, and opsctl's custody too: what the plan took as its own still is.
            if now_seen is not None and now_seen.same_as(change.seen) and (now_seen.owned or not change.seen.owned):
                kept.append(change)
                continue
            state = now_seen.state_text if now_seen else "gone"
            self._drop(change, f"changed: Slurm changed since the plan (now {state})", acted, now_seen)
        if kept and kept[0].event in (REBOOT, POWER_CYCLE) and self.refuses_reboots():
            for change in kept:
                self._drop(change, REBOOT_REFUSED, acted, change.seen)
            return
        if not kept:
            return
        self._intend(kept)
        names = [c.node for c in kept]
        event, reason = kept[0].event, kept[0].reason
        try:
            if event == DRAIN:
                self.slurm.drain(names, reason)
            elif event == RESUME:
                self.slurm.resume(names)
            elif event == REBOOT:
                self.slurm.reboot(names, reason)
            elif event == POWER_CYCLE:
                kept = self._power_cycle(kept, reason, acted)
            else:
                self.slurm.set_reason(names, reason)
        except SourceUnavailable:
            self._settle_after_failure(kept, acted)
            raise
        if kept:
            self._made(kept, acted)

    def _power_cycle(self, batch: list[Change], reason: str, acted: Acted) -> list[Change]:
        """The step's reason on the nodes, then each one off and on through its BMC: the changes made, with what
        the BMC did in their audit detail. A node whose BMC did not gets its reason back, its custody entry too,
        and a `power-cycle-failed` record that says why; the run goes on."""
        self.slurm.set_reason([c.node for c in batch], reason)
        made = []
        for change in batch:
            try:
                words = (self._power or power_control(self.config.bmc)).power_cycle(change.node)
            except OpsctlError as err:
                with contextlib.suppress(SourceUnavailable):
                    self.slurm.set_reason([change.node], change.seen.reason)
                self.state.custody.record({change.node: self._custody_before.get(change.node)})
                acted.failed.append(change)
                self.result.refused[change.node] = f"power cycle failed: {err}"
                self.audit.write(f"{POWER_CYCLE}-failed", node=change.node, checks=change.checks, reason=reason,
                                 detail=str(err), now=self.now, state=change.seen.state_text)
                continue
            made.append(replace(change, detail=f"{change.detail}; {words}".lstrip("; ")))
        return made

    def skip(self, node: str, why: str) -> None:
        """A node left alone on purpose before any change was planned for it (no audit record: nothing was
        refused)."""
        self.result.skipped[node] = why

    def _drop(self, change: Change, why: str, acted: Acted, seen: SlurmNode | None) -> None:
        acted.dropped.append((change, why))
        self.result.refused[change.node] = why
        self.audit.write("refuse", node=change.node, detail=why, now=self.now,
                         state=seen.state_text if seen else "gone", reason=seen.reason if seen else "",
                         checks=change.checks)

    def _intend(self, batch: list[Change]) -> None:
        """Handled records and the budget, on disk before scontrol runs."""
        if self.memory is not None:
            for change in batch:
                self.memory.add(change.handled)
            self.state.handled.save(self.memory)
        kind = BUDGET.get(batch[0].event)
        spent = sum(1 for change in batch if change.budget)
        if kind and spent:
            self.state.budgets.record(kind, spent, self.now)
        before = self.state.custody.load()
        self._custody_before = {change.node: before.get(change.node) for change in batch}
        self.state.custody.record({change.node: self._custody_entry(change) for change in batch})

    def _custody_entry(self, change: Change) -> dict[str, object]:
        """What this change sets on the node; `prior` the reason it had when that was opsctl's own (a resume:
        the words it lifts, which Slurm may keep)."""
        if change.event == RESUME:
            return entry(RESUME, "", change.seen.reason, self._user, self.now)
        return entry(change.event, change.reason, change.seen.reason if change.seen.owned else "", self._user,
                     self.now)

    def _made(self, batch: list[Change], acted: Acted) -> None:
        for change in batch:  # first what was done, so that a failing audit write still lists it
            self.done.append(change.line)
        acted.made += batch
        for change in batch:
            self._audit_made(change)
        resumed = [c.node for c in batch if c.event == RESUME]
        if resumed:  # a later run does not drain them on data older than this (health/plan.py)
            with contextlib.suppress(OpsctlError):
                self.state.resumes.record(resumed, self.now)
        if self.memory is not None:
            self.memory.settle(c.node for c in batch)
            self.state.handled.save(self.memory)
        with contextlib.suppress(SourceUnavailable):
            acted.nodes = self.nodes()
            self._clear_kept(batch, acted)

    def _clear_kept(self, batch: list[Change], acted: Acted) -> None:
        """The resumed nodes whose reason Slurm kept (the words opsctl lifted, unchanged) get RESUMED_REASON in
        their place: no drain of anyone's. Refused, the custody entry of the resume still says whose they were."""
        kept = [c.node for c in batch if c.event == RESUME and c.seen.reason and (node := acted.nodes.get(c.node))
                is not None and node.reason == c.seen.reason and not node.drained]
        if kept:
            self.slurm.set_reason(kept, RESUMED_REASON)
            acted.nodes = self.nodes()

    def _audit_made(self, change: Change) -> None:
        self.audit.write(change.event, node=change.node, checks=change.checks, evidence=change.evidence,
                         reason=change.reason or change.seen.reason, values=change.values, now=self.now,
                         state=change.seen.state_text, detail=change.detail,
                         healthy_seconds=change.healthy_s if change.event == RESUME else None)

    def _settle_after_failure(self, batch: list[Change], acted: Acted) -> None:
        """scontrol said no: keep the memory of the nodes it changed anyway, forget the rest's intents."""
        try:
            current = self.slurm.nodes()
        except OpsctlError:
            return  # cannot tell: the intents stay, which errs on never draining again

        def made_it(change: Change) -> bool:
            node = current.get(change.node)
            if node is None:
                return False
            return not node.drained if change.event == RESUME else node.reason == change.reason

        made = [c for c in batch if made_it(c)]
        acted.failed += [c for c in batch if c not in made]
        # What did not happen leaves the custody entry it would have replaced.
        self.state.custody.record({c.node: self._custody_before.get(c.node) for c in batch if c not in made})
        if self.memory is not None:
            self.memory.drop_intents(c.node for c in batch if c not in made)
            self.state.handled.save(self.memory)
        if made:
            self._made(made, acted)
        for change in acted.failed:
            self.audit.write(f"{change.event}-failed", node=change.node, checks=change.checks,
                             reason=change.reason, now=self.now)


def _batches(changes: list[Change]) -> list[list[Change]]:
    """Drains (by reason) first, then re-wordings, reboots, resumes: one scontrol call per batch."""
    order = {DRAIN: 0, ESCALATE: 1, RESET: 1, VALIDATED: 1, RMA: 1, UNVALIDATED: 1, HOLD: 1, RELEASE: 1, REBOOT: 2,
             POWER_CYCLE: 2, RESUME: 3}
    grouped: dict[tuple[str, str], list[Change]] = {}
    for change in changes:
        key = (change.event, change.reason if change.event != RESUME else "")
        grouped.setdefault(key, []).append(change)
    return [grouped[key] for key in sorted(grouped, key=lambda k: order[k[0]])]

