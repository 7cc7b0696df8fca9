"""The remediation ladder's words: where a node is on it, as its Slurm reason says, and what fault put it there.

A node climbs the ladder only from a drain of opsctl's own health rules whose fault a GPU reset or a
reboot can clear. Each step is an opsctl reason, so that `sinfo -R` shows where every node is:

    opsctl:reset <gpu> <rule> <evidence>            the head asks the node to reset the GPU (node check does it)
    opsctl:reboot <gpu> <rule> <evidence>           scontrol reboot ASAP nextstate=DOWN, through the actor
    opsctl:validated-<result> <gpu> <rule> after-<reset|reboot> <detail>
                                                    the node's own checks after the step: pass, fail or
                                                    unchecked (a skipped or errored test is never a pass)
    opsctl:rma <gpu> <rule> <why>                   a person and the vendor; nothing automatic touches it
    opsctl:unvalidated <gpu> <rule> <why>           the checks could not run after a reboot: a person

<gpu> is `gpu3`, or `node` for a fault of no single GPU. The head (`opsctl remediate`) sets every step but
`validated-*`, which the node sets on its own reason after its checks (`opsctl node check`).
docs/remediation.md has the whole ladder.
"""

import re
from dataclasses import dataclass

from opsctl.health.xid import DRAIN_ACTIONS, XidCatalog
from opsctl.slurm.base import OWNED_PREFIX, SlurmNode

RESET, REBOOT, RMA, UNVALIDATED = "reset", "reboot", "rma", "unvalidated"
VALIDATED = "validated"
RESULTS = ("pass", "fail", "unchecked")
STEPS = (RESET, REBOOT, RMA, UNVALIDATED, *(f"{VALIDATED}-{result}" for result in RESULTS))
# Rules whose fault a GPU reset clears, or whose clearing it proves: a pending row remap is applied by the
# reset; a failed remap and a new DBE are retested by the diagnostics after it (a sticky fault fails them).
RESET_RULES = {"row-remap-pending": RESET, "row-remap-failure": RESET, "ecc-dbe-new": RESET}
_FAMILY = re.compile(r"^xid-(reset|reboot|inspect)$")
_OWN_XID = re.compile(r"^xid-(\d+)$")
_GPU = re.compile(r"^gpu\d+$")
_EVIDENCE_XID = re.compile(r"\bxid=(\d+)\b")
# The GPU's serial in a validated-fail answer and the RMA reason after it: `serial=1650924123456`.
_SERIAL = re.compile(r"\bserial=(\S+)")


@dataclass(frozen=True)
class Fault:
    """What the ladder works on: one rule's fault on one GPU (or the node), and the step it calls for."""

    rule: str  # the health rule: xid-79, xid-reset, row-remap-pending
    gpu: str  # gpu3, or "node"
    action: str  # reset | reboot | inspect (inspect: straight to RMA)
    xid: int | None = None

    @property
    def gpu_index(self) -> int | None:
        return int(self.gpu[3:]) if _GPU.match(self.gpu) else None


@dataclass(frozen=True)
class Rung:
    """Where a node's reason puts it on the ladder."""

    step: str  # one of STEPS
    fault: Fault
    after: str = ""  # validated-*: the step it followed, reset or reboot
    detail: str = ""


def fault_of(node: SlurmNode, catalog: XidCatalog) -> Fault | None:
    """The ladder's fault behind opsctl's own health drain, `opsctl:xid-79 gpu3 xid=79 count=1`; None when
    the drain is not one the ladder may touch: a person's, another rule's (an InfiniBand port, storage),
    or several rules at once (a reset would not clear them all)."""
    if not node.owned or node.manual:
        return None
    rules = node.reason_rules()
    if len(rules) != 1:
        return None
    words = node.reason[len(OWNED_PREFIX):].split()
    gpu = words[1] if len(words) > 1 and _GPU.match(words[1]) else "node"
    rule = rules[0]
    own, family = _OWN_XID.match(rule), _FAMILY.match(rule)
    if own:
        code = int(own.group(1))
        action = catalog.action(code)
        return Fault(rule, gpu, action, code) if action in DRAIN_ACTIONS else None
    if family:
        found = _EVIDENCE_XID.search(node.reason)
        return Fault(rule, gpu, family.group(1), int(found.group(1)) if found else None)
    if rule in RESET_RULES and gpu != "node":
        return Fault(rule, gpu, RESET_RULES[rule])
    return None


def rung_of(node: SlurmNode) -> Rung | None:
    """The node's step on the ladder from its reason, None when its reason is no step of it."""
    if not node.owned or node.manual:
        return None
    words = node.reason[len(OWNED_PREFIX):].split()
    if len(words) < 3 or words[0] not in STEPS:
        return None
    step, gpu, rule = words[0], words[1], words[2]
    fault = Fault(rule, gpu, "")
    if step.startswith(VALIDATED):
        after = words[3].removeprefix("after-") if len(words) > 3 else ""
        return Rung(step, fault, after=after, detail=" ".join(words[4:]))
    return Rung(step, fault, detail=" ".join(words[3:]))


def serial_word(serial: str) -> str:
    return f"serial={serial}"


def serial_of(reason: str) -> str | None:
    """The GPU serial a node's failed validation named in this reason, None when it names none."""
    found = _SERIAL.search(reason)
    return found.group(1) if found else None


def step_reason(step: str, fault: Fault, detail: str = "") -> str:
    """`opsctl:<step> <gpu> <rule> <detail>`, uncapped (the actor's callers cap it)."""
    return " ".join(part for part in (f"{OWNED_PREFIX}{step}", fault.gpu, fault.rule, detail) if part)


def validated_reason(result: str, fault: Fault, after: str, detail: str = "") -> str:
    """What the node sets after its checks: `opsctl:validated-pass gpu3 xid-79 after-reset`."""
    if result not in RESULTS:
        raise ValueError(f"validation result {result!r}: one of {', '.join(RESULTS)}")
    return step_reason(f"{VALIDATED}-{result}", fault, f"after-{after} {detail}".strip())
