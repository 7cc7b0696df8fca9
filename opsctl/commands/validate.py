"""`opsctl validate --idle`: one sweep (opsctl.validate.sweep); `opsctl validate --preflight N`: a preflight
(opsctl.validate.preflight). Then `opsctl health --drain` over the nodes validated, so that a failure is
drained by the path every drain takes.

Exit codes: 0 every validated node passed (--preflight: N good nodes handed over, whatever failed among
the others), 1 a node failed or was not checked (--preflight: fewer than N good nodes), 2 usage or config
error, 3 Slurm or Prometheus unreadable, 4 the health run's safety stop.
"""

import getpass
import json
import os
import re
import time
from dataclasses import dataclass

import click

from opsctl.clients import Clients
from opsctl.commands.render import JSON_SCHEMA, render_json, render_table
from opsctl.errors import ExitCode, worst
from opsctl.health.run import RunOptions, run_health
from opsctl.slurm.hostlist import hostlist_expression
from opsctl.validate.preflight import Preflight, default_spares, run_preflight
from opsctl.validate.sweep import Sweep, run_sweep

RESERVATION_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class PreflightRequest:
    wanted: int
    reservation: str | None
    users: tuple[str, ...]
    spares: int | None


def validate(clients: Clients, idle: bool, preflight: PreflightRequest | None, scope: str | None, dry_run: bool,
             as_json: bool) -> ExitCode:
    if idle == (preflight is not None):
        raise click.UsageError("say what to validate, one of: --idle (the idle GPU nodes, as Slurm jobs) or "
                               "--preflight N (N good nodes for a large run)")
    config = clients.config(acting=not dry_run)
    names = clients.slurm().expand(scope) if scope else None
    found: Preflight | None = None
    if preflight is not None:
        reservation = preflight.reservation or f"opsctl-preflight-{int(time.time())}"
        if not RESERVATION_NAME.fullmatch(reservation):
            raise click.UsageError(f"--reservation {reservation!r}: letters, digits, _ . - only")
        users = list(preflight.users) or [os.environ.get("SUDO_USER") or getpass.getuser()]
        spares = default_spares(preflight.wanted) if preflight.spares is None else preflight.spares
        found = run_preflight(config, clients.slurm(), clients.jobs(), clients.prom(), preflight.wanted, names,
                              reservation, users, spares, dry_run, warn=lambda line: click.echo(line, err=True))
        sweep = found.sweep
        code = ExitCode.OK if dry_run or len(found.handed_over) == preflight.wanted else ExitCode.FAILING
    else:
        sweep = run_sweep(config, clients.slurm(), clients.jobs(), clients.prom(), names, dry_run)
        code = ExitCode.FAILING if any(v.result in ("fail", "not-checked") for v in sweep.nodes.values()) \
            else ExitCode.OK
    result = None
    if sweep.validated:
        options = RunOptions(drain=True, scope=",".join(sweep.validated))
        result = run_health(config, options, clients.fresh_prom(), clients.slurm())
        # A preflight answers "are N good nodes yours": the failures it found and drained do not change that.
        health = result.exit_code if found is None or result.exit_code != ExitCode.FAILING else ExitCode.OK
        code = worst(code, health)
    if as_json:
        out = {"schema": JSON_SCHEMA, "nodes": _rows(sweep),
               "health": json.loads(render_json(result)) if result else None}
        if found is not None:
            out["preflight"] = _preflight_json(found)
        click.echo(json.dumps(out, indent=1))
    else:
        for row in _rows(sweep):
            click.echo(f"{row['node']:10} {row['job'] or '-':8} {row['result']:24} {row['detail']}".rstrip())
        if found is not None and not dry_run:
            click.echo(_handed_over_line(found))
        if result is not None:
            click.echo(render_table(result, False))
    return code


def _rows(sweep: Sweep) -> list[dict]:
    return [{"node": v.node, "job": v.job, "result": v.result, "detail": v.detail} for v in sweep.nodes.values()]


def _handed_over_line(found: Preflight) -> str:
    if not any(v.job for v in found.sweep.nodes.values()):
        return "preflight: no idle GPU node to reserve, nothing validated"
    if not found.handed_over:
        return f"preflight: no good node, reservation {found.reservation} deleted"
    return (f"preflight: reservation {found.reservation}: {','.join(hostlist_expression(found.handed_over))} "
            f"({len(found.handed_over)} of {found.wanted} asked)")


def _preflight_json(found: Preflight) -> dict:
    return {"reservation": found.reservation, "wanted": found.wanted, "handed_over": found.handed_over,
            "rounds": found.rounds,
            "rails": [{"node": f.node, "hca": f.hca, "verdict": f.verdict,
                       "evidence": [{"peer": peer, "busbw_gbps": round(gbps, 2)} for peer, gbps in f.evidence]}
                      for f in found.rails]}
