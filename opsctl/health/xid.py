"""NVIDIA's XID catalog (xid_catalog.json, made by tools/gen_xid_catalog.py) and the action opsctl takes
for each code.

NVIDIA's sheet gives every XID an immediate resolution bucket. opsctl reads it as one of:
  reset        RESET_GPU, the NVLink and XID 48 workflows (a reset retires or remaps and retrains)
  reboot       RESTART_BM, RESTART_VM, and XID 154 (its recovery action can ask for a node reboot; the
               kernel log's text says which, docs/node-check.md)
  inspect      CONTACT_SUPPORT, CHECK_MECHANICALS, UPDATE_SWFW: a person or the vendor, hardware
               inspection or RMA
  restart_app  RESTART_APP, CHECK_UVM: the application's fault; the node is fine
  none         IGNORE, and XID 45's workflow (it follows another XID, which decides)
  unused       a code NVIDIA lists as unused on current GPUs: it should never be seen
  unspecified  a code the sheet lists without a bucket yet
The first three drain (DRAIN_ACTIONS); the others are reported. A code not in the catalog at all is
`xid-unknown` in the rule catalog: reported, never dropped.
"""

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

ACTIONS = ("reset", "reboot", "inspect", "restart_app", "none", "unused", "unspecified")
DRAIN_ACTIONS = ("reset", "reboot", "inspect")
# The rule families (xid-<family> in the rule catalog): one per action that drains, one for the reported.
FAMILIES = {**{action: (action,) for action in DRAIN_ACTIONS},
            "report": tuple(action for action in ACTIONS if action not in DRAIN_ACTIONS)}
_BUCKETS = {
    "RESET_GPU": "reset", "WORKFLOW_NVLINK_ERR": "reset", "WORKFLOW_NVLINK5_ERR": "reset",
    "WORKFLOW_XID_48": "reset",
    "RESTART_BM": "reboot", "RESTART_VM": "reboot", "XID_154": "reboot",
    "CONTACT_SUPPORT": "inspect", "CHECK_MECHANICALS": "inspect", "UPDATE_SWFW": "inspect",
    "RESTART_APP": "restart_app", "CHECK_UVM": "restart_app",
    "IGNORE": "none", "WORKFLOW_XID_45": "none",
}


@dataclass(frozen=True)
class XidEntry:
    code: int
    mnemonic: str
    description: str
    immediate: str  # NVIDIA's bucket, as the sheet spells it
    action: str  # one of ACTIONS


@dataclass(frozen=True)
class XidCatalog:
    source: str
    read_at: str
    entries: dict[int, XidEntry]

    def action(self, code: int) -> str | None:
        """The action for a code, None for a code the catalog does not know."""
        entry = self.entries.get(code)
        return entry.action if entry else None

    def codes(self, action: str) -> list[int]:
        return sorted(code for code, entry in self.entries.items() if entry.action == action)

    def family_codes(self, own_rule_xids: set[int]) -> dict[str, list[int]]:
        """family -> the codes it holds: those whose action is the family's, less the codes with a rule
        of their own (xid-79 ...)."""
        return {family: sorted(code for action in actions for code in self.codes(action) if code not in own_rule_xids)
                for family, actions in FAMILIES.items()}


def action_of(immediate: str, description: str) -> str:
    if description == "Unused":
        return "unused"
    if not immediate:
        return "unspecified"
    if immediate not in _BUCKETS:
        # A bucket NVIDIA added after this mapping was written: a person decides until it is mapped.
        return "inspect"
    return _BUCKETS[immediate]


@cache
def xid_catalog() -> XidCatalog:
    raw = json.loads(resources.files("opsctl.health").joinpath("xid_catalog.json").read_text(encoding="utf-8"))
    entries = {
        int(e["code"]): XidEntry(code=int(e["code"]), mnemonic=e["mnemonic"], description=e["description"],
                                 immediate=e["immediate"], action=action_of(e["immediate"], e["description"]))
        for e in raw["entries"]
    }
    return XidCatalog(source=raw["source"], read_at=raw["read_at"], entries=entries)


def code_regex(codes: list[int]) -> str:
    """A label matcher's regex for these codes; `-` (no XID label is ever that) when there are none."""
    return "|".join(str(code) for code in codes) or "-"


def value_filter(metric: str, codes: list[int]) -> str:
    """PromQL keeping the series of `metric` whose value is one of `codes` (the last-XID gauge holds the
    code as its value): comparisons chained per run of consecutive codes, so 172 codes stay short."""
    runs: list[list[int]] = []
    for code in sorted(set(codes)):
        if runs and code == runs[-1][-1] + 1:
            runs[-1].append(code)
        else:
            runs.append([code])
    parts = [f"{metric} == {run[0]}" if len(run) == 1 else f"{metric} >= {run[0]} <= {run[-1]}" for run in runs]
    return "(" + " or ".join(parts) + ")" if parts else f"({metric} == -1)"
