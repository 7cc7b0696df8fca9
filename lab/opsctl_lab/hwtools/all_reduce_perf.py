"""Emulated nccl-tests `all_reduce_perf` on one lab machine's 8 H200 (single node, one process).

    all_reduce_perf -b 128M -e 16G -f 2 -g 8 [-c 1] [-n 20] [-w 5]

It prints what nccl-tests' src/common.cu prints, line for line (the real output of 8 H100:
tests/fixtures/nccl/nccl-tests290_all_reduce_perf_8xH100_single_node.txt), with bus bandwidth from a model
of the node's NVLink: rising with the message size towards a plateau of 482 GB/s, the figure that 8
GPUs on NVSwitch (NVLink 4, which H100 and H200 share) reach with nccl-tests (476.53 GB/s at 4 GiB in
that capture; Azure's H200 health check asks 431 GB/s at 16 GiB). `nvlink-slow` on any GPU of the run
halves the plateau: a ring moves at its slowest link. So does `nvlink-degraded` (a link trained at half its
speed, which DCGM's diag passes): NCCL spreads the all-reduce over channels on every link, and the collective
ends with its slowest channel. A GPU that fell off the bus (`gpu-missing`) ends the run as CUDA does, with rc 1
(the message is nccl-tests' CUDACHECK format; the lab's judgement of the CUDA error a lost GPU gives), and so
does a GPU whose NVSwitch fabric is not trained yet.

Started alone (no srun, no mpirun), as the remediation ladder runs it after a diag of every GPU, it runs over
the node's first `-g` GPUs: single_node() is that run, in process, for the tests.

Across nodes (an srun step of one task per node, nccl-tests built with MPI=1): rank 0 prints the table for
every rank, the others print nothing, as nccl-tests does. The data crosses the fabric on the HCAs
NCCL_IB_HCA names (all the rails when unset), a ring moving at its slowest rail: per rail, the lab fabric
model's RDMA rate between the two ends (opsctl_lab.hwtools.fabric_model, so `ib-slow` halves it) times
the share nccl-tests reaches, 47 GB/s on a healthy NDR rail (nccl-tests' maintainers: 46-48 GB/s per NDR
NIC, NVIDIA/nccl-tests issue 290). The step's nodes come from SLURM_STEP_NODELIST and each node's state
from OPSCTL_HW_STATE_PATTERN (a path with {node}), which the lab's shared wrapper sets.
"""

import argparse
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from opsctl_lab import hardware as hwm
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.hca_layout import GPU_BUSES
from opsctl_lab.hwtools.common import load, main_guard
from opsctl_lab.hwtools.fabric_model import PortView, bandwidth_gbps

