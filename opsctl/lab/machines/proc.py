"""Running host commands: a failure becomes one LabError line that names the command."""

import subprocess

from opsctl.errors import LabError


def run(args: list[str], check: bool = True, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    except FileNotFoundError as err:
        raise LabError(f"{args[0]} is not installed (make deps-machines installs what the lab needs)") from err
    except subprocess.TimeoutExpired as err:
        raise LabError(f"{' '.join(args[:3])} ... took longer than {timeout:.0f}s") from err
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise LabError(f"{' '.join(args)} failed (rc {result.returncode}): {detail[-1] if detail else 'no output'}")
    return result
