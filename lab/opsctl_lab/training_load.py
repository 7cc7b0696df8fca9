"""The load a training rank puts on its node's GPUs and HCAs, and what DCGM and sysfs then read.

A rank (opsctl_lab.hwtools.train) publishes its load in `train.json` next to its node's hardware state,
rewritten atomically at each change of phase and a few times a second (its heartbeat):

    {"job": "812", "rank": 3, "pid": 4711, "phase": "compute", "gpus": [0, ..., 7], "computing": [2],
     "step": 41, "total_steps": 977, "started": 1767000000.0, "updated": 1767000041.2,
     "duty": {"0": 0.62, ..., "2": 1.0, ...}}

phase: compute (the rank computes its step), wait (at the all-reduce barrier, for a peer), hung (`hang`), or
done. computing: the GPUs still computing; the others of `gpus` wait, spinning in NCCL's kernels (on a node
with a `slow-gpu`, its seven fast GPUs wait for the slow one as the other nodes do). duty: each GPU's share
of the last DUTY_WINDOW_S spent computing. total_steps: the steps every job completed on this node; the
traffic counters derive from it, so they only go up, across jobs too.

The emulators render (training_view): a computing or waiting GPU is busy (utilisation 100: NCCL spins while
it waits) at its full clock; its power, graphics-engine and tensor activity follow its duty, as NVML's power
reading and DCGM's profiling ratios average over a window. A hung rank's GPUs, and those of no rank (or of a
rank whose heartbeat stopped: it was killed), are idle.
"""

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from opsctl_lab.hardware import GPUS_PER_NODE, stable_int
from opsctl_lab.sync_job import write_once

LOAD_FILE = "train.json"
COMPUTE, WAIT, HUNG, DONE = "compute", "wait", "hung", "done"
DUTY_WINDOW_S = 5.0
# A rank rewrites its file at least this often while it lives; older, it was killed (SIGKILL leaves no word).
STALE_S = 5.0

# H200 SXM under data-parallel training (TDP 700 W): computing 640-680 W, spinning in NCCL 180-220 W.
COMPUTE_POWER_W = 640.0
SPIN_POWER_W = 180.0
POWER_SPREAD_W = 40
# What a GPU held down by `slow-gpu`'s power cap draws at most.
SLOW_GPU_POWER_CAP_W = 450.0
GR_ENGINE_COMPUTE = 0.9
GR_ENGINE_SPIN = 0.08
TENSOR_COMPUTE = 0.5
DRAM_COMPUTE = 0.35
# An all-reduce of a 7B-parameter model's bf16 gradients (14 GB) each step: a ring moves about twice the
# buffer through each GPU's NVLinks, and each rail's HCA carries its GPU's share across the nodes.
NVLINK_BYTES_PER_STEP = 24_000_000_000
IB_BYTES_PER_STEP = 3_000_000_000
IB_MTU_BYTES = 4096
# How far the same counter or level may differ between two healthy GPUs or ports: +-2 %.
SPREAD_PER_MILLE = 20


@dataclass
class RankLoad:
    job: str
    rank: int
    pid: int
    phase: str
    gpus: list[int] = field(default_factory=lambda: list(range(GPUS_PER_NODE)))
    computing: list[int] = field(default_factory=list)
    step: int = 0
    total_steps: int = 0
    started: float = 0.0
    updated: float = 0.0
    duty: dict[str, float] = field(default_factory=dict)

    def save(self, path: Path) -> None:
        write_once(Path(path), json.dumps(asdict(self), sort_keys=True))

    @classmethod
    def read(cls, path: Path) -> "RankLoad | None":
        """The rank's last word; None without one, or a torn or foreign file (an emulator must not fail)."""
        try:
            raw = json.loads(Path(path).read_text())
            return cls(**raw)
        except (OSError, ValueError, TypeError):
            return None

    def active(self, now: float) -> bool:
        """Whether a rank runs on the node now (a done or killed one does not)."""
        return self.phase != DONE and now - self.updated <= STALE_S


def load_path(state: Path) -> Path:
    return Path(state).parent / LOAD_FILE


def read_load(state: Path) -> RankLoad | None:
    return RankLoad.read(load_path(state))


