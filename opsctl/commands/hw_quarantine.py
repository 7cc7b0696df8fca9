"""`opsctl hw quarantine`: provisioning's hardware check of the Slurm nodes, run on the head node.

slurm.conf gives each node the hardware it reported (playbooks/filter_plugins/slurm_nodes.py): the nodes
that fit their group's profile share one NodeName= line, and a node that differs (a GPU off the bus,
missing memory, an HCA gone) gets a line of its own. The slurm_compute role then hands this command what
differs (a JSON object, node -> why it differs, "" for a node that fits; in a file or on stdin), and it:

- drains every node that differs, with the reason `opsctl:hw-mismatch <why>`, through `drain_findings`
  (the run lock, ownership, the drain budget, the out-of-service limit, compare and set, one audit
  record each): a drain someone else set is never touched;
- resumes every node that fits again and whose drain is this check's own, and no other;
- stops before either when more than safety.breaker_fraction of the nodes differ: a profile that does
  not fit the cluster, or a change that reached every node (a driver rollout), not the nodes.

Exit codes: 0 every node fits (a node may have been resumed), 1 a node differs (drained), 2 usage or
config error, 3 the input (or Slurm) could not be read, 4 a safety stop: the breaker (nothing drained)
or a drain limit of `opsctl health --drain`.
"""

import json
import sys
import time
from pathlib import Path

import click

from opsctl.clients import Clients
from opsctl.commands.render import JSON_SCHEMA
from opsctl.config.schema import Config
from opsctl.errors import ExitCode, SourceUnavailable
from opsctl.health.findings import failing_check, quarantine_outcome, shared_cause
from opsctl.actor.result import ActionResult
from opsctl.slurm import Slurm

RULE = "hw-mismatch"
FITS = "the hardware fits its group's profile again"


def read_mismatches(path: str) -> dict[str, str]:
    """node -> why its hardware differs ("" when it fits), from a JSON object in PATH or on stdin ('-')."""
    try:
        raw = json.loads(sys.stdin.read() if path == "-" else Path(path).read_text())
    except OSError as err:
        raise SourceUnavailable(f"cannot read the hardware findings {path}: {err.strerror}") from err
    except ValueError as err:
        raise SourceUnavailable(f"the hardware findings in {path} are not JSON: {err}") from err
    if not isinstance(raw, dict) or not raw or not all(isinstance(v, str) for v in raw.values()):
        raise SourceUnavailable(f"the hardware findings in {path} must be a JSON object: node -> why it differs "
                                "(\"\" when it fits)")
    return raw


def decide(config: Config, slurm: Slurm, mismatches: dict[str, str], dry_run: bool,
           now: float | None = None) -> ActionResult:
    now = time.time() if now is None else now
    found = {node: [failing_check(RULE, "", why)] for node, why in sorted(mismatches.items()) if why}
    stop = shared_cause(len(found), len(mismatches), config.safety.breaker_fraction,
                        "their group's hardware profile", "in the profile or in what all of them share")
    fitting = sorted(node for node, why in mismatches.items() if not why)
    return quarantine_outcome(config, slurm, found, fitting, stop, RULE, FITS, dry_run, now)


def quarantine(clients: Clients, results: str, as_json: bool, dry_run: bool) -> ExitCode:
    mismatches = read_mismatches(results)
    outcome = decide(clients.config(acting=not dry_run), clients.slurm(), mismatches, dry_run)
    differing = {node: why for node, why in sorted(mismatches.items()) if why}
    if as_json:
        click.echo(json.dumps({"schema": JSON_SCHEMA, "tested": sorted(mismatches), "mismatch": differing,
                               "drained": outcome.drained, "resumed": outcome.resumed, "dry_run": dry_run,
                               "stop": outcome.stop, "actions": outcome.lines}, indent=1))
    else:
        for node, why in differing.items():
            click.echo(f"hw-mismatch {node}: {why}")
        click.echo("\n".join(outcome.lines) if outcome.lines else "nothing to drain or resume")
        click.echo(f"{len(mismatches)} node(s) checked: {len(mismatches) - len(differing)} fit, "
                   f"{len(differing)} differ")
    return outcome.exit_code
