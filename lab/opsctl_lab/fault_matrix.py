"""The fault matrix: every fault the lab can inject, what in opsctl sees it, and what opsctl then does.

Built from the lab's fault list (opsctl_lab.hardware.FAULTS, each fault's `seen_by`) and opsctl's health
catalog, so that the table in docs/health.md cannot drift from either: tests/unit/test_fault_matrix.py
compares them, and fails when a fault has nothing that sees it, names a check that does not exist, or a
catalog rule has no fault that exercises it (beyond the rules it lists as not yet exercised).
"""

from dataclasses import dataclass

from opsctl.health.catalog import Rule
from opsctl_lab.hardware import FAULT_ARGUMENTS, FAULTS, TARGET_OPTIONS, FaultSpec

# What sees an XID fault: the catalog rule of its code (xid-79), or the family that takes the code
# (xid-report, xid-unknown), as NVIDIA's XID catalog decides (docs/health.md, "XIDs").
XID_RULES = "xid-<code>"
# What sees a fault outside the health catalog.
DETECTORS = {
    "data": "the data checks (`data-dcgm`, `data-node`): the node is unknown, never drained",
    "epilog": "Slurm's epilog (the slurm role): it drains the node after the job, saying what it found",
    "driver-verify": "the nvidia role's verification in `make provision`: the run fails naming the GPUs",
    "topology": "`opsctl ib topology`: the cabling drift against the fabric's design",
    "layout": "nothing to see: a naming of the HCAs, under which every check must still work",
}
MARK_BEGIN = "<!-- fault matrix: generated from the lab's faults and the catalog (opsctl_lab.fault_matrix) -->"
MARK_END = "<!-- end of the fault matrix -->"


@dataclass(frozen=True)
class Row:
    fault: str  # as injected, with its argument: xid:<code>
    where: str  # --gpu G, --hca H, the node, a rail, the fabric
    tiers: str  # both lab tiers, or the one that emulates it
    seen_by: str
    does: str  # the rule's severity and action, or what the detector does
    hold: str  # how long the rule's condition must last (the default config), or "-"


def _tiers(spec: FaultSpec) -> str:
    return "lab machines" if spec.machines_only else "simulated lab" if spec.simulated_only else "both"


def rows(rules: list[Rule]) -> list[Row]:
    """One row per fault and what sees it, in the lab's order of faults."""
    by_id = {rule.id: rule for rule in rules}
    out = []
    for spec in FAULTS.values():
        where = TARGET_OPTIONS.get(spec.target, spec.target)  # node, rail, fabric
        for seen in spec.seen_by:
            rule = by_id.get(seen)
            if seen == XID_RULES:
                does, hold = "per NVIDIA's XID catalog: drain, or report", "-"
            elif rule is not None:
                does, hold = f"{rule.severity} / {rule.action}", rule.hold
            else:
                does, hold = DETECTORS.get(seen, "unknown"), "-"
            shown = f"`{seen}`" if rule is not None or seen == XID_RULES else seen
            out.append(Row(spec.name + FAULT_ARGUMENTS.get(spec.name, ""), where, _tiers(spec), shown, does, hold))
    return out


def unknown_detectors(rules: list[Rule]) -> dict[str, list[str]]:
    """fault -> what its seen_by names that is neither a catalog rule, XID_RULES nor a DETECTORS entry."""
    known = {rule.id for rule in rules} | {XID_RULES} | set(DETECTORS)
    return {spec.name: bad for spec in FAULTS.values() if (bad := [s for s in spec.seen_by if s not in known])}


def unexercised(rules: list[Rule]) -> list[str]:
    """The catalog rules that no fault's seen_by names (an XID rule counts as seen by the XID faults)."""
    named = {seen for spec in FAULTS.values() for seen in spec.seen_by}
    xids = XID_RULES in named
    return [rule.id for rule in rules
            if rule.id not in named and not (xids and (rule.xid is not None or rule.xid_series))]


def markdown(table: list[Row]) -> str:
    lines = [MARK_BEGIN, "| fault | on | lab tier | seen by | then | hold |", "|---|---|---|---|---|---|"]
    lines += [f"| `{r.fault}` | {r.where} | {r.tiers} | {r.seen_by} | {r.does} | {r.hold} |" for r in table]
    return "\n".join(lines + [MARK_END])
