"""An emulated rank of a synchronous (data-parallel) training job, for the lab's users and tests: the ranks
of one job step compute a step (about a second) and all-reduce with each other, in lock-step, for --seconds
(then they end together, after the same step), or until they are stopped; and it dies as a CUDA program dies
when its node's GPU fails under it.

    srun train [--seconds 3600]

The rank reads its node's hardware state (OPSCTL_HW_STATE, set by the lab's shared wrapper) a few times a
second. A `slow-gpu` makes its steps longer, so that its peers wait for it at each all-reduce; under `hang`
it stops stepping but lives, and every peer waits for ever (opsctl_lab.training_rank). It publishes what its
GPUs do next to the state file, for the dcgm-exporter emulator (opsctl_lab.training_load). The ranks meet in
a directory of the job step under the lab directory (opsctl_lab.sync_job; OPSCTL_TRAIN_SYNC_DIR overrides it).

An XID whose documented effect ends the GPU's CUDA contexts (NVIDIA's XID catalog: 79 fallen off the bus,
48 double-bit ECC, 95 uncontained ECC, 119 and 120 GSP errors), or a GPU that vanished, ends the rank with
rc 1 and the line PyTorch prints for a failed CUDA call, as a real job's rank dies in `torch.distributed`
when one GPU of the job is lost. The job's other ranks then end as NCCL's do when a peer is gone: Slurm
kills the step (srun --kill-on-bad-exit, the default of most launchers).
"""

import argparse
import os
import signal
import sys
from pathlib import Path
from types import FrameType

from opsctl_lab.hardware import NodeHardware
from opsctl_lab.hwtools.common import load, main_guard, state_path
from opsctl_lab.sync_job import JobBarrier, job_directory
from opsctl_lab.training_load import load_path
from opsctl_lab.training_rank import RankFailed, TrainingRank

CONTEXT_ENDING_XIDS = {48, 79, 95, 119, 120}


def fatal(hw: NodeHardware) -> str:
    """The fault that ends this rank, in the words of its last line; "" while the GPUs work."""
    for fault in hw.active:
        if fault.fault == "xid" and fault.xid in CONTEXT_ENDING_XIDS:
            return f"GPU {fault.gpu}: CUDA error: unspecified launch failure (Xid {fault.xid})"
        if fault.fault == "gpu-missing":
            return f"GPU {fault.gpu}: CUDA error: no CUDA-capable device is detected"
    return ""


def sync_base() -> Path:
    """Where the ranks of a job meet: a directory every node shares. In the simulated lab the nodes' state
    files are <lab>/nodes/<node>/hardware.json (OPSCTL_HW_STATE_PATTERN), so <lab>/jobs; a node alone meets
    beside its own state."""
    if os.environ.get("OPSCTL_TRAIN_SYNC_DIR"):
        return Path(os.environ["OPSCTL_TRAIN_SYNC_DIR"])
    pattern = os.environ.get("OPSCTL_HW_STATE_PATTERN")
    return Path(pattern).parents[2] / "jobs" if pattern else state_path().parent / "jobs"


def rank_for(environ: dict[str, str] | os._Environ[str]) -> TrainingRank:
    """This rank of its job step, as srun describes it (SLURM_JOB_ID, SLURM_STEP_ID, SLURM_PROCID,
    SLURM_NTASKS); outside Slurm a job of one rank."""
    job = environ.get("SLURM_JOB_ID", f"local-{os.getpid()}")
    ranks = int(environ.get("SLURM_NTASKS") or environ.get("SLURM_NNODES") or 1)
    barrier = JobBarrier(job_directory(sync_base(), job, environ.get("SLURM_STEP_ID", "0")),
                         int(environ.get("SLURM_PROCID", "0")), ranks)
    # One rank of a node speaks for its GPUs (a job of one rank per node, as data-parallel jobs run here).
    speaks = environ.get("SLURM_LOCALID", "0") == "0"
    return TrainingRank(barrier, job, load, fatal, load_path(state_path()) if speaks else None)


def _stopped(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # scancel, a time limit, srun killing the step: leave no files behind


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="train")
    parser.add_argument("--seconds", type=float, default=float("inf"))
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stopped)
    rank = rank_for(os.environ)
    try:
        rank.run(args.seconds)
    except RankFailed as err:
        sys.stderr.write(f"[rank{rank.barrier.rank}]: RuntimeError: {err}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main_guard(main))
