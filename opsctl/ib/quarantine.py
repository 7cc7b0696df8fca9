"""`opsctl ib quarantine`: the provisioning-time InfiniBand precheck's decision, run on the head node.

The ib_precheck role runs `opsctl ib check --json` on every GPU node and hands the reports to this
command (a JSON object, node name -> that node's report, in a file or on stdin). It then:

- drains every node whose report fails, with the reason `opsctl:ib-precheck <check> <hca> ...`, through
  `drain_findings` (the run lock, ownership, the drain budget, the out-of-service limit, compare and
  set, one audit record each): a drain someone else set is never touched;
- resumes every node whose report now passes and whose drain is the precheck's own (its reason starts
  with `opsctl:ib-precheck`), and no other;
- stops before either when the fault is shared (`shared_cause`: more than ib.max_fail_fraction of the
  tested nodes fail), or when every port of every tested node is in INIT: the subnet manager is down,
  not the nodes, so nothing is drained or resumed and the stop line says why.
"""

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opsctl.actor.result import ActionResult
from opsctl.clients import Clients
from opsctl.config.schema import Config
from opsctl.errors import SourceUnavailable
from opsctl.health.evaluate import Check
from opsctl.health.findings import failing_check, quarantine_outcome, shared_cause
from opsctl.slurm import Slurm

RULE = "ib-precheck"


@dataclass
class IbQuarantine:
    reports: dict[str, dict[str, Any]]  # node -> its `opsctl ib check --json` report
    failing: list[str]  # the nodes whose precheck fails (quarantined)
    passed: list[str]
    action: ActionResult  # what was drained and resumed (with --dry-run: would be), refused, skipped


def read_reports(path: str) -> dict[str, dict[str, Any]]:
    """node -> its `opsctl ib check --json` report, from a JSON object in PATH or on stdin ('-')."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        raw = json.loads(text)
    except OSError as err:
        raise SourceUnavailable(f"cannot read the precheck reports {path}: {err.strerror}") from err
    except ValueError as err:
        raise SourceUnavailable(f"the precheck reports in {path} are not JSON: {err}") from err
    if not isinstance(raw, dict) or not raw:
        raise SourceUnavailable(f"the precheck reports in {path} must be a JSON object: node -> report")
    for node, report in raw.items():
        if not isinstance(report, dict) or report.get("verdict") not in ("pass", "fail"):
            raise SourceUnavailable(f"the precheck report of {node} has no verdict (not `opsctl ib check --json`)")
    return raw


def findings(report: dict[str, Any]) -> list[Check]:
    """One failing check per finding: evidence `<check> <hca> <detail>`, so the reason names both."""
    out = [failing_check(RULE, str(f.get("device", "")), f"{f.get('check')} {f.get('device') or 'node'} "
                         f"{f.get('detail', '')}".strip()) for f in report.get("findings", [])]
    return out or [failing_check(RULE, "", "verdict fail")]


def all_ports_init(report: dict[str, Any]) -> bool:
    states = [h.get("state") for h in report.get("hcas", [])]
    return bool(states) and all(state == "INIT" for state in states)


def subnet_manager_stop(reports: dict[str, dict[str, Any]]) -> str:
    """Every port of every tested node in INIT: links trained, but no subnet manager configured them."""
    if reports and all(all_ports_init(r) for r in reports.values()):
        return (f"circuit breaker: every InfiniBand port of the {len(reports)} tested node(s) is in INIT: the "
                "subnet manager is down or unreachable, not the nodes; draining none (start opensm/UFM, then rerun)")
    return ""


def verdicts(reports: dict[str, dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(the nodes whose precheck fails, those that pass)."""
    return (sorted(n for n, r in reports.items() if r["verdict"] == "fail"),
            sorted(n for n, r in reports.items() if r["verdict"] == "pass"))


def decide(config: Config, slurm: Slurm, reports: dict[str, dict[str, Any]], dry_run: bool,
           now: float | None = None) -> ActionResult:
    now = time.time() if now is None else now
    failing, passed = verdicts(reports)
    found = {node: findings(reports[node]) for node in failing}
    stop = subnet_manager_stop(reports)
    if not stop:
        stop = shared_cause(len(found), len(reports), config.ib.max_fail_fraction, "the InfiniBand precheck")
        if stop and sum(all_ports_init(r) for r in reports.values()) * 2 > len(found):
            stop += "; most of them have every port in INIT: is the subnet manager down?"
    return quarantine_outcome(config, slurm, found, passed, stop, RULE, "the InfiniBand precheck passes", dry_run, now)


def quarantine(clients: Clients, results: str, dry_run: bool) -> IbQuarantine:
    """Read the reports of `results` (a path, or '-' for stdin) and decide for every node."""
    reports = read_reports(results)
    action = decide(clients.config(acting=not dry_run), clients.slurm(), reports, dry_run)
    failing, passed = verdicts(reports)
    return IbQuarantine(reports=reports, failing=failing, passed=passed, action=action)
