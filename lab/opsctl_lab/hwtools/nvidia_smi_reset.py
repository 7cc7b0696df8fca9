"""`nvidia-smi -r` / `--gpu-reset` of the emulated H200 node, in nvidia-smi's words.

A GPU reset is refused while anything holds the GPU. In the lab that is a leftover process
(`gpu-leftover-memory`) and the persistence daemon: persistence mode Enabled (the default, as on a node
whose nvidia-persistenced enables it) is an attachment to the device, so the ladder must `nvidia-smi -pm 0`
first and `-pm 1` after, as NVIDIA/NVSentinel PR #1692 does ("Persistence mode counts as an attachment to the
device, so the reset is refused while it is enabled"; NVIDIA/gpu-operator issue #118 saw the same with
nvidia-persistenced).

Real transcripts:
  success, rc 0 (NVIDIA/NVSentinel issue #1690 and PR #1692, NVIDIA/gpu-operator issue #118):
    GPU 00000000:1A:00.0 was successfully reset.
  refused, rc 255 (NVSentinel issue #1690, "exit=255"; the text as mig-parted logged it verbatim,
  ComputeCanada/puppet-magic_castle issue #387):
    The following GPUs could not be reset:
      GPU 00000000:00:06.0: In use by another client

    1 device is currently being used by one or more other processes (e.g., Fabric Manager, CUDA application,
    graphics application such as an X server, or a monitoring application such as another instance of
    nvidia-smi). Please first kill all processes using this device and all compute applications running in
    the system.
The plural of that last sentence ("2 devices are ...") is this emulator's guess; no transcript shows it.
A reset that runs ends the GPU's faults that do not survive one (NodeHardware.reset_gpu).

The monitoring services that hold every GPU: the simulated lab keeps them in the node's state (NodeHardware.monitoring,
which its emulated systemctl stops and starts); a lab machine runs the real units (nvidia-dcgm from the lab's DCGM
package, dcgm-exporter from the dcgm_exporter role), and systemd says which of them run.
"""

import subprocess
from pathlib import Path

from opsctl_lab.hardware import MONITORING_SERVICES, NodeHardware

SYSTEMD_BOOTED = Path("/run/systemd/system")  # sd_booted(3): this machine runs systemd

RC_IN_USE = 255
IN_USE_TAIL = ("currently being used by one or more other processes (e.g., Fabric Manager, CUDA application, "
               "graphics application such as an X server, or a monitoring application such as another instance "
               "of nvidia-smi). Please first kill all processes using this device and all compute applications "
               "running in the system.")


def in_use(hw: NodeHardware, gpu: int, holders: list[str]) -> bool:
    """Something holds the GPU: a leftover process, the persistence daemon (persistence mode Enabled), or a
    monitoring service that runs (`holders`: DCGM's host engine, dcgm-exporter, NVML clients of every GPU;
    NVIDIA/NVSentinel issue 1691)."""
    return hw.has("gpu-leftover-memory", gpu=gpu) or hw.persistence_mode(gpu) or bool(holders)


def monitoring_holders(hw: NodeHardware, booted: Path = SYSTEMD_BOOTED) -> list[str]:
    """The monitoring services that run: the emulated ones of the node's state, else (a lab machine) the units
    systemd says are active; none where no systemd runs."""
    if hw.monitoring or not booted.is_dir():
        return hw.monitoring_holders()
    try:
        out = subprocess.run(["systemctl", "is-active", *MONITORING_SERVICES], capture_output=True, text=True,
                             timeout=30).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [unit for unit, state in zip(MONITORING_SERVICES, out, strict=False) if state == "active"]


def gpu_reset(hw: NodeHardware, buses: dict[int, str], now: float | None = None,
              holders: list[str] | None = None) -> tuple[str, int]:
    """Reset the GPUs of `buses` (index -> PCI bus id) that nothing holds (the caller saves `hw`); the text
    nvidia-smi prints and its return code. `holders`: the monitoring services that run (monitoring_holders)."""
    holders = hw.monitoring_holders() if holders is None else holders
    held = [gpu for gpu in buses if in_use(hw, gpu, holders)]
    lines = []
    for gpu, bus in buses.items():
        if gpu not in held:
            hw.reset_gpu(gpu, now)
            lines.append(f"GPU {bus} was successfully reset.")
    if not held:
        return "\n".join(lines) + "\n", 0
    lines.append("The following GPUs could not be reset:")
    lines += [f"  GPU {buses[gpu]}: In use by another client" for gpu in held]
    count = f"{len(held)} device is" if len(held) == 1 else f"{len(held)} devices are"
    lines += ["", f"{count} {IN_USE_TAIL}"]
    return "\n".join(lines) + "\n", RC_IN_USE
