"""`opsctl ib topology`: the fabric from ibnetdiscover, topology.conf, and with --check the cabling drift and
its drains (opsctl/topology/run.py says what it reads, writes and drains); this renders it.

Exit codes: 0 the fabric was read (and topology.conf written), or with --check no change; 1 with --check a
change was found (each named: node, HCA and rail, or the switch); 2 usage or config error; 3 ibnetdiscover,
a saved output, Slurm or the output file could not be read or written (nothing written or drained); 4 a
safety stop: too many nodes drift at once (a recabling or an outdated record), or a limit of `opsctl health
--drain`.
"""

import json
from typing import Any

import click

from opsctl.clients import Clients
from opsctl.commands.render import JSON_SCHEMA
from opsctl.errors import ExitCode
from opsctl.topology.render import BLOCK, TREE
from opsctl.topology.run import Topology
from opsctl.topology.run import topology as read_topology

PLUGINS = {TREE: [TREE], BLOCK: [BLOCK], "both": [TREE, BLOCK]}


def topology(clients: Clients, input_path: str | None, output: str | None, fmt: str, check: bool,
             design: str | None, dry_run: bool, as_json: bool) -> ExitCode:
    if output and check:
        raise click.UsageError("--output accepts the live fabric and --check compares with it: give one")
    if output and fmt == "both":
        raise click.UsageError("a topology.conf holds one plugin's lines: give --format tree or block with --output")
    if (design or dry_run) and not check:
        raise click.UsageError("--design and --dry-run go with --check")
    result = read_topology(clients, input_path, output, PLUGINS[fmt], check, design, dry_run)
    if as_json:
        click.echo(json.dumps(_json(result, check, dry_run), indent=1))
        return result.exit_code
    report = [*_drift_lines(result, check), *result.action.lines, _summary(result, check)]
    if not check and not output:  # stdout is topology.conf itself, to redirect; the rest goes to stderr
        click.echo("\n".join(text.rstrip("\n") for text in result.conf.values()))
        click.echo("\n".join(report), err=True)
    else:
        click.echo("\n".join(report))
    for line in result.warnings:
        click.echo(f"opsctl: warning: {line}", err=True)
    return result.exit_code


def _json(result: Topology, check: bool, dry_run: bool) -> dict[str, Any]:
    fabric = result.fabric
    return {"schema": JSON_SCHEMA, "source": result.source, "nodes": fabric.nodes,
            "blocks": {g.name: g.nodes for g in fabric.leaf_groups()}, "topology": result.conf,
            "output": result.output or None, "check": check, "dry_run": dry_run, "baseline": result.baseline,
            "drift": [{"kind": d.kind, "node": d.node, "hca": d.hca, "rail": d.rail, "switch": d.switch,
                       "action": "drain" if d.drains else "warn", "detail": d.detail} for d in result.drift],
            "not_on_fabric": result.not_on_fabric, "warnings": result.warnings, "fabric": fabric.record(),
            "drained": result.action.drained, "stop": result.action.stop, "actions": result.action.lines,
            **result.action.fields()}


def _drift_lines(result: Topology, check: bool) -> list[str]:
    lines = [f"{'drain' if d.drains and check else 'warn'} {d.kind}: {d.detail}" for d in result.drift]
    if check and not lines:
        lines.append(f"no change against {result.baseline or 'what the live fabric shows of itself'}")
    return lines


def _summary(result: Topology, check: bool) -> str:
    fabric = result.fabric
    groups = ", ".join(f"{g.name} ({len(g.nodes)} nodes)" for g in fabric.leaf_groups())
    summary = (f"{len(fabric.nodes)} nodes, {len(fabric.hcas)} HCAs, {len(fabric.switches)} switches from "
               f"{result.source}; leaf groups: {groups}")
    if result.output:
        summary += f"; wrote {result.output} and accepted this fabric"
    if check:
        summary += f"; checked against {result.baseline or 'the live fabric alone'}"
    return summary
