"""`opsctl validate --idle`: one sweep (opsctl.validate.sweep); `opsctl validate --preflight N`: a preflight
(opsctl.validate.preflight). Then `opsctl health --drain` over the nodes validated, so that a failure is
drained by the path every drain takes (opsctl.validate.run); this checks the usage and renders.

Exit codes: 0 every validated node passed (--preflight: N good nodes handed over, whatever failed among
the others), 1 a node failed or was not checked (--preflight: fewer than N good nodes), 2 usage or config
error, 3 Slurm or Prometheus unreadable, 4 the health run's safety stop.
"""

import getpass
import json
import os
import re
import time
from dataclasses import replace
from typing import Any

import click

from opsctl.clients import Clients
from opsctl.commands.render import JSON_SCHEMA, render_json, render_table
from opsctl.errors import ExitCode
from opsctl.validate.preflight import Preflight
from opsctl.validate.run import PreflightRequest
from opsctl.validate.run import validate as run_validate
from opsctl.validate.sweep import Sweep

__all__ = ["PreflightRequest", "validate"]

RESERVATION_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def validate(clients: Clients, idle: bool, preflight: PreflightRequest | None, scope: str | None, dry_run: bool,
             as_json: bool) -> ExitCode:
    if idle == (preflight is not None):
        raise click.UsageError("say what to validate, one of: --idle (the idle GPU nodes, as Slurm jobs) or "
                               "--preflight N (N good nodes for a large run)")
    if preflight is not None:
        reservation = preflight.reservation or f"opsctl-preflight-{int(time.time())}"
        if not RESERVATION_NAME.fullmatch(reservation):
            raise click.UsageError(f"--reservation {reservation!r}: letters, digits, _ . - only")
        users = preflight.users or (os.environ.get("SUDO_USER") or getpass.getuser(),)
        preflight = replace(preflight, reservation=reservation, users=users)
    result = run_validate(clients, preflight, scope, dry_run, warn=lambda line: click.echo(line, err=True))
    found, health = result.preflight, result.health
    if as_json:
        out: dict[str, Any] = {"schema": JSON_SCHEMA, "nodes": _rows(result.sweep),
                               "health": json.loads(render_json(health)) if health else None}
        if found is not None:
            out["preflight"] = _preflight_json(found)
        click.echo(json.dumps(out | result.action.fields(), indent=1))
    else:
        for row in _rows(result.sweep):
            click.echo(f"{row['node']:10} {row['job'] or '-':8} {row['result']:24} {row['detail']}".rstrip())
        if found is not None and not dry_run:
            click.echo(_handed_over_line(found))
        if health is not None:
            click.echo(render_table(health, False))
    return result.exit_code


def _rows(sweep: Sweep) -> list[dict[str, Any]]:
    return [{"node": v.node, "job": v.job, "result": v.result, "detail": v.detail} for v in sweep.nodes.values()]


def _handed_over_line(found: Preflight) -> str:
    if not any(v.job for v in found.sweep.nodes.values()):
        return "preflight: no idle GPU node to reserve, nothing validated"
    if not found.handed_over:
        return f"preflight: no good node, reservation {found.reservation} deleted"
    return (f"preflight: reservation {found.reservation}: {found.handed_over_hostlist} "
            f"({len(found.handed_over)} of {found.wanted} asked)")


def _preflight_json(found: Preflight) -> dict[str, Any]:
    return {"reservation": found.reservation, "wanted": found.wanted, "handed_over": found.handed_over,
            "rounds": found.rounds,
            "rails": [{"node": f.node, "hca": f.hca, "verdict": f.verdict,
                       "evidence": [{"peer": peer, "busbw_gbps": round(gbps, 2)} for peer, gbps in f.evidence]}
                      for f in found.rails]}
