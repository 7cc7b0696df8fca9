"""The remediation ladder's words: where a node is on it, as its Slurm reason says, and what fault put it there.

A node climbs the ladder only from a drain of opsctl's own health rules whose fault a GPU reset or a
reboot can clear. Each step is an opsctl reason, so that `sinfo -R` shows where every node is:

    opsctl:reset <gpu> <rule> <evidence>            the head asks the node to reset the GPU (node check does it)
    opsctl:reboot <gpu> <rule> <evidence>           scontrol reboot ASAP nextstate=DOWN, through the actor
    opsctl:power-cycle <gpu> <rule> <why>           the reboot never came back: off and on through the BMC
    opsctl:validated-<result> <gpu> <rule> after-<reset|reboot|power-cycle> <detail>
                                                    the node's own checks after the step: pass, fail or
                                                    unchecked (a skipped or errored test is never a pass)
    opsctl:rma <gpu> <rule> <why>                   a person and the vendor; nothing automatic touches it
    opsctl:unvalidated <gpu> <rule> <why>           the checks could not run after a reboot: a person

<gpu> is `gpu3`, or `node` for a fault of no single GPU; a second fault found while the node is on the ladder
adds its GPU and rule to the lists, `opsctl:reboot gpu1,gpu3 xid-79,xid-48 ...` (the health run does it:
opsctl/health/ladder_reason.py has the grammar), and the node then resets and validates every GPU listed. The
head (`opsctl remediate`) sets every step but `validated-*`, which the node sets on its own reason after its
checks (`opsctl node check`). docs/remediation.md has the whole ladder.
"""

import re
from dataclasses import dataclass

from opsctl.health.ladder_reason import (
    BOARD_RESTARTS,
    CUT,
    FAMILY,
    GPU,
    NODE,
    OWN_XID,
    POWER_CYCLE,
    REBOOT,
    RESET,
    RESET_RULES,
    RESULTS,
    RMA,
    STEPS,
    UNVALIDATED,
    VALIDATED,
    StepWords,
    entry_gpus,
    list_word,
    step_words,
)
from opsctl.health.xid import DRAIN_ACTIONS, XidCatalog
from opsctl.slurm.base import OWNED_PREFIX, SlurmNode

__all__ = ["BOARD_RESTARTS", "POWER_CYCLE", "REBOOT", "RESET", "RESET_RULES", "RESULTS", "RMA", "STEPS",
           "UNVALIDATED", "VALIDATED", "Fault", "Rung", "fault_of", "needed_action", "rung_of", "serial_of",
           "serial_word", "step_reason", "validated_reason"]
# The strongest action of several faults is the node's: an inspect goes to RMA, a reboot also clears what a
# reset would.
_STRENGTH = ("reset", "reboot", "inspect")
_EVIDENCE_XID = re.compile(r"\bxid=(\d+)\b")
# The GPU's serial in a validated-fail answer and the RMA reason after it: `serial=1650924123456`.
_SERIAL = re.compile(r"\bserial=(\S+)")


@dataclass(frozen=True)
class Fault:
    """What the ladder works on: the faults of its rules on its GPUs (or the node), and the step they call for.
    `rule` and `gpu` are the first, which the ladder's words name; `rules` and `gpus` all of them."""

    rule: str  # the health rule: xid-79, xid-reset, row-remap-pending
    gpu: str  # gpu3, or "node"
    action: str  # reset | reboot | inspect (inspect: straight to RMA)
    xid: int | None = None
    gpus: tuple[str, ...] = ()  # every GPU with an open fault, `gpu` first (empty: `gpu` alone)
    rules: tuple[str, ...] = ()  # every rule, `rule` first (empty: `rule` alone)

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", tuple(dict.fromkeys((self.gpu, *self.gpus))))
        object.__setattr__(self, "rules", tuple(dict.fromkeys((self.rule, *self.rules))))

    @property
    def gpu_index(self) -> int | None:
        return int(self.gpu[3:]) if GPU.match(self.gpu) else None

    @property
    def gpu_indexes(self) -> tuple[int, ...] | None:
        """Every GPU's index; None when one of them is no GPU (`node`): the node's step checks GPUs only."""
        if not all(GPU.match(gpu) for gpu in self.gpus):
            return None
        return tuple(int(gpu[3:]) for gpu in self.gpus)

    @property
    def gpu_word(self) -> str:
        return list_word(self.gpus)


