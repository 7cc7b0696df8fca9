"""Is the node ready for its checks after a reset or a reboot? The node's ladder step (ladder/node_step.py) waits
for it, bounded, before any diag: a check run too early says "not yet", never "failed".

On an HGX board Fabric Manager trains each GPU's NVSwitch fabric after the driver loads and again after a GPU
reset; the fabric state goes Not Started -> In Progress -> Completed (`nvidia-smi -q`, Fabric section; NVML's
GpuFabricInfo). Until it completes CUDA answers CUDA_ERROR_SYSTEM_NOT_READY ("system not yet initialized") and
`dcgmi diag` fails every GPU (NVIDIA/NVSentinel issue 883); one failure after a reboot would send a healthy GPU
to RMA. Persistence mode, which the step turned off around a reset and the persistence daemon turns on at boot,
must be on again too (DCGM's software test fails a GPU without it), and the NVIDIA services must be active
(remediation.ready_services: nvidia-persistenced, nvidia-fabricmanager; `systemctl is-active`): a Fabric Manager
that died after training is no fabric for the next job.

    $ nvidia-smi --query-gpu=index,fabric.state,fabric.status,persistence_mode --format=csv,noheader
    0, Completed, Success, Enabled
    1, In Progress, N/A, Enabled

A board without an NVSwitch fabric prints `[Not Supported]` or `N/A` for the state: nothing to wait for. nvidia-smi
that fails (exit 9 while the driver loads) is not ready yet either. What is not ready at the bound is the step's
answer, `unchecked`, naming it: the head reboots after a reset, and leaves a node that stays so after a reboot to a
person (never RMA).
"""

import subprocess
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Protocol

from opsctl.config.schema import Config
from opsctl.errors import SourceUnavailable
from opsctl.gpu.nvidia_smi import parse_nvidia_smi_csv
from opsctl.gpu.tools import READY_QUERY_TIMEOUT_S, Run, exited, run_tool, unit_states

READY_FIELDS = ["index", "fabric.state", "fabric.status", "persistence_mode"]
POLL_S = 2.0
# The fabric states with nothing left to train: Completed (its status says how), and a board with no fabric.
NO_FABRIC = (None, "Not Supported", "N/A")


class Clock(Protocol):
    def sleep(self, seconds: float, /) -> None: ...

    def monotonic(self) -> float: ...


Pace = Clock | ModuleType  # the time module, or a test's clock


@dataclass(frozen=True)
class Readiness:
    gpus: tuple[int, ...]  # every GPU nvidia-smi listed (the last query's)
    why: str  # what is not ready, "" when all is
    waited_s: float

    @property
    def ready(self) -> bool:
        return not self.why

    def words(self) -> str:
        """For the step's answer: how long the wait took, or what it waited for in vain."""
        if self.ready:
            return f"ready after {self.waited_s:.0f}s"
        return f"not ready after {self.waited_s:.0f}s: {self.why}"


FABRIC_TRAINED, FABRIC_TRAINING, FABRIC_FAILED = "trained", "training", "failed"


def fabric_state(state: object, status: object) -> str:
    """A GPU's fabric, from nvidia-smi's fabric.state and fabric.status: trained (Completed with Success, or a board
    without a fabric), still training (Not Started, In Progress), or failed (Completed with another status)."""
    if state in NO_FABRIC or (state == "Completed" and status == "Success"):
        return FABRIC_TRAINED
    return FABRIC_FAILED if state == "Completed" else FABRIC_TRAINING


def not_ready(text: str) -> tuple[tuple[int, ...], str]:
    """The GPUs of a readiness query's output and what of them is not ready ("" when nothing)."""
    rows = parse_nvidia_smi_csv(text, READY_FIELDS)
    gpus, waiting = [], []
    for row in rows:
        gpu, state, status, persistence = (row[f] for f in READY_FIELDS)
        if not isinstance(gpu, int):
            raise SourceUnavailable(f"nvidia-smi printed no GPU index: {row}")
        gpus.append(gpu)
        fabric = fabric_state(state, status)
        if fabric == FABRIC_FAILED:
            waiting.append(f"fabric Completed with status {status} on GPU {gpu}")
        elif fabric == FABRIC_TRAINING:
            waiting.append(f"fabric {state} on GPU {gpu}")
        if persistence != "Enabled":
            waiting.append(f"persistence mode {persistence} on GPU {gpu}")
    if not gpus:
        return (), "nvidia-smi listed no GPU"
    return tuple(gpus), ", ".join(waiting)


def query(nvidia_smi: str, run: Run) -> tuple[tuple[int, ...], str]:
    """One readiness query: the GPUs and what is not ready."""
    argv = [nvidia_smi, "--query-gpu=" + ",".join(READY_FIELDS), "--format=csv,noheader"]
    out = run_tool(run, argv, READY_QUERY_TIMEOUT_S)  # a hung GPU: not ready
    if out.returncode != 0:
        return (), exited(out, "nvidia-smi")
    try:
        return not_ready(out.stdout)
    except SourceUnavailable as err:
        return (), str(err)


def services_down(systemctl: str, units: tuple[str, ...], run: Run) -> str:
    """The NVIDIA services (remediation.ready_services) that are not active, `nvidia-fabricmanager inactive`;
    "" when all are. `systemctl is-active` prints one state a unit (a unit not installed: `inactive`)."""
    if not units:
        return ""
    out, states = unit_states(systemctl, units, run, READY_QUERY_TIMEOUT_S)
    if len(states) != len(units):
        return exited(out, "systemctl is-active")
    return ", ".join(f"{unit} {state}" for unit, state in zip(units, states, strict=True) if state != "active")


def wait_ready(config: Config, run: Run = subprocess.run, pace: Pace = time) -> Readiness:
    """Query until every GPU and every service is ready, or remediation.ready_timeout has passed."""
    timeout_s = config.remediation.ready_timeout
    start = pace.monotonic()
    while True:
        gpus, why = query(config.gpu.nvidia_smi, run)
        down = services_down(config.gpu.systemctl, config.remediation.ready_services, run)
        why = ", ".join(word for word in (why, down) if word)
        waited = pace.monotonic() - start
        if not why or waited >= timeout_s:
            return Readiness(gpus, why, waited)
        pace.sleep(min(POLL_S, max(0.0, timeout_s - waited)))
