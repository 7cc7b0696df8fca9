"""The record behind `opsctl health --changes-only` (rendered by opsctl/commands/changes.py): the verdicts of
the last complete run of each kind, in the state directory through the ledger. Only a complete run (exit 0
or 1) replaces the record; a run that fails writes nothing.
"""

import time
from typing import Any

from opsctl.actor.ledger import Ledger
from opsctl.errors import ExitCode
from opsctl.health.evaluate import NodeVerdict
from opsctl.health.run import RunResult

RECORD_SCHEMA = 1
COMPLETE = (ExitCode.OK, ExitCode.FAILING)


def run_kind(drain: bool, resume: bool, dry_run: bool, scope: str | None) -> str:
    """'drain', 'drain resume', 'drain dry-run', 'read-only', '... nodes=gpu[001-008]'."""
    drain = drain or (dry_run and not resume)  # --dry-run alone shows the drain plan
    flags = [name for name, on in (("drain", drain), ("resume", resume), ("dry-run", dry_run)) if on]
    kind = " ".join(flags) or "read-only"
    return f"{kind} nodes={scope}" if scope else kind


def signature(verdict: NodeVerdict) -> dict[str, Any] | None:
    """What a change is measured by: the status and the checks that are not ok (rule, device, status),
    never the values, which move every run. None for a plainly ok node."""
    checks = sorted(" ".join(p for p in (c.id, c.device, c.status) if p) for c in verdict.checks
                    if c.status != "handled")
    if verdict.status == "ok" and not checks:
        return None
    return {"status": verdict.status, "checks": checks}


def verdict_record(result: RunResult) -> dict[str, Any]:
    nodes = {name: sig for name, verdict in result.report.nodes.items() if (sig := signature(verdict))}
    return {"schema": RECORD_SCHEMA, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(result.started)),
            "nodes": nodes}


class ChangeLog:
    """The record of one kind of run: read before the run (so an unreadable one stops it before it acts),
    replaced after a complete run."""

    def __init__(self, ledger: Ledger, kind: str):
        self.ledger, self.kind = ledger, kind
        self.previous: dict[str, Any] | None = None

    def read(self) -> None:
        self.previous = self.ledger.state.last_runs.get(self.kind)

    def keep(self, result: RunResult) -> None:
        if result.exit_code in COMPLETE:
            self.previous = verdict_record(result)
            self.ledger.save_last_run(self.kind, self.previous)
