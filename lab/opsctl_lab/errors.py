"""The lab's one error type: a one-line message, exit 2 (`opsctl lab ...` errors, README)."""

from opsctl.errors import ExitCode, OpsctlError


class LabError(OpsctlError):
    exit_code = ExitCode.USAGE
