"""An emulated rank of a training job, for the lab's users and tests: it computes (sleeps) for --seconds,
or until it is stopped, and dies as a CUDA program dies when its node's GPU fails under it.

    train [--seconds 3600]

The rank reads its node's hardware state (OPSCTL_HW_STATE, set by the lab's shared wrapper) twice a
second. An XID whose documented effect ends the GPU's CUDA contexts (NVIDIA's XID catalog: 79 fallen off
the bus, 48 double-bit ECC, 95 uncontained ECC, 119 and 120 GSP errors), or a GPU that vanished, ends
it with rc 1 and the line PyTorch prints for a failed CUDA call, as a real job's rank dies in
`torch.distributed` when one GPU of the job is lost. The job's other ranks then end as NCCL's do when a
peer is gone: Slurm kills the step (srun --kill-on-bad-exit, the default of most launchers).
"""

import argparse
import os
import sys
import time

from opsctl_lab.hardware import NodeHardware
from opsctl_lab.hwtools.common import load, main_guard

CONTEXT_ENDING_XIDS = {48, 79, 95, 119, 120}
POLL_S = 0.5


def fatal(hw: NodeHardware) -> str:
    """The fault that ends this rank, in the words of its last line; "" while the GPUs work."""
    for fault in hw.active:
        if fault.fault == "xid" and fault.xid in CONTEXT_ENDING_XIDS:
            return f"GPU {fault.gpu}: CUDA error: unspecified launch failure (Xid {fault.xid})"
        if fault.fault == "gpu-missing":
            return f"GPU {fault.gpu}: CUDA error: no CUDA-capable device is detected"
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="train")
    parser.add_argument("--seconds", type=float, default=float("inf"))
    args = parser.parse_args(argv)
    rank = os.environ.get("SLURM_PROCID", "0")
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        said = fatal(load())
        if said:
            sys.stderr.write(f"[rank{rank}]: RuntimeError: {said}\n")
            return 1
        time.sleep(POLL_S)
    return 0


if __name__ == "__main__":
    sys.exit(main_guard(main))
