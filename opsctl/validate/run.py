"""`opsctl validate`: one sweep of the idle GPU nodes (sweep) or a preflight of N good nodes (preflight), then
`opsctl health --drain` over the nodes validated, so that a failure is drained by the path every drain takes;
and `opsctl node validate`'s writes beside the node's own checks. The commands render the results.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from opsctl.actor.result import ActionResult
from opsctl.clients import Clients
from opsctl.errors import ExitCode, worst
from opsctl.health.run import RunOptions, RunResult, run_health
from opsctl.nodecheck import write_textfile
from opsctl.validate.node import Validation, metrics_text, pairs_metrics_text, pairs_textfile, validate_node
from opsctl.validate.preflight import Preflight, default_spares, run_preflight
from opsctl.validate.sweep import Sweep, run_sweep


@dataclass(frozen=True)
class PreflightRequest:
    wanted: int
    reservation: str | None  # None: opsctl-preflight-<time>
    users: tuple[str, ...]  # () : the caller
    spares: int | None  # None: default_spares(wanted)


@dataclass
class ValidateResult:
    sweep: Sweep
    preflight: Preflight | None  # with --preflight
    health: RunResult | None  # the health run over the validated nodes (None: none was validated)
    action: ActionResult  # what that health run drained, refused and skipped
    exit_code: ExitCode


def validate(clients: Clients, preflight: PreflightRequest | None, scope: str | None, dry_run: bool,
             warn: Callable[[str], None]) -> ValidateResult:
    """A preflight when `preflight` is given (its reservation, users and spares filled in), else a sweep of the
    idle GPU nodes of `scope`; then the health run that drains what failed."""
    config = clients.config(acting=not dry_run)
    names = clients.slurm().expand(scope) if scope else None
    found: Preflight | None = None
    if preflight is not None:
        assert preflight.reservation is not None and preflight.users
        spares = default_spares(preflight.wanted) if preflight.spares is None else preflight.spares
        found = run_preflight(config, clients.slurm(), clients.jobs(), clients.prom(), preflight.wanted, names,
                              preflight.reservation, list(preflight.users), spares, dry_run, warn=warn)
        sweep = found.sweep
        code = ExitCode.OK if dry_run or len(found.handed_over) == preflight.wanted else ExitCode.FAILING
    else:
        sweep = run_sweep(config, clients.slurm(), clients.jobs(), clients.prom(), names, dry_run)
        code = ExitCode.FAILING if any(v.result in ("fail", "not-checked") for v in sweep.nodes.values()) \
            else ExitCode.OK
    result = None
    action = ActionResult()
    if sweep.validated:
        options = RunOptions(drain=True, scope=",".join(sweep.validated))
        result = run_health(config, options, clients.fresh_prom(), clients.slurm())
        action = result.action
        # A preflight answers "are N good nodes yours": the failures it found and drained do not change that.
        health = result.exit_code if found is None or result.exit_code != ExitCode.FAILING else ExitCode.OK
        code = worst(code, health)
    return ValidateResult(sweep=sweep, preflight=found, health=result, action=action, exit_code=code)


def node_validate(clients: Clients, textfile: str | None) -> Validation:
    """This node's active checks, written to the textfile directory when given."""
    validation = validate_node(clients.config())
    if textfile:
        write_textfile(Path(textfile), metrics_text(validation))
    return validation


def record_pairs(textfile: str, failed: list[str]) -> None:
    """What `opsctl validate --preflight` found on this node's rails (`failed`: its failed HCAs, none when
    they passed), written beside the node's own results."""
    write_textfile(pairs_textfile(Path(textfile)), pairs_metrics_text(failed, time.time()))
