"""Emulated nccl-tests `all_reduce_perf` on one lab machine's 8 H200 (single node, one process).

    all_reduce_perf -b 128M -e 16G -f 2 -g 8 [-c 1] [-n 20] [-w 5]

It prints what nccl-tests' src/common.cu prints, line for line (the real output of 8 H100:
tests/fixtures/nccl/nccl-tests290_all_reduce_perf_8xH100_single_node.txt), with bus bandwidth from a model
of the node's NVLink: rising with the message size towards a plateau of 482 GB/s, the figure that 8
GPUs on NVSwitch (NVLink 4, which H100 and H200 share) reach with nccl-tests (476.53 GB/s at 4 GiB in
that capture; Azure's H200 health check asks 431 GB/s at 16 GiB). `nvlink-slow` on any GPU of the run
halves the plateau: a ring moves at its slowest link. A GPU that fell off the bus (`gpu-missing`) ends the
run as CUDA does, with rc 1 (the message is nccl-tests' CUDACHECK format; the lab's judgement of the
CUDA error a lost GPU gives).
"""

import argparse
import os
import re
import sys

from opsctl_lab import hardware as hwm
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.hca_layout import GPU_BUSES
from opsctl_lab.hwtools.common import load, main_guard

PLATEAU_GBPS = 482.0
HALF_SIZE = 32 << 20  # bytes at which the model reaches half the plateau
FLOAT_BYTES = 4
_SIZE = re.compile(r"^(\d+)([KMG]?)$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """nccl-tests' sizes: a count of bytes, or with K, M or G (powers of 1024)."""
    match = _SIZE.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}")
    return int(match.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[match.group(2).upper()]


def busbw_gbps(hw: NodeHardware, gpus: list[int], size: int) -> float:
    plateau = PLATEAU_GBPS / (2 if any(hw.has("nvlink-slow", gpu=g) for g in gpus) else 1)
    return plateau * size / (size + HALF_SIZE)


def _time(usec: float) -> str:
    """common.cu's time column: fewer decimals as it grows."""
    return f"{usec:7.0f}" if usec >= 10000 else f"{usec:7.1f}" if usec >= 100 else f"{usec:7.2f}"


def row(size: int, out: tuple[float, float, float], inplace: tuple[float, float, float], wrong: str) -> str:
    """One result line: size, count, type, redop, root, then time (us), algbw, busbw and #wrong out of
    place and in place."""
    cols = f"{size:12d}  {size // FLOAT_BYTES:12d}  {'float':>8}  {'sum':>6}  {-1:6d}"
    for usec, algbw, busbw in (out, inplace):
        cols += f"  {_time(usec)}  {algbw:6.2f}  {busbw:6.2f}  {wrong:>5}"
    return cols


def _measure(hw: NodeHardware, gpus: list[int], size: int, place: str) -> tuple[float, float, float]:
    n = len(gpus)
    jitter = 1.0 - hwm.stable_int(hw.node, size, place, modulo=150) / 10000.0  # within 1.5 %, stable
    busbw = busbw_gbps(hw, gpus, size) * jitter
    algbw = busbw * n / (2 * (n - 1)) if n > 1 else busbw
    return size / (algbw * 1e3), algbw, busbw


def report(hw: NodeHardware, gpus: list[int], sizes: list[int], args: argparse.Namespace) -> str:
    lines = [f"# nThread 1 nGpus {len(gpus)} minBytes {sizes[0]} maxBytes {sizes[-1]} step: {args.stepfactor}(factor) "
             f"warmup iters: {args.warmup_iters} iters: {args.iters} agg iters: 1 validation: {args.check} graph: 0",
             "#", "# Using devices"]
    lines += [f"#  Rank {rank:2d} Group  0 Pid {os.getpid():6d} on {hw.node:>10} device {gpu:2d} "
              f"[0x{GPU_BUSES[gpu]}] {hwm.GPU_MODEL}" for rank, gpu in enumerate(gpus)]
    lines += ["#",
              "#" + " " * 62 + "out-of-place" + " " * 23 + "in-place",
              "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   "
              "busbw #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  "
              "(GB/s)"]
    wrong = "0" if args.check else "N/A"
    total = 0.0
    for size in sizes:
        out, inplace = _measure(hw, gpus, size, "out"), _measure(hw, gpus, size, "in")
        lines.append(row(size, out, inplace, wrong))
        total += out[2] + inplace[2]
    lines += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {total / (2 * len(sizes)):g}", "#"]
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="all_reduce_perf")
    p.add_argument("-b", "--minbytes", type=parse_size, default=32 << 20)
    p.add_argument("-e", "--maxbytes", type=parse_size, default=32 << 20)
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("-g", "--ngpus", type=int, default=1)
    p.add_argument("-t", "--nthreads", type=int, default=1)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", type=int, default=5)
    p.add_argument("-c", "--check", type=int, default=1)
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    hw = load()
    if not 1 <= args.ngpus <= hwm.GPUS_PER_NODE or args.stepfactor < 2 or args.minbytes > args.maxbytes:
        sys.stderr.write("Invalid arguments\n")
        return 1
    gpus = list(range(args.ngpus))
    lost = [g for g in gpus if not hw.gpu_present(g)]
    if lost:
        sys.stdout.write(f"{hw.node}: Test CUDA failure common.cu:892 'unknown error'\n"
                         f" .. {hw.node} pid {os.getpid()}: Test failure common.cu:1040\n")
        return 1
    sizes = [args.minbytes]
    while sizes[-1] * args.stepfactor <= args.maxbytes:
        sizes.append(sizes[-1] * args.stepfactor)
    sys.stdout.write(report(hw, gpus, sizes, args))
    return 0


if __name__ == "__main__":
    sys.exit(main_guard(main))
