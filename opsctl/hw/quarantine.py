"""`opsctl hw quarantine`: provisioning's hardware check of the Slurm nodes, run on the head node.

slurm.conf gives each node the hardware it reported (playbooks/filter_plugins/slurm_nodes.py): the nodes
that fit their group's profile share one NodeName= line, and a node that differs (a GPU off the bus,
missing memory, an HCA gone) gets a line of its own. The slurm_compute role then hands this check what
differs (a JSON object, node -> why it differs, "" for a node that fits; in a file or on stdin), and it:

- drains every node that differs, with the reason `opsctl:hw-mismatch <why>`, through `drain_findings`
  (the run lock, ownership, the drain budget, the out-of-service limit, compare and set, one audit
  record each): a drain someone else set is never touched;
- resumes every node that fits again and whose drain is this check's own, and no other;
- stops before either when more than safety.breaker_fraction of the nodes differ: a profile that does
  not fit the cluster, or a change that reached every node (a driver rollout), not the nodes.
"""

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from opsctl.actor.result import ActionResult
from opsctl.clients import Clients
from opsctl.config.schema import Config
from opsctl.errors import SourceUnavailable
from opsctl.health.findings import failing_check, quarantine_outcome, shared_cause
from opsctl.slurm import Slurm

RULE = "hw-mismatch"
FITS = "the hardware fits its group's profile again"


@dataclass
class HwQuarantine:
    mismatches: dict[str, str]  # node -> why its hardware differs ("" when it fits), as read
    differing: dict[str, str]  # the nodes that differ, sorted by name
    action: ActionResult  # what was drained and resumed (with --dry-run: would be), refused, skipped


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


def quarantine(clients: Clients, results: str, dry_run: bool) -> HwQuarantine:
    """Read what differs from `results` (a path, or '-' for stdin) and decide for every node."""
    mismatches = read_mismatches(results)
    action = decide(clients.config(acting=not dry_run), clients.slurm(), mismatches, dry_run)
    differing = {node: why for node, why in sorted(mismatches.items()) if why}
    return HwQuarantine(mismatches=mismatches, differing=differing, action=action)
