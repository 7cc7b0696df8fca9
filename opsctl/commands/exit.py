"""How a command ends: an OpsctlError becomes one line on stderr and its documented exit code."""

import functools
import sys
from collections.abc import Callable
from typing import Any

import click

from opsctl.errors import ExitCode, OpsctlError


def one_line_errors(func: Callable[..., ExitCode | int | None]) -> Callable[..., None]:
    """Run a command body; an OpsctlError becomes one stderr line and its exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            code = func(*args, **kwargs)
        except OpsctlError as err:
            click.echo(f"opsctl: error: {err}", err=True)
            sys.exit(int(err.exit_code))
        sys.exit(int(code or ExitCode.OK))

    return wrapper
