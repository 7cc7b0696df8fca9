"""Text for people (a table) and for programs (JSON) from one health run. Returns strings; the CLI echoes.

JSON contract (docs/health.md): {"nodes": [{"node", "status", "checks": [{"id", "severity", "status",
"gpu"|"hca"|"mount"|"target"|"nid"|"firmware"|"nvlink"|"pcie"|"nvswitch", "value", "threshold", "evidence"}],
"action"}], "summary": {...}}.
"""

import json
import math
import time
from collections.abc import Sequence

from opsctl.exit import JSON_SCHEMA
from opsctl.health.evaluate import Check, NodeVerdict


def iso_time(unix: float | None = None) -> str:
    """UTC, to the second: 2026-12-01T01:11:22Z."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if unix is None else unix))


def _number(value):
    if value is None:
        return None
    if not math.isfinite(value):
        return str(value).replace("inf", "Inf").replace("nan", "NaN")  # JSON has no NaN: "NaN", "+Inf", "-Inf"
    return int(value) if float(value).is_integer() and abs(value) < 1e15 else value


def check_json(check: Check) -> dict:
    entry = {"id": check.id, "severity": check.severity, "status": check.status}
    if check.kind:
        entry[check.kind] = check.device
    entry.update(value=_number(check.value), threshold=_number(check.threshold), evidence=check.evidence)
    return entry


def out_of_service(cluster) -> dict:
    """The judged nodes out of service: drained (DRAIN, draining too) or down (DOWN, FAIL, NOT_RESPONDING,
    MAINT, ...), and whose they are: opsctl's automatic drains, `opsctl drain` by hand, or others (a
    person's scontrol, Slurm itself)."""
    out = [n for n in cluster.values() if n.out_of_service]
    return {
        "drained": sum(1 for n in out if n.drained),
        "down": sum(1 for n in out if not n.drained),
        "opsctl_auto": sum(1 for n in out if n.owned and not n.manual),
        "opsctl_manual": sum(1 for n in out if n.manual),
        "others": sum(1 for n in out if not n.owned),
    }


def summary(result) -> dict:
    nodes = result.report.nodes.values()
    count = {s: sum(1 for v in nodes if v.status == s) for s in ("ok", "warn", "fail", "unknown")}
    actions = [result.plan.action(v.node) for v in nodes]
    return {
        "schema": JSON_SCHEMA,
        "time": iso_time(result.started),
        "nodes": len(result.report.nodes),
        **count,
        "not_in_slurm": sum(1 for v in nodes if not v.in_slurm),
        "out_of_service": out_of_service(result.cluster),
        "drained": actions.count("drain"),
        "would_drain": actions.count("would-drain"),
        "resumed": actions.count("resume"),
        "would_resume": actions.count("would-resume"),
        "escalated": actions.count("escalate"),
        "would_escalate": actions.count("would-escalate"),
        "skipped": sum(1 for a in actions if a.startswith("skip:")),
        "safety_stop": result.plan.stop or None,
        "outage": result.plan.outage or None,
        "breaker": breaker_json(result.plan.counted),
        "warnings": list(result.report.warnings),
        "dry_run": result.options.dry_run,
        "queries": result.report.queries,
        "rule_results": result.report.rule_results,
        "rule_results_note": result.report.rule_results_note or None,
        "query_seconds": round(result.report.query_seconds, 4),
        "seconds": round(result.seconds, 4),
        "exit_code": int(result.exit_code),
    }


def breaker_json(counted) -> dict | None:
    """What the circuit breaker counted over every judged node (opsctl.health.plan.BreakerCount), or None
    in a run that planned no drains."""
    if counted is None:
        return None
    return {"failing": counted.failing, "pending": counted.pending, "ladder": counted.ladder,
            "limit": _number(counted.limit)}


def node_json(verdict: NodeVerdict, action: str = "none", eligible_at: float | None = None) -> dict:
    entry = {"node": verdict.node, "status": verdict.status, "in_slurm": verdict.in_slurm,
             "checks": [check_json(c) for c in verdict.checks], "action": action}
    if verdict.pending:
        entry["pending"] = [check_json(c) for c in verdict.pending]
    if eligible_at is not None:
        entry["eligible_at"] = iso_time(eligible_at)
    return entry


def _eligible_at(result, node: str) -> float | None:
    decision = result.plan.decisions.get(node)
    return decision.eligible_at if decision else None


def _waiting(result, node: str) -> str:
    """'resume eligible at 2026-12-01T01:20:00Z (in 4m10s)' for a node that waits out its healthy period."""
    at = _eligible_at(result, node)
    if at is None:
        return ""
    left = max(0, round(at - result.started))
    return f"resume eligible at {iso_time(at)} (in {left // 60}m{left % 60:02d}s)"


