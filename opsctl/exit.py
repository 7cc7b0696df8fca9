"""How a command ends: an error becomes one line on stderr and its documented exit code.

An OpsctlError exits with its own code. Anything else (a bug, a permission problem, a full disk) is
unexpected: exit 3, one line, and the traceback only with `opsctl --debug`. It never exits 0 or 1.
Ctrl-C exits 130 (128 + SIGINT, as shells report it), after the changes made so far.
When the run had changed nodes before the error, each change is listed on stdout first. With --json,
stdout carries the error as well, as one JSON object that programs can read:
  {"schema": 1, "error": "<the line>", "exit_code": 3, "done": ["<change made before the error>", ...]}

Every opsctl command ends here, `opsctl lab ...` too (the lab imports this module, never the command layer:
a lab command has no --json, and its LabError exits 2).
"""

import functools
import json
import sys
import traceback
from collections.abc import Callable
from typing import Any

import click

from opsctl.errors import ExitCode, OpsctlError, redact

# The version of every --json document opsctl prints, the error object's too.
JSON_SCHEMA = 1


def _debug() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and getattr(ctx.find_root().obj, "debug", False))


def error_json(message: str, code: ExitCode, done: list[str] | None = None, **extra: str) -> str:
    """The error of a --json command as the object its stdout carries (same schema version as its output)."""
    return json.dumps({"schema": JSON_SCHEMA, "error": message, "exit_code": int(code), "done": list(done or []),
                       **extra})


def one_line_errors(func: Callable[..., ExitCode | int | None]) -> Callable[..., None]:
    """Run a command body; an error becomes one stderr line and its exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        as_json = bool(kwargs.get("as_json"))
        try:
            code = func(*args, **kwargs)
        except OpsctlError as err:
            done = list(getattr(err, "done", []))
            message = redact(str(err))
            if as_json:
                click.echo(error_json(message, err.exit_code, done))
            else:
                for line in done:
                    click.echo(f"done before the error: {line}")
            if _debug() and err.__cause__ is not None:
                traceback.print_exception(err.__cause__, file=sys.stderr)
            click.echo(f"opsctl: error: {message}", err=True)
            sys.exit(int(err.exit_code))
        except KeyboardInterrupt:  # Ctrl-C outside a change (the actor turns one during a change into Interrupted)
            if as_json:
                click.echo(error_json("interrupted", ExitCode.INTERRUPTED))
            click.echo("opsctl: interrupted", err=True)
            sys.exit(int(ExitCode.INTERRUPTED))
        except (SystemExit, click.exceptions.Exit, click.ClickException):
            raise
        except Exception as err:  # noqa: BLE001 (the last line of defence: never exit 0 or 1 on a bug)
            if _debug():
                traceback.print_exc()
            message = redact(f"unexpected error: {type(err).__name__}: {err}".splitlines()[0])
            if as_json:
                click.echo(error_json(message, ExitCode.SOURCE_DOWN))
            click.echo(f"opsctl: error: {message} (run with opsctl --debug for the traceback)", err=True)
            sys.exit(int(ExitCode.SOURCE_DOWN))
        sys.exit(int(code or ExitCode.OK))

    return wrapper
