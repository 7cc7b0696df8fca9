"""Text for people (a table) and for programs (JSON) from one health run. Returns strings; the CLI echoes.

JSON contract (docs/health.md): {"nodes": [{"node", "status", "checks": [{"id", "severity", "status",
"gpu"|"hca", "value", "threshold", "evidence"}], "action"}], "summary": {...}}.
"""

import json
import math
import time

from opsctl.health.evaluate import Check, NodeVerdict

JSON_SCHEMA = 1


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
        "drained": actions.count("drain"),
        "would_drain": actions.count("would-drain"),
        "resumed": actions.count("resume"),
        "would_resume": actions.count("would-resume"),
        "escalated": actions.count("escalate"),
        "would_escalate": actions.count("would-escalate"),
        "skipped": sum(1 for a in actions if a.startswith("skip:")),
        "safety_stop": result.plan.stop or None,
        "warnings": list(result.report.warnings),
        "dry_run": result.options.dry_run,
        "queries": result.report.queries,
        "query_seconds": round(result.report.query_seconds, 4),
        "seconds": round(result.seconds, 4),
        "exit_code": int(result.exit_code),
    }


def node_json(verdict: NodeVerdict, action: str = "none") -> dict:
    return {"node": verdict.node, "status": verdict.status, "in_slurm": verdict.in_slurm,
            "checks": [check_json(c) for c in verdict.checks], "action": action}


def render_json(result) -> str:
    nodes = [node_json(v, result.plan.action(v.node)) for v in result.report.nodes.values()]
    return json.dumps({"nodes": nodes, "summary": summary(result)}, indent=1)


def render_table(result, all_nodes: bool = False) -> str:
    """Nodes that are not plainly ok (or all with all_nodes), then a one-line summary."""
    rows = [("NODE", "STATUS", "ACTION", "EVIDENCE")]
    for verdict in result.report.nodes.values():
        action = result.plan.action(verdict.node)
        if not all_nodes and verdict.status == "ok" and action == "none" and verdict.in_slurm:
            continue
        shown = [c for c in verdict.checks if c.status != "handled"] or verdict.checks
        evidence = "; ".join(f"{c.id} {c.evidence}" for c in shown[:3])
        if len(shown) > 3:
            evidence += f"; +{len(shown) - 3} more"
        name = verdict.node if verdict.in_slurm else f"{verdict.node} (not in Slurm)"
        rows.append((name, verdict.status, action, evidence))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{r[0]:{widths[0]}}  {r[1]:{widths[1]}}  {r[2]:{widths[2]}}  {r[3]}".rstrip() for r in rows]
    s = summary(result)
    tail = (f"{s['nodes']} nodes: {s['ok']} ok, {s['warn']} warn, {s['fail']} fail, {s['unknown']} unknown"
            f"; {s['queries']} queries in {s['query_seconds']:.2f}s")
    acted = [f"{s[k]} {k.replace('_', ' ')}" for k in ("drained", "would_drain", "resumed", "would_resume",
                                                       "escalated", "would_escalate") if s[k]]
    if acted:
        tail += "; " + ", ".join(acted)
    if s["safety_stop"]:
        tail += f"\nsafety stop: {s['safety_stop']}"
    for warning in s["warnings"]:
        tail += f"\nwarning: the source may have answered partially, nothing was changed: {warning}"
    if len(rows) == 1:
        return tail
    return "\n".join(lines) + "\n" + tail


def render_history(records: list[dict]) -> str:
    rows = [("TIME", "USER", "EVENT", "NODE", "DETAIL")]
    for r in records:
        # A refusal says why (detail) and what reason was on the node; a change says the reason it set.
        why, reason = r.get("detail") or "", r.get("reason") or ""
        detail = f"{why}; reason: {reason}" if why and reason else why or reason
        if r.get("dry_run"):
            detail = f"[dry-run] {detail}"
        rows.append((r.get("time", ""), r.get("user", ""), r.get("event", ""), r.get("node", ""), detail))
    widths = [max(len(str(r[i])) for r in rows) for i in range(4)]
    return "\n".join(f"{r[0]:{widths[0]}}  {r[1]:{widths[1]}}  {r[2]:{widths[2]}}  {r[3]:{widths[3]}}  {r[4]}".rstrip()
                     for r in rows)


def render_nodes(nodes) -> str:
    rows = [("NODE", "STATE", "FLAGS", "OWNER", "REASON")]
    for node in nodes.values():
        rows.append((node.name, node.state, ",".join(node.flags) or "-", node.owner or "-", node.reason))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(f"{r[0]:{widths[0]}}  {r[1]:{widths[1]}}  {r[2]:{widths[2]}}  {r[3]:{widths[3]}}  {r[4]}".rstrip()
                     for r in rows)
