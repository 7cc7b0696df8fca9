"""The one way opsctl runs a node's GPU tools (dcgmi, nvidia-smi, nvidia-bug-report.sh, all_reduce_perf):
with a timeout, and never raising for a tool that hangs or is missing, so that a check says "not checked"
instead of failing. `opsctl node check --remediate-self` (ladder/node_step.py) and `opsctl node validate`
(validate/node.py) both run their tools through it; tests pass a fake `run`.
"""

import subprocess
from collections.abc import Callable

Run = Callable[..., subprocess.CompletedProcess[str]]
# dcgmi's own limit per level is minutes (level 2) to an hour (level 4); the node check's unit allows this.
DIAG_TIMEOUT_S = {1: 120, 2: 600, 3: 2400, 4: 4800}


def run_tool(run: Run, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """The tool's result; exit 124 when it timed out, 127 when it could not start (as a shell reports them)."""
    try:
        return run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]} {argv[1]} timed out after {timeout:g}s")
    except OSError as err:
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: {err.strerror}")