PLATEAU_GBPS = 482.0
HALF_SIZE = 32 << 20  # bytes at which the model reaches half the plateau
FLOAT_BYTES = 4
NDR_NCCL_GBPS = 47.0  # GB/s nccl-tests reaches over one healthy NDR rail
NDR_WRITE_GBITS = 392.34  # Gb/s the fabric model gives that rail (a real CX-7 ib_write_bw)
_HOSTLIST = re.compile(r"([^,\[]+)(?:\[([^\]]+)\])?")
_SIZE = re.compile(r"^(\d+)([KMG]?)$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """nccl-tests' sizes: a count of bytes, or with K, M or G (powers of 1024)."""
    match = _SIZE.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}")
    return int(match.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[match.group(2).upper()]


def expand_hostlist(text: str) -> list[str]:
    """Slurm's gpu[001-002,005],head -> every name (what the lab's node names use of the notation)."""
    names = []
    for match in _HOSTLIST.finditer(text.strip()):
        prefix, ranges = match.group(1).lstrip(","), match.group(2)
        if ranges is None:
            names.append(prefix)
            continue
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            names += [f"{prefix}{n:0{len(first)}d}" for n in range(int(first), int(last or first) + 1)]
    return [n for n in names if n]


@dataclass(frozen=True)
class Rank:
    hw: NodeHardware
    gpu: int


# The faults whose GPU moves its share of an all-reduce at half the rate: links that carry half (`nvlink-slow`),
# and a link trained at half its speed (`nvlink-degraded`), whose channels the whole collective waits for.
HALF_RATE_FAULTS = ("nvlink-slow", "nvlink-degraded")


def nvlink_gbps(hw: NodeHardware, gpus: list[int], size: int) -> float:
    slowed = any(hw.has(fault, gpu=g) for fault in HALF_RATE_FAULTS for g in gpus)
    plateau = PLATEAU_GBPS / (2 if slowed else 1)
    return plateau * size / (size + HALF_SIZE)


def fabric_gbps(nodes: list[NodeHardware], hcas: list[str], size: int) -> float:
    """A ring over the nodes on each HCA, at the slowest rail of the slowest hop, summed over the HCAs."""
    hops = list(zip(nodes, nodes[1:] + nodes[:1], strict=True))[: len(nodes) if len(nodes) > 2 else 1]
    slowest = min(bandwidth_gbps(PortView.of(a, hca), PortView.of(b, hca))[1] for a, b in hops for hca in hcas)
    return len(hcas) * slowest / NDR_WRITE_GBITS * NDR_NCCL_GBPS * size / (size + HALF_SIZE)


def busbw_gbps(ranks: list[Rank], hcas: list[str], size: int) -> float:
    nodes = list({r.hw.node: r.hw for r in ranks}.values())
    within = min(nvlink_gbps(hw, [r.gpu for r in ranks if r.hw is hw], size) for hw in nodes)
    return within if len(nodes) == 1 else min(within, fabric_gbps(nodes, hcas, size))


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


def _measure(ranks: list[Rank], hcas: list[str], size: int, place: str) -> tuple[float, float, float]:
    n = len(ranks)
    jitter = 1.0 - hwm.stable_int(ranks[0].hw.node, size, place, modulo=150) / 10000.0  # within 1.5 %, stable
    busbw = busbw_gbps(ranks, hcas, size) * jitter
    algbw = busbw * n / (2 * (n - 1)) if n > 1 else busbw
    return size / (algbw * 1e3), algbw, busbw


def report(ranks: list[Rank], hcas: list[str], sizes: list[int], args: argparse.Namespace) -> str:
    lines = [f"# nThread 1 nGpus {args.ngpus} minBytes {sizes[0]} maxBytes {sizes[-1]} step: {args.stepfactor}(factor) "
             f"warmup iters: {args.warmup_iters} iters: {args.iters} agg iters: 1 validation: {args.check} graph: 0",
             "#", "# Using devices"]
    # device: the CUDA index within the process (CUDA_VISIBLE_DEVICES renumbers), the bus id its GPU's
    local = [sum(1 for other in ranks[:i] if other.hw is r.hw) % args.ngpus for i, r in enumerate(ranks)]
    lines += [f"#  Rank {rank:2d} Group  0 Pid {os.getpid() + rank // args.ngpus:6d} on {r.hw.node:>10} device "
              f"{local[rank]:2d} [0x{GPU_BUSES[r.gpu]}] {hwm.GPU_MODEL}" for rank, r in enumerate(ranks)]
    lines += ["#",
              "#" + " " * 62 + "out-of-place" + " " * 23 + "in-place",
              "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   "
              "busbw #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  "
              "(GB/s)"]
    wrong = "0" if args.check else "N/A"
    total = 0.0
    for size in sizes:
        out, inplace = _measure(ranks, hcas, size, "out"), _measure(ranks, hcas, size, "in")
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


def _visible_gpus(count: int) -> list[int]:
    """The process's GPUs: the first `count` of CUDA_VISIBLE_DEVICES (Slurm's, or the caller's own)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    listed = [int(g) for g in visible.split(",") if g.strip().isdigit()] if visible else list(range(hwm.GPUS_PER_NODE))
    return listed[:count]


def _hcas(hw: NodeHardware) -> list[str]:
    """NCCL_IB_HCA: "=mlx5_3" (exactly), "^mlx5_0" (all but), "mlx5_3:1"; unset: every rail."""
    rails = hw.hca_layout().rails
    spec = os.environ.get("NCCL_IB_HCA", "").strip()
    if not spec:
        return rails
    exclude = spec.startswith("^")
    named = [part.split(":", 1)[0] for part in spec.lstrip("^=").split(",") if part]
    return [h for h in rails if h not in named] if exclude else [h for h in named if h in rails]


def _nodes(own: NodeHardware) -> list[NodeHardware]:
    names = expand_hostlist(os.environ.get("SLURM_STEP_NODELIST", os.environ.get("SLURM_JOB_NODELIST", "")))
    pattern = os.environ.get("OPSCTL_HW_STATE_PATTERN")
    if len(names) < 2 or not pattern:
        return [own]
    return [own if name == own.node else NodeHardware.load(Path(pattern.format(node=name)), name) for name in names]


@dataclass(frozen=True)
class Printed:
    """What a run prints and its exit code."""

    stdout: str
    rc: int
    stderr: str = ""


def _refused(hw: NodeHardware, args: argparse.Namespace, gpus: list[int], now: float) -> Printed | None:
    """How the run ends before its table, None when it does not: arguments nccl-tests refuses, a GPU lost, or one
    whose fabric is not trained."""
    if not 1 <= args.ngpus <= hwm.GPUS_PER_NODE or args.stepfactor < 2 or args.minbytes > args.maxbytes:
        return Printed("", 1, "Invalid arguments\n")
    lost = [g for g in gpus if not hw.gpu_present(g)]
    if lost or len(gpus) < args.ngpus:
        return Printed(f"{hw.node}: Test CUDA failure common.cu:892 'unknown error'\n"
                       f" .. {hw.node} pid {os.getpid()}: Test failure common.cu:1040\n", 1)
    if any(hw.fabric_status(g, now) != hwm.FABRIC_SUCCESS for g in gpus):
        # CUDA_ERROR_SYSTEM_NOT_READY before Fabric Manager trained the fabric; nccl-tests prints it so
        # (NVIDIA/nccl-tests issue 264: "Test CUDA failure common.cu:941 'system not yet initialized'").
        return Printed(f"{hw.node}: Test CUDA failure common.cu:941 'system not yet initialized'\n"
                       f" .. {hw.node} pid {os.getpid()}: Test failure common.cu:1040\n", 1)
    return None


def _sizes(args: argparse.Namespace) -> list[int]:
    sizes = [args.minbytes]
    while sizes[-1] * args.stepfactor <= args.maxbytes:
        sizes.append(sizes[-1] * args.stepfactor)
    return sizes


def single_node(hw: NodeHardware, argv: list[str], now: float) -> Printed:
    """`all_reduce_perf ARGS` started alone on this node: over its first `-g` GPUs (no CUDA_VISIBLE_DEVICES), their
    NVLinks only."""
    args = _parser().parse_args(argv)
    gpus = list(range(hwm.GPUS_PER_NODE))[:args.ngpus]
    refused = _refused(hw, args, gpus, now)
    if refused is not None:
        return refused
    return Printed(report([Rank(hw, gpu) for gpu in gpus], [], _sizes(args), args), 0)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    hw = load()
    gpus = _visible_gpus(args.ngpus)
    refused = _refused(hw, args, gpus, time.time())
    if refused is not None:
        sys.stdout.write(refused.stdout)
        sys.stderr.write(refused.stderr)
        return refused.rc
    if os.environ.get("SLURM_PROCID", "0") != "0":
        return 0  # nccl-tests: only rank 0 prints
    nodes = _nodes(hw)
    hcas = _hcas(hw)
    if len(nodes) > 1 and not hcas:
        sys.stdout.write(f"{hw.node}: NCCL WARN NET/IB : No device found.\n")
        return 1
    ranks = [Rank(node, gpu) for node in nodes for gpu in gpus]
    sys.stdout.write(report(ranks, hcas, _sizes(args), args))
    return 0


if __name__ == "__main__":
    sys.exit(main_guard(main))
