"""The remediation ladder's reason grammar, which the health run reads too: which opsctl reasons put a node under
the ladder, and how a new fault joins one.

A node is under the ladder from opsctl's drain for a fault the ladder takes (the entry drain) until a person or
its resume takes it off:

    opsctl:xid-79 gpu1 xid=79 count=1                          the entry drain: rules, then one evidence per check
    opsctl:xid-79,xid-48 gpu1 xid=79 count=1; gpu3 xid=48 ...  the same, with a second fault
    opsctl:<step> <gpus> <rules> <detail>                      a step: reboot gpu1,gpu3 xid-79,xid-48 ...

`<gpus>` lists every GPU with an open fault (`gpu1,gpu3`, or `node` for a fault of no single GPU) and `<rules>`
every rule, each comma-separated and without spaces, so that the words after them stay free text. A new fault
on a node under the ladder (a GPU or a rule the reason does not list yet) joins the reason: an entry drain gains
the rule and the check's evidence, a step gains the GPU and the rule in its lists, and a `validated-pass`, which
did not check the new GPU, becomes `validated-unchecked`. `rma` and `unvalidated` are a person's, whose reason
nothing automatic changes. opsctl/ladder/reasons.py builds on this; the health
run (opsctl/health/plan.py) uses it to add the new fault. opsctl/health must not import opsctl/ladder, which
imports it: this module is the piece both read.
"""

import re
from dataclasses import dataclass

from opsctl.slurm.base import OWNED_PREFIX, SlurmNode
from opsctl.slurm.reach import Reach, reach

RESET, REBOOT, RMA, UNVALIDATED = "reset", "reboot", "rma", "unvalidated"
POWER_CYCLE = "power-cycle"  # through the node's BMC, when its reboot never came back
# The steps that start the whole board again: the node waits for them as for a reboot, and checks every GPU after.
BOARD_RESTARTS = (REBOOT, POWER_CYCLE)
VALIDATED = "validated"
RESULTS = ("pass", "fail", "unchecked")
STEPS = (RESET, REBOOT, POWER_CYCLE, RMA, UNVALIDATED, *(f"{VALIDATED}-{result}" for result in RESULTS))
PERSONS_STEPS = (RMA, UNVALIDATED)  # a person's from then on: nothing automatic changes their reason
# Rules whose fault a GPU reset clears, or whose clearing it proves: a pending row remap is applied by the
# reset; a failed remap and a new DBE are retested by the diagnostics after it (a sticky fault fails them).
RESET_RULES = {"row-remap-pending": RESET, "row-remap-failure": RESET, "ecc-dbe-new": RESET}
NODE = "node"  # the <gpus> word of a fault of no single GPU
NEW_FAULT = "new fault under the ladder"
FAMILY = re.compile(r"^xid-(reset|reboot|inspect)$")
OWN_XID = re.compile(r"^xid-(\d+)$")
GPU = re.compile(r"^gpu\d+$")
CUT = "..."  # what cap_reason (opsctl/actor/act.py) ends a cut reason with


@dataclass(frozen=True)
class StepWords:
    """A ladder step's reason, word by word."""

    step: str  # one of STEPS
    gpus: tuple[str, ...]
    rules: tuple[str, ...]
    tail: str = ""  # the words after the rules: the detail (validated-*: `after-<step> <detail>`)

    @property
    def reason(self) -> str:
        return " ".join(w for w in (f"{OWNED_PREFIX}{self.step}", list_word(self.gpus), list_word(self.rules),
                                    self.tail) if w)


def list_word(items: tuple[str, ...] | list[str]) -> str:
    return ",".join(dict.fromkeys(items))


def split_word(word: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(item for item in word.split(",") if item))


def step_words(reason: str) -> StepWords | None:
    """The words of a ladder step's reason, None when the reason is no step (a person's `opsctl:manual` is not)."""
    if not reason.startswith(OWNED_PREFIX):
        return None
    words = reason[len(OWNED_PREFIX):].split(None, 3)
    if len(words) < 3 or words[0] not in STEPS or not split_word(words[1]) or not split_word(words[2]):
        return None
    return StepWords(words[0], split_word(words[1]), split_word(words[2]), words[3] if len(words) > 3 else "")


def ladder_rule(rule: str) -> bool:
    """A rule whose drain the ladder may take, by its name (the ladder's own fault_of also asks NVIDIA's XID
    catalog about an `xid-<code>` rule)."""
    return bool(OWN_XID.match(rule) or FAMILY.match(rule)) or rule in RESET_RULES


def entry_gpus(reason: str) -> tuple[str, ...]:
    """The GPUs of an entry drain, in order: the first word of each check's evidence (`gpu1 xid=79 count=1;
    gpu3 ...`), `node` first when the first evidence names none."""
    evidence = reason.split(" ", 1)[1] if " " in reason else ""
    firsts = [part.split(" ", 1)[0] for part in evidence.split("; ")]
    gpus = [word for word in firsts if GPU.match(word)]
    return tuple(dict.fromkeys(([] if firsts and GPU.match(firsts[0]) else [NODE]) + gpus))


def entry_drain(node: SlurmNode) -> bool:
    """opsctl's own drain (not a person's) for rules the ladder takes, not yet a step."""
    rules = node.reason_rules()
    return bool(rules) and all(ladder_rule(rule) for rule in rules) and step_words(node.reason) is None


def under_ladder(node: SlurmNode) -> bool:
    """opsctl's own entry drain or step, not yet a person's: `rma` and `unvalidated` are, and nothing automatic
    touches them (nor a node under `opsctl hold`, whose reason is no step)."""
    words = step_words(node.reason)
    if not node.owned or node.manual:
        return False
    return entry_drain(node) if words is None else words.step not in PERSONS_STEPS


def open_faults(node: SlurmNode) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(GPUs, rules) that the node's ladder reason lists."""
    words = step_words(node.reason)
    if words is not None:
        return words.gpus, words.rules
    return entry_gpus(node.reason), tuple(node.reason_rules())


def with_new_step_faults(words: StepWords, gpus: list[str], rules: list[str], evidence: str) -> StepWords:
    """The step's reason with new GPUs and rules; a pass that did not check them is unchecked now."""
    step, tail = words.step, words.tail
    if step == f"{VALIDATED}-pass":
        after = tail.split(" ", 1)[0] if tail.startswith("after-") else ""
        step, tail = f"{VALIDATED}-unchecked", " ".join(w for w in (after, f"{NEW_FAULT}: {evidence}") if w)
    else:
        tail = "; ".join(t for t in (tail, evidence) if t)
    return StepWords(step, (*words.gpus, *gpus), (*words.rules, *rules), tail)


def ladder_reach(node: SlurmNode) -> Reach:
    """The one judgement of what opsctl may touch (opsctl/slurm/reach.py) for a node whose reason is a step of
    the ladder: the reboot opsctl asked for may still be under way (its own flags mean wait), and it leaves the
    node DOWN with the reboot step, or the node's answer after it; any other hold is hands off."""
    words = step_words(node.reason)
    rebooting = words is not None and words.step in BOARD_RESTARTS
    after_reboot = rebooting or (words is not None and words.tail.startswith(tuple(f"after-{step}"
                                                                                 for step in BOARD_RESTARTS)))
    return reach(node, down_ok=after_reboot, rebooting=rebooting)
