"""Exit codes and the one error type that the CLI turns into a one-line message.

Exit codes (documented in README.md, "Exit codes"):
  0 OK              no failing node
  1 FAILING         failing nodes found
  2 USAGE           usage or config error
  3 SOURCE_DOWN     a data source (Prometheus, Slurm) was unavailable, or opsctl's state or audit log
                    could not be written (a full disk, a permission error); what was done is listed
  4 SAFETY_STOP     a safety limit stopped the run (circuit breaker, budget, lock held)
  130 INTERRUPTED   Ctrl-C (SIGINT) stopped a run; what was done is listed and audited
Precedence when several apply: 130 > 2 > 3 > 4 > 1.
"""

import re
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILING = 1
    USAGE = 2
    SOURCE_DOWN = 3
    SAFETY_STOP = 4
    INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command that Ctrl-C stopped


_PRECEDENCE = [ExitCode.INTERRUPTED, ExitCode.USAGE, ExitCode.SOURCE_DOWN, ExitCode.SAFETY_STOP, ExitCode.FAILING,
               ExitCode.OK]


def worst(*codes: ExitCode) -> ExitCode:
    """The code that wins by the documented precedence (130 > 2 > 3 > 4 > 1 > 0)."""
    for code in _PRECEDENCE:
        if code in codes:
            return code
    return ExitCode.OK


class OpsctlError(Exception):
    """An error the user must see as one line, with the exit code it maps to."""

    exit_code: ExitCode = ExitCode.USAGE

    def __init__(self, message: str, exit_code: ExitCode | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class ConfigError(OpsctlError):
    exit_code = ExitCode.USAGE


class SourceUnavailable(OpsctlError):
    """Prometheus or Slurm could not be read, or answered with something unusable."""

    exit_code = ExitCode.SOURCE_DOWN


class SafetyStop(OpsctlError):
    exit_code = ExitCode.SAFETY_STOP


class StateUnwritable(OpsctlError):
    """opsctl's state directory or audit log could not be written (a full disk, a permission error): the
    safety record of a change may be missing, so the run stops and says what it had done."""

    exit_code = ExitCode.SOURCE_DOWN


class Interrupted(OpsctlError):
    """Ctrl-C during a run; `done` lists the changes made before it."""

    exit_code = ExitCode.INTERRUPTED

    def __init__(self, done: list[str]):
        super().__init__("interrupted" + (f" after {len(done)} change(s)" if done else "; nothing was changed"))
        self.done = done


_USERINFO = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")
_QUERY = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s?]*)\?\S*")


def redact(text: str) -> str:
    """Credentials in a URL (https://user:pass@host, ?token=...) never reach a message or the audit log."""
    return _QUERY.sub(r"\1?...", _USERINFO.sub(r"\1***@", text))
