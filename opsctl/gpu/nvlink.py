"""`nvidia-smi nvlink -s`: the speed of each NVLink of each GPU, or that it is inactive.

    GPU 0: NVIDIA H100 PCIe (UUID: GPU-6968dfc2-d444-d92c-c36b-6abe53445cb9)
             Link 0: 26.562 GB/s
             Link 4: <inactive>

(tests/fixtures/gpu/nvidia-smi_nvlink_-s_2xH100_PCIe.txt; each link line starts with a tab and a space).
An H200 of an HGX board has 18 links, each at 26.562 GB/s while it runs at full speed. DCGM cannot say that
a link is down: dcgm-exporter watches only the links that are up (devicemonitoring.monitorAllGPUNvLinks),
so a down link simply has no series. `opsctl node check` reads this instead and writes each link's speed,
0 for an inactive one (opsctl.nodecheck.report). A GPU whose links are all inactive prints a line of
NVML's instead of its links; it has no link here (its fabric cannot train: fabric-not-ready sees it).
"""

import re
import subprocess
from dataclasses import dataclass, field

from opsctl.errors import SourceUnavailable
from opsctl.gpu.tools import Run, run_tool

_GPU = re.compile(r"^GPU (\d+): ")
_LINK = re.compile(r"^\s+Link (\d+): (?:(\d+(?:\.\d+)?) GB/s|<inactive>)\s*$")
TIMEOUT_SECONDS = 10.0  # a hung GPU hangs nvidia-smi: the node check goes on without the links


def parse_nvlink_status(text: str) -> dict[int, dict[int, float]]:
    """GPU index -> link -> bytes per second (0 when inactive). SourceUnavailable on a line it cannot read."""
    gpus: dict[int, dict[int, float]] = {}
    gpu = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if match := _GPU.match(line):
            gpu = int(match.group(1))
            gpus[gpu] = {}
        elif (match := _LINK.match(line)) and gpu is not None:
            gpus[gpu][int(match.group(1))] = float(match.group(2)) * 1e9 if match.group(2) else 0.0
        elif gpu is None or "NVML" not in line:
            raise SourceUnavailable(f"nvidia-smi nvlink -s printed a line it does not know: {line.strip()[:120]!r}")
    return gpus


@dataclass
class NvlinkReport:
    speeds: dict[int, dict[int, float]] = field(default_factory=dict)  # GPU -> link -> bytes per second
    note: str = ""  # why there are none: nvidia-smi's error


def read_nvlinks(nvidia_smi: str, run: Run = subprocess.run) -> NvlinkReport:
    """Every GPU's links; none, with the reason, when nvidia-smi cannot say."""
    out = run_tool(run, [nvidia_smi, "nvlink", "-s"], TIMEOUT_SECONDS)
    if out.returncode != 0:
        why = (out.stderr or out.stdout).strip().splitlines()
        return NvlinkReport(note=f"nvidia-smi nvlink -s exited {out.returncode}" + (f": {why[0][:200]}" if why else ""))
    try:
        return NvlinkReport(speeds=parse_nvlink_status(out.stdout))
    except SourceUnavailable as err:
        return NvlinkReport(note=str(err))
