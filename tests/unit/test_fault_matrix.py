"""docs/health.md's fault matrix is the lab's fault list against the catalog: every fault is seen by a
catalog rule or a named check, every catalog rule is exercised by a fault (beyond the few listed here as
not yet), and the lab's verdict table (tests/integration/lab/test_health_lab.py) proves what it claims."""

import re
from pathlib import Path

import yaml

from opsctl.config import parse_config
from opsctl.health.catalog import load_catalog
from opsctl_lab import fault_matrix as fm
from opsctl_lab.hardware import FAULTS
from tests.integration.lab.test_health_lab import DRAIN_ROWS, WARN_ROWS

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "health.md"
CONFIG = parse_config({}, "t", {})
RULES = load_catalog(CONFIG)
# Rules that no lab fault exercises yet, and why: a rule that gains a fault leaves this list.
NOT_YET = {
    "node-check-stale": "the lab runs no node-check timer whose stop would age the results",
    "storage-probe-failed": "the lab has no read-only or failing probe directory",
    "nfs-retransmissions": "the lab's /home is not an NFS mount with mountstats",
}


def test_the_docs_show_the_generated_matrix():
    text = DOCS.read_text()
    shown = text[text.index(fm.MARK_BEGIN):text.index(fm.MARK_END) + len(fm.MARK_END)]
    assert shown == fm.markdown(fm.rows(RULES, CONFIG)), "regenerate: python -m opsctl_lab.fault_matrix docs/health.md"
    assert f"Not exercised yet: {', '.join(f'`{r}`' for r in NOT_YET)}." in text


def test_every_fault_is_seen_by_a_rule_or_a_named_check():
    assert [name for name, spec in FAULTS.items() if not spec.seen_by] == []
    assert fm.unknown_detectors(RULES) == {}


def test_every_rule_is_exercised_by_a_fault_but_those_not_yet():
    assert fm.unexercised(RULES) == list(NOT_YET)


def test_a_fault_that_names_an_unknown_check_or_a_rule_without_a_fault_is_found():
    """The checks above can fail: a made-up detector and a rule the faults never name are reported."""
    spec = FAULTS["thermal"]
    try:
        FAULTS["thermal"] = type(spec)(**{**spec.__dict__, "seen_by": ("no-such-rule",)})
        assert fm.unknown_detectors(RULES) == {"thermal": ["no-such-rule"]}
        assert {"gpu-temp-high", "clocks-hw-slowdown"} <= set(fm.unexercised(RULES))
    finally:
        FAULTS["thermal"] = spec


def test_the_lab_verdict_table_proves_what_the_matrix_claims():
    for fault, *_, rule in DRAIN_ROWS + WARN_ROWS:
        name = fault.split(":")[0]
        seen = FAULTS[name].seen_by
        assert rule in seen or (fm.XID_RULES in seen and re.fullmatch(r"xid-\d+", rule)), (fault, rule)


def _seen(config) -> dict:
    """(fault, seen by) -> seen within, of the rows built with config."""
    return {(r.fault, r.seen_by): r.seen for r in fm.rows(load_catalog(config), config)}


def test_the_time_to_see_is_the_hold_and_a_scrape_either_side_and_the_node_checks_interval_where_it_reads_it():
    seen = _seen(CONFIG)  # 30 s scrapes, a node check every minute
    assert seen[("dbe", "`ecc-dbe-new`")] == "1m"  # at the event: its 10m hold is how long a DBE counts
    assert seen[("sbe-storm", "`sbe-storm`")] == "6m"  # hold 5m
    assert seen[("mig-on", "`mig-enabled`")] == "2m"  # hold 1m
    assert seen[("xid:<code>", "`xid-<code>`")] == "1m"  # at the event, from DCGM
    assert seen[("xid-kernel:<code>", "`xid-<code>`")] == "2m"  # from the kernel log, by the node check
    assert seen[("nvlink-down:<link>", "`nvlink-down`")] == "3m"  # the node check's nvidia-smi nvlink -s
    assert seen[("nvlink-slow", "`validate`")] == "2m"  # from the validation's end, not the node check's timer
    assert seen[("exporter-down", "data")] == "-"
    fast = _seen(parse_config({"prometheus": {"scrape_interval": "5s"}}, "t", {}))
    assert fast[("mig-on", "`mig-enabled`")] == "20s"  # its hold, two scrapes (the floor), and a scrape either side


def test_the_matrix_node_check_interval_is_the_roles_default():
    defaults = yaml.safe_load((REPO / "playbooks/roles/node_check/defaults/main.yml").read_text())
    interval = defaults["node_check_interval"]  # systemd.time(7): "1min"
    value, unit = re.fullmatch(r"(\d+)\s*(s|sec|min|m|h)", interval).groups()
    assert int(value) * {"s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}[unit] == fm.NODE_CHECK_INTERVAL_S