@dataclass(frozen=True)
class Rung:
    """Where a node's reason puts it on the ladder."""

    step: str  # one of STEPS
    fault: Fault
    after: str = ""  # validated-*: the step it followed, reset or reboot
    detail: str = ""


def fault_of(node: SlurmNode, catalog: XidCatalog) -> Fault | None:
    """The ladder's fault behind opsctl's own health drain, `opsctl:xid-79 gpu3 xid=79 count=1` (every GPU its
    evidence names: `...; gpu5 xid=79 count=1`); None when the drain is not one the ladder may touch: a
    person's, one with another rule's fault (an InfiniBand port, storage), or a reason cut short (it may not
    name every GPU)."""
    if not node.owned or node.manual or node.reason.endswith(CUT) or step_words(node.reason) is not None:
        return None
    rules = node.reason_rules()
    gpus = entry_gpus(node.reason[len(OWNED_PREFIX):])
    faults = [_rule_fault(rule, gpus, node.reason, catalog) for rule in rules]
    if not faults or any(f is None for f in faults):
        return None
    found = [f for f in faults if f is not None]
    action = max((f.action for f in found), key=_STRENGTH.index)
    return Fault(rules[0], gpus[0], action, found[0].xid, gpus=gpus, rules=tuple(rules))


def _rule_fault(rule: str, gpus: tuple[str, ...], reason: str, catalog: XidCatalog) -> Fault | None:
    """One rule of an entry drain as the ladder's fault, None when the ladder does not take it."""
    own, family = OWN_XID.match(rule), FAMILY.match(rule)
    if own:
        code = int(own.group(1))
        action = catalog.action(code)
        return Fault(rule, gpus[0], action, code) if action in DRAIN_ACTIONS else None
    if family:
        found = _EVIDENCE_XID.search(reason)
        return Fault(rule, gpus[0], family.group(1), int(found.group(1)) if found else None)
    if rule in RESET_RULES and NODE not in gpus:
        return Fault(rule, gpus[0], RESET_RULES[rule])
    return None


def needed_action(fault: Fault, reason: str, catalog: XidCatalog) -> str:
    """The strongest action that the rules of a step's fault call for, "" when none is known. A step's reason
    names no action: a fault that joined it under the ladder (opsctl/health/ladder_reason.py) may need more
    than the step it joined (an XID 79 that joins a reset)."""
    found = [_rule_fault(rule, fault.gpus, reason, catalog) for rule in fault.rules]
    actions = [f.action for f in found if f is not None]
    return max(actions, key=_STRENGTH.index) if actions else ""


def rung_of(node: SlurmNode) -> Rung | None:
    """The node's step on the ladder from its reason, None when its reason is no step of it."""
    words: StepWords | None = step_words(node.reason) if node.owned and not node.manual else None
    if words is None:
        return None
    fault = Fault(words.rules[0], words.gpus[0], "", gpus=words.gpus, rules=words.rules)
    if words.step.startswith(VALIDATED):
        after, _, detail = words.tail.partition(" ")
        return Rung(words.step, fault, after=after.removeprefix("after-"), detail=" ".join(detail.split()))
    return Rung(words.step, fault, detail=" ".join(words.tail.split()))


def serial_word(serial: str) -> str:
    return f"serial={serial}"


def serial_of(reason: str) -> str | None:
    """The GPU serial a node's failed validation named in this reason, None when it names none."""
    found = _SERIAL.search(reason)
    return found.group(1) if found else None


def step_reason(step: str, fault: Fault, detail: str = "") -> str:
    """`opsctl:<step> <gpus> <rules> <detail>`, uncapped (the actor's callers cap it)."""
    return StepWords(step, fault.gpus, fault.rules, detail).reason


def validated_reason(result: str, fault: Fault, after: str, detail: str = "") -> str:
    """What the node sets after its checks: `opsctl:validated-pass gpu3 xid-79 after-reset`."""
    if result not in RESULTS:
        raise ValueError(f"validation result {result!r}: one of {', '.join(RESULTS)}")
    return step_reason(f"{VALIDATED}-{result}", fault, f"after-{after} {detail}".strip())
