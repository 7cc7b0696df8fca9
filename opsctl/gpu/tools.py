"""The one way opsctl runs a node's GPU tools (dcgmi, nvidia-smi, nvidia-bug-report.sh, all_reduce_perf):
with a timeout, and never raising for a tool that hangs or is missing, so that a check says "not checked"
instead of failing. `opsctl node check --remediate-self` (ladder/node_step.py) and `opsctl node validate`
(validate/node.py) both run their tools through it; tests pass a fake `run`.
"""

import subprocess
from collections.abc import Callable

Run = Callable[..., subprocess.CompletedProcess[str]]
# How long `dcgmi diag -r <level>` may run, per level. NVIDIA's dcgmi diag reference (docs.nvidia.com/datacenter/
# dcgm/latest/reference/command-line-reference/dcgmi/dcgmi-diag.html, option -r): level 1 "normally lasting
# seconds", 2 "approximately two minutes", 3 "approximately 15 minutes", 4 "extended, longer-running" (no
# figure). Each bound leaves several times that for a slow or busy node; level 4 twice level 3's.
DIAG_TIMEOUT_S = {1: 120, 2: 600, 3: 2400, 4: 4800}
# The other tools of the node's ladder step (ladder/node_step.py), each at most this long: nvidia-smi, for each
# GPU of the step (-pm 0, -r and -pm 1 around its reset, -q after a diag that did not pass), and
# nvidia-bug-report.sh once (after a diag that did not pass following a reboot).
NVIDIA_SMI_TIMEOUT_S = 120
NVIDIA_SMI_CALLS_PER_GPU = 4
BUG_REPORT_TIMEOUT_S = 300
# The wait for the node to be ready before its checks (ladder/ready.py): remediation.ready_timeout, which the
# config holds to at most READY_TIMEOUT_MAX_S, and the two queries that end it (nvidia-smi, systemctl).
READY_TIMEOUT_MAX_S = 600
READY_QUERY_TIMEOUT_S = 30
# A diag that fails after a reboot runs once more before the answer sends the GPU to RMA (ladder/node_step.py), and
# so does the all-reduce after it.
DIAG_RUNS = 2
# nccl-tests' all_reduce_perf over the node's GPUs (after a whole-node diag, ladder/node_step.py): at 16 GiB on 8 H200
# it takes seconds; starting NCCL and the CUDA contexts, up to a minute.
NCCL_TIMEOUT_S = 300
# Once around a reset (ladder/reset.py): systemctl is-active, stop and start of the GPU's monitoring services, and
# two nvidia-smi queries for the processes that hold the GPUs.
SYSTEMCTL_TIMEOUT_S = 120
RESET_ONCE_S = 3 * SYSTEMCTL_TIMEOUT_S + 2 * NVIDIA_SMI_TIMEOUT_S


def node_step_bound_s(level: int, gpus: int = 1) -> int:
    """The longest the node's ladder step over `gpus` GPUs may run at `dcgmi diag -r <level>` (one diag checks
    them all): every tool it may call at its timeout, one after another, the wait for readiness, the diag's
    second run and, over more than one GPU, the all-reduce after it and its second run included. The node check's
    unit (node_check role) allows a step over every GPU of the node, the head's remediation.step_timeout one over a
    GPU: there the all-reduce needs no room of its own, as it runs only after a diag passed, in place of the
    diag's second run and the nvidia-smi queries of a failure (after a reboot, also of the reset it skips)."""
    return (DIAG_RUNS * DIAG_TIMEOUT_S[level] + READY_TIMEOUT_MAX_S + 2 * READY_QUERY_TIMEOUT_S + RESET_ONCE_S
            + gpus * NVIDIA_SMI_CALLS_PER_GPU * NVIDIA_SMI_TIMEOUT_S + BUG_REPORT_TIMEOUT_S
            + (DIAG_RUNS * NCCL_TIMEOUT_S if gpus > 1 else 0))


def run_tool(run: Run, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """The tool's result; exit 124 when it timed out, 127 when it could not start (as a shell reports them)."""
    try:
        return run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]} {argv[1]} timed out after {timeout:g}s")
    except OSError as err:
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: {err.strerror}")


def exited(out: subprocess.CompletedProcess[str], what: str) -> str:
    """`<what> exited N: <its first line>`: a tool that did not answer, in one line."""
    first = (out.stderr or out.stdout).strip().splitlines()
    return f"{what} exited {out.returncode}" + (f": {first[0][:160]}" if first else "")


def unit_states(systemctl: str, units: tuple[str, ...], run: Run, timeout: float
                ) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """`systemctl is-active UNIT...`: the call, and the states it printed, one a unit (`active`, `inactive` also
    for a unit not installed); the exit code is non-zero unless all are active."""
    out = run_tool(run, [systemctl, "is-active", *units], timeout)
    return out, out.stdout.split()
