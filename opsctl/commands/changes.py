"""`opsctl health --changes-only`: what changed since the previous run of the same kind, for a journal.

The opsctl timer runs `opsctl health --drain` every minute; the whole table each minute would bury the
one line that matters. With --changes-only a run prints, each line starting with the run's UTC time
(as --watch lines do):

    2026-12-01T04:31:00Z gpu007 ok -> fail: xid-79 gpu3 xid=79 count=1
    2026-12-01T04:31:00Z drain gpu007: opsctl:xid-79 gpu3 xid=79 count=1
    2026-12-01T04:31:00Z 64 nodes: 63 ok, 0 warn, 1 fail, 0 unknown; 38 queries in 0.04s; 1 drained

- a line per node whose verdict changed: its status, or the rules (and devices) that are not ok. A
  node whose event opsctl acted on reads ok again, with `(handled: ...)`. The first run of a kind
  (no record yet) prints each node that is not ok once: `gpu007 fail: xid-79 ...`;
- a line per action taken (drain, resume, escalate, or their would-* in a dry run) and per refusal
  that the audit log records (nodes refused for the same reason share one line), every run;
- the table's summary line, then its safety-stop and warning lines.

The verdicts live in the state directory (opsctl/health/changes.py, ChangeLog), one record per kind of run (its
--drain, --resume, --dry-run and --nodes), so that a read-only run by hand never hides a change from
the timer. Only a complete run (exit 0 or 1) replaces the record: after a partial answer (exit 3) or
a safety stop (exit 4) the next run compares against the last complete one again, and a run that
fails with an error (exit 2 or 3) prints its one line, as without the flag, and writes nothing.
A partial answer prints no node changes, since they may be artefacts of the missing data.
"""

from typing import Any

from opsctl.commands.render import evidence_text, iso_time, node_name, summary_lines
from opsctl.health.changes import signature
from opsctl.health.plan import Decision, Plan

ACTIONS = ("drain", "resume", "escalate", "would-drain", "would-resume", "would-escalate")


def node_changes(result, previous: dict[str, Any] | None) -> list[str]:
    lines = []
    before: dict[str, Any] = previous["nodes"] if previous is not None else {}
    for name, verdict in result.report.nodes.items():
        now, was = signature(verdict), before.get(name)
        evidence = evidence_text(verdict)
        if previous is None:
            if now is not None:
                lines.append(f"{node_name(verdict)} {verdict.status}: {evidence}")
            continue
        if now == was:
            continue
        line = f"{node_name(verdict)} {was['status'] if was else 'ok'} -> {verdict.status}"
        if now is not None:
            line += f": {evidence}"
        elif evidence:
            line += f" (handled: {evidence})"
        lines.append(line)
    lines += [f"{name} {was['status']} -> gone" for name, was in before.items() if name not in result.report.nodes]
    return lines


def _action_line(decision: Decision) -> str:
    """'drain gpu007: <the reason it sets>', 'resume gpu040: was <the reason it lifts>, ok for 600s'."""
    if decision.reason:
        return f"{decision.action} {decision.node}: {decision.reason}"
    lifted = decision.seen.reason if decision.seen else ""
    return f"{decision.action} {decision.node}: was {lifted}, ok for {decision.healthy_s:.0f}s"


def action_lines(plan: Plan) -> list[str]:
    lines = [_action_line(d) for d in plan.with_action(*ACTIONS)]
    refused: dict[str, list[str]] = {}
    for decision in plan.refusals():
        refused.setdefault(decision.detail, []).append(decision.node)
    return lines + [f"refused {', '.join(nodes)}: {detail}" for detail, nodes in refused.items()]


def render_changes(result, previous: dict[str, Any] | None) -> str:
    lines = [] if result.report.warnings else node_changes(result, previous)
    lines += action_lines(result.plan) + summary_lines(result)
    stamp = iso_time(result.started)
    return "\n".join(f"{stamp} {line}" for line in lines)
