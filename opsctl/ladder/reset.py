"""A GPU reset as an HGX node allows it (the node's ladder step, ladder/node_step.py; docs/remediation.md).

`nvidia-smi -r` refuses a GPU that any process holds, monitoring included ("In use by another client", exit 255;
nvidia-smi(1)). DCGM's host engine (nv-hostengine, the `nvidia-dcgm` unit) and dcgm-exporter hold every GPU while
they run (NVIDIA/NVSentinel issue 1691: "a persistent NVML client holds an attachment to every GPU"), and the
persistence daemon holds it while persistence mode is on (NVSentinel issue 1690). So, as NVSentinel's janitor does:

  1. `systemctl is-active` of remediation.reset_stops (dcgm-exporter, nvidia-dcgm): the ones that run are stopped
     (`systemctl stop`), and only those are started again at the end;
  2. nothing else may hold the GPUs: `nvidia-smi --query-compute-apps` lists every compute process by its GPU's
     bus id; one on a GPU to reset is a refusal that names it (a job's leftover: the epilog's business, or a
     person's), never a reset attempt;
  3. for each GPU, persistence mode off, `nvidia-smi -r -i N`, persistence mode on (whatever the reset did);
  4. `systemctl start` of what step 1 stopped, whatever happened.

The outcome is "" when every GPU was reset, else what stopped it, in one line; a service that did not start again
is in `note` (its exporter's silence leaves the node "unknown" to the health run, never resumed on no data).
"""

import subprocess
from dataclasses import dataclass

from opsctl.config.schema import Config
from opsctl.errors import SourceUnavailable
from opsctl.gpu.kmsg import canonical_pci
from opsctl.gpu.nvidia_smi import RC_FELL_OFF_BUS, parse_gpu_indexes, parse_nvidia_smi_csv
from opsctl.gpu.tools import NVIDIA_SMI_TIMEOUT_S, SYSTEMCTL_TIMEOUT_S, Run, run_tool, unit_states

APP_FIELDS = ["gpu_bus_id", "pid", "process_name"]


@dataclass(frozen=True)
class ResetOutcome:
    failed: str = ""  # what stopped the reset, "" when every GPU was reset
    note: str = ""  # what did not come back after it (a service), for the answer's audit record


def reset_gpus(config: Config, gpus: tuple[int, ...], run: Run = subprocess.run) -> ResetOutcome:
    systemctl = config.gpu.systemctl
    running = _running(systemctl, config.remediation.reset_stops, run)
    note = ""
    try:
        failed = _stop_and_reset(config, running, gpus, run)
    finally:  # what was stopped starts again, whatever happened
        if running:
            started = run_tool(run, [systemctl, "start", *running], SYSTEMCTL_TIMEOUT_S)
            if started.returncode != 0:
                note = f"{' '.join(running)} did not start again: {_first_line(started)}"
    return ResetOutcome(failed, note)


def _stop_and_reset(config: Config, running: list[str], gpus: tuple[int, ...], run: Run) -> str:
    """Steps 1 to 3: "" when every GPU was reset, else what stopped it."""
    if running:
        stopped = run_tool(run, [config.gpu.systemctl, "stop", *running], SYSTEMCTL_TIMEOUT_S)
        if stopped.returncode != 0:
            return f"could not stop {' '.join(running)}: {_first_line(stopped)}"
    held = holders(config.gpu.nvidia_smi, gpus, run)
    if held:
        return f"held by {held}: not reset"
    for gpu in gpus:
        reset = _reset(config.gpu.nvidia_smi, gpu, run)
        if reset.returncode != 0:
            why = " ".join((reset.stdout + reset.stderr).split()) or f"exit {reset.returncode}"
            where = f" on GPU {gpu}" if len(gpus) > 1 else ""
            return f"reset failed (exit {reset.returncode}){where}: {why}"
    return ""


def _running(systemctl: str, units: tuple[str, ...], run: Run) -> list[str]:
    """The units that run now: `systemctl is-active` prints one state a unit, `active` for a running one (a unit
    that is not installed prints `inactive`, and the exit code is non-zero unless all are active)."""
    if not units:
        return []
    _, states = unit_states(systemctl, units, run, SYSTEMCTL_TIMEOUT_S)
    return [unit for unit, state in zip(units, states, strict=False) if state in ("active", "reloading", "activating")]


def holders(nvidia_smi: str, gpus: tuple[int, ...], run: Run) -> str:
    """The compute processes on these GPUs, `python3 (pid 41002) on GPU 2, ...`; "" when none. nvidia-smi that
    cannot say is no holder found: the reset's own refusal then names what holds the GPU."""
    indexes = run_tool(run, [nvidia_smi, "--query-gpu=index,pci.bus_id", "--format=csv,noheader"],
                       NVIDIA_SMI_TIMEOUT_S)
    apps = run_tool(run, [nvidia_smi, "--query-compute-apps=" + ",".join(APP_FIELDS), "--format=csv,noheader"],
                    NVIDIA_SMI_TIMEOUT_S)
    if indexes.returncode not in (0, RC_FELL_OFF_BUS) or apps.returncode not in (0, RC_FELL_OFF_BUS):
        return ""
    try:
        index_of = parse_gpu_indexes(indexes.stdout)
        rows = parse_nvidia_smi_csv(apps.stdout, APP_FIELDS)
    except SourceUnavailable:
        return ""
    found = []
    for row in rows:
        gpu = index_of.get(canonical_pci(str(row["gpu_bus_id"])) or "")
        if gpu in gpus:
            found.append(f"{row['process_name']} (pid {row['pid']}) on GPU {gpu}")
    return ", ".join(found)


def _reset(nvidia_smi: str, gpu: int, run: Run) -> subprocess.CompletedProcess[str]:
    """`nvidia-smi -r -i GPU`, persistence mode off around it, and back on whatever the reset did."""
    run_tool(run, [nvidia_smi, "-pm", "0", "-i", str(gpu)], NVIDIA_SMI_TIMEOUT_S)
    try:
        return run_tool(run, [nvidia_smi, "-r", "-i", str(gpu)], NVIDIA_SMI_TIMEOUT_S)
    finally:
        run_tool(run, [nvidia_smi, "-pm", "1", "-i", str(gpu)], NVIDIA_SMI_TIMEOUT_S)


def _first_line(out: subprocess.CompletedProcess[str]) -> str:
    lines = (out.stderr or out.stdout).strip().splitlines()
    return lines[0][:200] if lines else f"exit {out.returncode}"
