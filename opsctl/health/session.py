"""What `opsctl health` runs, once or every --watch round: the run itself with a fresh Prometheus client per
round (its query count and warnings are that round's), and with --changes-only the record of the last run
of the same kind, read before the run and replaced after a complete one."""

from opsctl.actor.ledger import Ledger
from opsctl.clients import Clients
from opsctl.errors import ConfigError
from opsctl.health.changes import ChangeLog, run_kind
from opsctl.health.run import RunOptions, RunResult, run_health


class HealthSession:
    def __init__(self, clients: Clients, options: RunOptions, changes_only: bool):
        self.clients, self.options = clients, options
        self.config = clients.config(acting=options.acting)
        self.changes = ChangeLog(Ledger(self.config), run_kind(options.drain, options.resume, options.dry_run,
                                                               options.scope)) if changes_only else None

    def run_once(self) -> RunResult:
        if self.changes is not None:
            self.changes.read()
        return run_health(self.config, self.options, self.clients.fresh_prom(), self.clients.slurm())

    def keep(self, result: RunResult) -> None:
        """The record of a complete run, after its lines were printed (a full disk loses no line)."""
        if self.changes is not None:
            self.changes.keep(result)


def check_changes_only(changes_only: bool, as_json: bool, all_nodes: bool) -> None:
    if changes_only and (as_json or all_nodes):
        raise ConfigError("--changes-only prints what changed since the last run, not every node: "
                          "leave out --json and --all")
