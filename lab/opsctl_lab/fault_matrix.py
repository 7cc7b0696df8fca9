"""The fault matrix: every fault the lab can inject, what in opsctl sees it, and what opsctl then does.

Built from the lab's fault list (opsctl_lab.hardware.FAULTS, each fault's `seen_by`) and opsctl's health
catalog, so that the table in docs/health.md cannot drift from either: tests/unit/test_fault_matrix.py
compares them, and fails when a fault has nothing that sees it, names a check that does not exist, or a
catalog rule has no fault that exercises it (beyond the rules it lists as not yet exercised).
"""

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from opsctl.config import Config, duration_seconds, parse_config
from opsctl.health.catalog import Rule, load_catalog
from opsctl.health.units import age
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
    "job-health": "the job-health evaluation: a training job's ranks that wait for a slow or hung peer; no node "
                  "health rule fails",
    "reboot-timeout": "slurmctld's ResumeTimeout (`reboot timed out`) on a reboot the ladder asked for: the ladder "
                      "power-cycles the node through its BMC",
}
# How often `opsctl node check` runs on a node: the node_check role's node_check_interval (1min;
# tests/unit/test_fault_matrix.py holds the two alike). A rule that reads what it writes sees a fault at
# the node's next check, not at the next scrape.
NODE_CHECK_INTERVAL_S = 60
# The series `opsctl node check` writes for the textfile collector; opsctl_node_validate is written when a
# validation ends (`opsctl validate`), so its time to see counts from then.
NODE_CHECK_SERIES = re.compile(r"\bopsctl_node_(?!validate)")
# The fault whose XID only the node check reads, from the kernel log.
KERNEL_LOG_FAULTS = ("xid-kernel",)
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
    seen: str = "-"  # seen within, at most (seen_within), or "-" where no rule sees it


def seen_within(hold_s: int, scrape_s: float, node_check: bool) -> int:
    """The longest a fault takes to be seen: the node's next check where the rule reads what the check
    writes, the next scrape (the fault's first sample), the hold, and the next evaluation of the recorded
    results (one scrape interval by default). A rule that counts events in a window (`memory: window`: an
    XID's, a DBE's) fails at the event: its hold is how long the event counts, and hold_s is 0."""
    return (NODE_CHECK_INTERVAL_S if node_check else 0) + int(scrape_s) + hold_s + int(scrape_s)


def _tiers(spec: FaultSpec) -> str:
    return "lab machines" if spec.machines_only else "simulated lab" if spec.simulated_only else "both"


def rows(rules: list[Rule], config: Config) -> list[Row]:
    """One row per fault and what sees it, in the lab's order of faults, with config's scrape interval."""
    by_id = {rule.id: rule for rule in rules}
    scrape_s = duration_seconds(config.prometheus.scrape_interval)
    out = []
    for spec in FAULTS.values():
        where = TARGET_OPTIONS.get(spec.target, spec.target)  # node, rail, fabric
        for seen in spec.seen_by:
            rule = by_id.get(seen)
            within = "-"
            if seen == XID_RULES:
                does, hold = "per NVIDIA's XID catalog: drain, or report", "-"
                within = age(seen_within(0, scrape_s, spec.name in KERNEL_LOG_FAULTS))
            elif rule is not None:
                does, hold = f"{rule.severity} / {rule.action}", rule.hold
                held = 0 if rule.memory == "window" else duration_seconds(rule.hold)
                within = age(seen_within(held, scrape_s, bool(NODE_CHECK_SERIES.search(rule.expr))))
            else:
                does, hold = DETECTORS.get(seen, "unknown"), "-"
            shown = f"`{seen}`" if rule is not None or seen == XID_RULES else seen
            out.append(Row(spec.name + FAULT_ARGUMENTS.get(spec.name, ""), where, _tiers(spec), shown, does, hold,
                           within))
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
    lines = [MARK_BEGIN, "| fault | on | lab tier | seen by | then | hold | seen within |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| `{r.fault}` | {r.where} | {r.tiers} | {r.seen_by} | {r.does} | {r.hold} | {r.seen} |" for r in table]
    return "\n".join(lines + [MARK_END])


def regenerate(doc: Path) -> None:
    """Writes the matrix of the shipped catalog in the default config between doc's markers."""
    config = parse_config({}, str(doc), {})
    text = doc.read_text()
    begin, end = text.index(MARK_BEGIN), text.index(MARK_END) + len(MARK_END)
    doc.write_text(text[:begin] + markdown(rows(load_catalog(config), config)) + text[end:])


if __name__ == "__main__":  # python -m opsctl_lab.fault_matrix docs/health.md
    regenerate(Path(sys.argv[1]))
