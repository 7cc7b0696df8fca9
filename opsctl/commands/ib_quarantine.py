"""`opsctl ib quarantine`: the provisioning-time InfiniBand precheck's decision, run on the head node
(opsctl/ib/quarantine.py says what it drains, resumes and when it stops); this renders it.

Exit codes: 0 every node passes (a node may have been resumed), 1 a node fails (quarantined), 2 usage
or config error, 3 the reports (or Slurm) could not be read, 4 a safety stop: the shared-cause breaker
or a drain limit of `opsctl health --drain`; nothing was drained for the breaker.
"""

import json

import click

from opsctl.clients import Clients
from opsctl.commands.render import JSON_SCHEMA
from opsctl.errors import ExitCode
from opsctl.ib.quarantine import findings
from opsctl.ib.quarantine import quarantine as decide_quarantine


def quarantine(clients: Clients, results: str, as_json: bool, dry_run: bool) -> ExitCode:
    found = decide_quarantine(clients, results, dry_run)
    outcome = found.action
    if as_json:
        click.echo(json.dumps({"schema": JSON_SCHEMA, "tested": sorted(found.reports), "quarantine": found.failing,
                               "passed": found.passed, "drained": outcome.drained, "resumed": outcome.resumed,
                               "dry_run": dry_run, "stop": outcome.stop, "actions": outcome.lines,
                               **outcome.fields()}, indent=1))
    else:
        for node in found.failing:
            click.echo(f"quarantine {node}: " + "; ".join(c.evidence for c in findings(found.reports[node])))
        click.echo("\n".join(outcome.lines) if outcome.lines else "nothing to drain or resume")
        click.echo(f"{len(found.reports)} node(s) tested: {len(found.passed)} pass, {len(found.failing)} fail")
    return outcome.exit_code