def spread(node: str, device: object, what: str) -> float:
    """A stable factor near 1 (1 +- SPREAD_PER_MILLE / 1000) of one node's device: alike, never equal."""
    steps = 100 * SPREAD_PER_MILLE  # fine enough that two devices' factors differ
    return 1.0 + (stable_int(node, device, what, modulo=2 * steps + 1) - steps) / (1000.0 * 100)


@dataclass(frozen=True)
class GpuLoad:
    """What a GPU does for the rank of its node: phase compute, wait or idle, and its recent duty."""

    phase: str
    duty: float
    slow: bool = False

    @property
    def busy(self) -> bool:
        return self.phase in (COMPUTE, WAIT)


IDLE = GpuLoad("idle", 0.0)


def gpu_load(load: RankLoad | None, gpu: int, now: float, slow: bool = False) -> GpuLoad:
    if load is None or not load.active(now) or load.phase == HUNG or gpu not in load.gpus:
        return IDLE
    phase = COMPUTE if load.phase == COMPUTE and gpu in load.computing else WAIT
    return GpuLoad(phase, min(1.0, max(0.0, float(load.duty.get(str(gpu), 0.0)))), slow)


def power(node: str, gpu: int, g: GpuLoad) -> float:
    """Watts of a busy GPU: between spinning and computing, by its duty."""
    jitter = stable_int(node, gpu, "trainpower", modulo=POWER_SPREAD_W)
    spin, full = SPIN_POWER_W + jitter, COMPUTE_POWER_W + jitter
    watts = spin + g.duty * (full - spin)
    return min(watts, SLOW_GPU_POWER_CAP_W) if g.slow else watts


def gr_engine_active(node: str, gpu: int, g: GpuLoad) -> float:
    if not g.busy:
        return 0.0
    return (GR_ENGINE_SPIN + g.duty * (GR_ENGINE_COMPUTE - GR_ENGINE_SPIN)) * spread(node, gpu, "gract")


def tensor_active(node: str, gpu: int, g: GpuLoad) -> float:
    return g.duty * TENSOR_COMPUTE * spread(node, gpu, "tensor") if g.busy else 0.0


def dram_active(node: str, gpu: int, g: GpuLoad) -> float:
    return g.duty * DRAM_COMPUTE * spread(node, gpu, "dram") if g.busy else 0.0


def total_steps(load: RankLoad | None) -> int:
    """The steps completed on the node, by every job: what the traffic counters count (a dead rank's too)."""
    return load.total_steps if load is not None else 0


def nvlink_bytes(node: str, gpu: int, load: RankLoad | None) -> int:
    return int(total_steps(load) * NVLINK_BYTES_PER_STEP * spread(node, gpu, "nvlink"))


def ib_traffic(node: str, hca: str, load: RankLoad | None) -> dict[str, int]:
    """What a compute rail's port counters (sysfs ports/1/counters) gained from training: the data counters
    in 4-byte words as mlx5 counts them (node_exporter multiplies by 4), packets of one MTU."""
    out = {}
    for direction in ("xmit", "rcv"):
        sent = total_steps(load) * IB_BYTES_PER_STEP * spread(node, hca, f"ib{direction}")
        out[f"port_{direction}_data"] = int(sent // 4)
        out[f"port_{direction}_packets"] = out[f"unicast_{direction}_packets"] = int(sent // IB_MTU_BYTES)
    return out


class DutyMeter:
    """Each GPU's share of the last DUTY_WINDOW_S spent computing, from the intervals a rank computed."""

    def __init__(self, gpus: list[int], started: float) -> None:
        self.started = started
        self.spans: dict[int, list[tuple[float, float]]] = {gpu: [] for gpu in gpus}

    def computed(self, gpu: int, start: float, end: float) -> None:
        spans = self.spans[gpu]
        spans.append((start, end))
        if len(spans) > 64:  # a window of seconds never reaches back that many steps
            del spans[:-64]

    def cut(self, at: float) -> None:
        """The computing that was planned past `at` did not happen (the rank hung, or was stopped)."""
        for spans in self.spans.values():
            if spans and spans[-1][1] > at:
                spans[-1] = (spans[-1][0], max(spans[-1][0], at))

    def shares(self, now: float) -> dict[str, float]:
        since = max(self.started, now - DUTY_WINDOW_S)
        if now <= since:
            return {str(gpu): 1.0 for gpu in self.spans}
        return {str(gpu): round(sum(max(0.0, min(end, now) - max(start, since)) for start, end in spans)
                                / (now - since), 4) for gpu, spans in self.spans.items()}