def render_json(result) -> str:
    nodes = [node_json(v, result.plan.action(v.node), _eligible_at(result, v.node))
             for v in result.report.nodes.values()]
    return json.dumps({"nodes": nodes, "summary": summary(result), **result.action.fields()}, indent=1)


def render_table(result, all_nodes: bool = False) -> str:
    """Nodes that are not plainly ok (or all with all_nodes), then a one-line summary."""
    rows = [("NODE", "STATUS", "ACTION", "EVIDENCE")]
    outage = set(result.plan.outage_nodes)
    if outage:
        # One row for a shared outage: the breaker's line names what failed, the nodes are all of them.
        rows.append((result.plan.outage, "fail", "skip:circuit-breaker", f"{len(outage)} nodes"))
    for verdict in result.report.nodes.values():
        action = result.plan.action(verdict.node)
        if not all_nodes and verdict.status == "ok" and action == "none" and verdict.in_slurm:
            continue
        if verdict.node in outage and not all_nodes:
            continue
        evidence = "; ".join([w for w in [_waiting(result, verdict.node), evidence_text(verdict)] if w])
        rows.append((node_name(verdict), verdict.status, action, evidence))
    tail = "\n".join(summary_lines(result))
    if len(rows) == 1:
        return tail
    return table(rows) + "\n" + tail


def node_name(verdict: NodeVerdict) -> str:
    return verdict.node if verdict.in_slurm else f"{verdict.node} (not in Slurm)"


def evidence_text(verdict: NodeVerdict) -> str:
    """'xid-79 gpu3 xid=79 count=1; ib-down ...': the first three checks that are not handled (or the
    handled ones when there is nothing else), then how many more."""
    shown = [c for c in verdict.checks if c.status != "handled"] or verdict.checks
    text = "; ".join(f"{c.id} {c.evidence}" for c in shown[:3])
    if len(shown) > 3:
        text += f"; +{len(shown) - 3} more"
    return text


def summary_lines(result) -> list[str]:
    """The summary line of a run, then a line for a safety stop and one per warning."""
    s = summary(result)
    tail = (f"{s['nodes']} nodes: {s['ok']} ok, {s['warn']} warn, {s['fail']} fail, {s['unknown']} unknown"
            + _out_of_service_text(s["out_of_service"]) + f"; {s['queries']} queries in {s['query_seconds']:.2f}s")
    acted = [f"{s[k]} {k.replace('_', ' ')}" for k in ("drained", "would_drain", "resumed", "would_resume",
                                                       "escalated", "would_escalate") if s[k]]
    if acted:
        tail += "; " + ", ".join(acted)
    counted = s["breaker"]
    if counted and (counted["pending"] or counted["ladder"]):
        tail += (f"; breaker counts {counted['failing']} failing, {counted['pending']} pending, "
                 f"{counted['ladder']} on the ladder (limit {counted['limit']:g})")
    lines = [tail]
    if s["safety_stop"]:
        lines.append(f"safety stop: {s['safety_stop']}")
    lines += [f"warning: the source may have answered partially, nothing was changed: {w}" for w in s["warnings"]]
    return lines


def _out_of_service_text(counts: dict) -> str:
    """'; out of service: 3 drained, 1 down (2 by opsctl, 1 by opsctl drain, 1 by others)', or nothing."""
    if not counts["drained"] and not counts["down"]:
        return ""
    whose = [f"{counts[k]} by {who}" for k, who in (("opsctl_auto", "opsctl"), ("opsctl_manual", "opsctl drain"),
                                                    ("others", "others")) if counts[k]]
    return f"; out of service: {counts['drained']} drained, {counts['down']} down ({', '.join(whose)})"


def render_history(records: list[dict]) -> str:
    rows = [("TIME", "USER", "EVENT", "NODE", "CHECKS", "DETAIL")]
    for r in records:
        # A refusal says why (detail) and what reason was on the node; a change says the reason it set.
        why, reason = r.get("detail") or "", r.get("reason") or ""
        detail = f"{why}; reason: {reason}" if why and reason else why or reason
        if r.get("dry_run"):
            detail = f"[dry-run] {detail}"
        checks = ",".join(r.get("checks") or []) or "-"
        rows.append((r.get("time", ""), r.get("user", ""), r.get("event", ""), r.get("node", ""), checks, detail))
    return table(rows)


def render_nodes(nodes) -> str:
    rows = [("NODE", "STATE", "FLAGS", "OWNER", "REASON")]
    for node in nodes.values():
        rows.append((node.name, node.state, ",".join(node.flags) or "-", node.owner or "-", node.reason))
    return table(rows)


def table(rows: Sequence[Sequence[object]]) -> str:
    """Rows as columns two spaces apart, each as wide as its widest cell; the last column is not padded."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join([*(str(cell).ljust(width) for cell, width in zip(row, widths, strict=False)),
                                str(row[-1])]).rstrip() for row in rows)
