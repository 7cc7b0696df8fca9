"""How an `opsctl lab ...` command ends, as every opsctl command ends (README: errors exit 2 with one line):
an OpsctlError (LabError: exit 2) becomes one line on stderr and its own exit code; anything else is
unexpected: exit 3, one line, the traceback only with `opsctl --debug`; Ctrl-C exits 130. The lab keeps
its own copy so that it never imports the product's command layer (opsctl.commands); the lab's commands
have no --json."""

import functools
import sys
import traceback
from collections.abc import Callable
from typing import Any

import click

from opsctl.errors import ExitCode, OpsctlError, redact


def _debug() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and getattr(ctx.find_root().obj, "debug", False))


def one_line_errors(func: Callable[..., ExitCode | int | None]) -> Callable[..., None]:
    """Run a command body; an error becomes one stderr line and its exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            code = func(*args, **kwargs)
        except OpsctlError as err:
            for line in getattr(err, "done", []):
                click.echo(f"done before the error: {line}")
            if _debug() and err.__cause__ is not None:
                traceback.print_exception(err.__cause__, file=sys.stderr)
            click.echo(f"opsctl: error: {redact(str(err))}", err=True)
            sys.exit(int(err.exit_code))
        except KeyboardInterrupt:
            click.echo("opsctl: interrupted", err=True)
            sys.exit(int(ExitCode.INTERRUPTED))
        except (SystemExit, click.exceptions.Exit, click.ClickException):
            raise
        except Exception as err:  # noqa: BLE001 (the last line of defence: never exit 0 or 1 on a bug)
            if _debug():
                traceback.print_exc()
            message = redact(f"unexpected error: {type(err).__name__}: {err}".splitlines()[0])
            click.echo(f"opsctl: error: {message} (run with opsctl --debug for the traceback)", err=True)
            sys.exit(int(ExitCode.SOURCE_DOWN))
        sys.exit(int(code or ExitCode.OK))

    return wrapper
