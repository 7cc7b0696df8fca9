"""`nvidia-smi nvlink -s`: the speed of each NVLink of each GPU, or that it is inactive.

    GPU 0: NVIDIA H100 PCIe (UUID: GPU-6968dfc2-d444-d92c-c36b-6abe53445cb9)
             Link 0: 26.562 GB/s
             Link 4: <inactive>

(tests/fixtures/gpu/nvidia-smi_nvlink_-s_2xH100_PCIe.txt; each link line starts with a tab and a space).
An H200 of an HGX board has 18 links, each at 26.562 GB/s while it runs at full speed. DCGM cannot say that
a link is down: dcgm-exporter watches only the links that are up (devicemonitoring.monitorAllGPUNvLinks),
so a down link simply has no series. `opsctl node check` reads this instead and writes, per GPU, how many
links are inactive and the slowest active one's share of full speed (hardware.nvlink_bytes_per_second),
each series naming the links (`nvlink="gpu1 link3"`): 8 series a node rather than 144, so that the rules
stay one cheap selector over a fleet of thousands of nodes (opsctl.nodecheck.report). A GPU whose links
are all inactive prints a line of NVML's instead of its links; it has no link here (its fabric cannot
train: fabric-not-ready sees it).
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


@dataclass(frozen=True)
class GpuLinks:
    """One GPU's links against their full speed."""

    gpu: int
    inactive: tuple[int, ...]  # the links that are inactive
    slow: tuple[int, ...]  # the active links below full speed
    share: float  # the slowest active link's speed over full speed; 1 when none is slower (or none is active)

    def name(self, links: tuple[int, ...]) -> str:
        """How a series names these links of the GPU: gpu1, gpu1 link3, gpu1 links 3,7."""
        if not links:
            return f"gpu{self.gpu}"
        return f"gpu{self.gpu} link{links[0]}" if len(links) == 1 else \
            f"gpu{self.gpu} links {','.join(str(link) for link in links)}"


@dataclass
class NvlinkReport:
    speeds: dict[int, dict[int, float]] = field(default_factory=dict)  # GPU -> link -> bytes per second
    note: str = ""  # why there are none: nvidia-smi's error
    full: float = 26.562e9  # a link's full speed, bytes per second (hardware.nvlink_bytes_per_second)

    def gpus(self) -> list[GpuLinks]:
        """Each GPU that listed its links: one that listed none (NVML's line) says nothing of them, not 0."""
        out = []
        for gpu, links in sorted(self.speeds.items()):
            if not links:
                continue
            active = {link: speed for link, speed in links.items() if speed > 0}
            slow = tuple(sorted(link for link, speed in active.items() if speed < self.full))
            share = min(1.0, min(active.values()) / self.full) if active else 1.0
            out.append(GpuLinks(gpu, tuple(sorted(set(links) - set(active))), slow, share))
        return out


def read_nvlinks(nvidia_smi: str, full: float, run: Run = subprocess.run) -> NvlinkReport:
    """Every GPU's links; none, with the reason, when nvidia-smi cannot say. `full`: a link's full speed."""
    out = run_tool(run, [nvidia_smi, "nvlink", "-s"], TIMEOUT_SECONDS)
    if out.returncode != 0:
        why = (out.stderr or out.stdout).strip().splitlines()
        return NvlinkReport(note=f"nvidia-smi nvlink -s exited {out.returncode}" + (f": {why[0][:200]}" if why else ""),
                            full=full)
    try:
        return NvlinkReport(speeds=parse_nvlink_status(out.stdout), full=full)
    except SourceUnavailable as err:
        return NvlinkReport(note=str(err), full=full)
