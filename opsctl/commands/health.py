"""`opsctl health`: one run or `--watch`, rendered as a table, JSON or the changes since the last run.

opsctl/cli.py parses the arguments and calls `health` with the Clients of the invocation; it calls the
core (opsctl.health.run), echoes the rendered result and returns the exit code.
"""


import click

from opsctl.clients import Clients
from opsctl.commands.changes import render_changes
from opsctl.commands.render import iso_time, render_json, render_table
from opsctl.commands.watch import PASSING, watch
from opsctl.errors import ExitCode, OpsctlError, redact
from opsctl.exit import error_json
from opsctl.health.run import RunOptions, RunResult
from opsctl.health.session import HealthSession, check_changes_only
from opsctl.metrics import RunRecorder


def health(clients: Clients, drain: bool, dry_run: bool, resume: bool, as_json: bool, watch_s: float | None,
           all_nodes: bool, scope: str | None = None, changes_only: bool = False) -> ExitCode:
    check_changes_only(changes_only, as_json, all_nodes)
    session = HealthSession(clients, RunOptions(drain=drain, resume=resume, dry_run=dry_run, scope=scope),
                            changes_only)
    recorder = RunRecorder(session.config.metrics, serve=watch_s is not None,
                           warn=lambda line: click.echo(line, err=True))

    @recorder.wrap
    def once() -> RunResult:
        return session.run_once()

    def show(result: RunResult, stamp: str = "") -> None:
        # Why some rules were queried directly: one line on stderr, so that the table and the JSON on
        # stdout keep their shape (the JSON has it in summary.rule_results_note).
        if result.report.rule_results_note:
            click.echo(f"{stamp}note: {result.report.rule_results_note}", err=True)
        if session.changes is not None:
            click.echo(render_changes(result, session.changes.previous))
            session.keep(result)
            return
        click.echo(render_json(result) if as_json else render_table(result, all_nodes))
    if watch_s is None:
        result = once()
        show(result)
        return result.exit_code

    # Every --watch line starts with the time of its round (the JSON carries it in summary.time), so a
    # journal or a terminal scrollback tells the rounds apart.
    def show_round(result: RunResult) -> None:
        stamp = iso_time(result.started)
        if as_json or session.changes is not None:
            show(result, f"{stamp} ")
            return
        if result.report.rule_results_note:
            click.echo(f"{stamp} note: {result.report.rule_results_note}", err=True)
        click.echo("\n".join(f"{stamp} {line}" for line in render_table(result, all_nodes).splitlines()))

    def once_or_json_error() -> RunResult:
        try:
            return once()
        except OpsctlError as err:
            if as_json and err.exit_code in PASSING:
                click.echo(error_json(redact(str(err)), err.exit_code, getattr(err, "done", []), time=iso_time()))
            raise

    recorder.start()
    return watch(once_or_json_error, watch_s, show_round, lambda line: click.echo(f"{iso_time()} {line}", err=True))
