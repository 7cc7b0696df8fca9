"""Parse nccl-tests' `all_reduce_perf` output and judge it against a bus-bandwidth floor.

The output (github.com/NVIDIA/nccl-tests src/common.cu; a real one of 8 H100:
tests/fixtures/nccl/nccl-tests290_all_reduce_perf_8xH100_single_node.txt), abridged:

    # nThread 1 nGpus 8 minBytes 134217728 maxBytes 4294967296 step: 2(factor) warmup iters: 5 iters: 2 ...
    #  Rank  0 Group  0 Pid 295203 on    node005 device  0 [0x18] NVIDIA H100 80GB HBM3
    #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw ...
       134217728      33554432     float     sum      -1    613.3  218.85  382.99      0    614.3  218.48 ...
    # Out of bounds values : 0 OK
    # Avg bus bandwidth    : 439.369

Each row is one message size, measured out of place and in place: time (us), algorithm and bus
bandwidth (GB/s), and the count of wrong elements ("N/A" when run with `-c 0`, no check). Launched by
`srun --label` or `mpirun --tag-output`, every line carries the rank in front ("0: ", "[1,0]<stdout>:"):
tests/fixtures/nccl/nccl-tests290_all_reduce_perf_2x8xH100_RING_degraded.txt.

Bus bandwidth is what compares across GPU counts (nccl-tests doc/PERFORMANCE.md): all-reduce moves
2(n-1)/n of the data over the slowest link of its ring, so one slow NVLink halves the whole node's figure.
The verdict reads the largest message size, where the figure has reached its plateau.

run_all_reduce runs it over the node's own GPUs, one process, as the remediation ladder does after a diag of the
whole node (ladder/node_step.py).
"""

import re
import subprocess
from dataclasses import dataclass
from typing import Literal

from opsctl.errors import SourceUnavailable
from opsctl.gpu.tools import NCCL_TIMEOUT_S, Run, exited, run_tool

Verdict = Literal["pass", "fail", "not_checked"]
WHERE = "all_reduce_perf"
_RANK_PREFIX = re.compile(r"^(?:\s*\d+:\s?|\[\d+,\d+\]<std(?:out|err)>:)")
_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+\w+\s+\w+\s+-?\d+" + r"\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)" * 2 + r"\s*$")
_OUT_OF_BOUNDS = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)\s*$")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)\s*$")
_GPUS = re.compile(r"^#\s*nThread\s+\d+\s+nGpus\s+(\d+)\b")
_RANK = re.compile(r"^#\s+Rank\s+\d+\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)\s")


@dataclass(frozen=True)
class Row:
    size: int  # bytes
    busbw_out: float  # GB/s, out of place
    busbw_in: float  # GB/s, in place
    wrong: int | None  # wrong elements of both runs; None when the run did not check (-c 0, "N/A")

    @property
    def busbw(self) -> float:
        return max(self.busbw_out, self.busbw_in)


@dataclass(frozen=True)
class AllReduce:
    rows: tuple[Row, ...]
    ranks: int  # the "# Rank" lines: GPUs that took part (0 when the output leaves them out)
    hosts: tuple[str, ...]  # the hosts of those ranks, in order of first appearance
    out_of_bounds: int | None  # the "Out of bounds values" count; None when the run ended before it
    avg_busbw: float | None

    @property
    def last(self) -> Row | None:
        """The largest message size's row: the bandwidth plateau."""
        return max(self.rows, key=lambda r: r.size) if self.rows else None


def _number(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise SourceUnavailable(f"{WHERE}: {what} {text!r} is not a number") from None


def _wrong(text: str) -> int | None:
    if text == "N/A":
        return None
    if not text.isdigit():
        raise SourceUnavailable(f"{WHERE}: #wrong {text!r} is neither a count nor N/A")
    return int(text)


def parse_all_reduce(text: str) -> AllReduce:
    """The rows and totals of an `all_reduce_perf` run. A line of anything else is passed over (NCCL's
    own INFO lines, a launcher's); a row whose numbers do not read raises SourceUnavailable."""
    rows: list[Row] = []
    hosts: list[str] = []
    ranks = 0
    out_of_bounds: int | None = None
    avg: float | None = None
    for raw in text.splitlines():
        line = _RANK_PREFIX.sub("", raw, count=1)
        if match := _ROW.match(line):
            size = int(match.group(1))
            wrong = [_wrong(match.group(6)), _wrong(match.group(10))]
            counted = [w for w in wrong if w is not None]
            rows.append(Row(size, _number(match.group(5), "busbw"), _number(match.group(9), "busbw"),
                            sum(counted) if counted else None))
        elif match := _RANK.match(line):
            ranks += 1
            if match.group(1) not in hosts:
                hosts.append(match.group(1))
        elif match := _OUT_OF_BOUNDS.match(line):
            out_of_bounds = int(match.group(1))
        elif match := _AVG.match(line):
            avg = _number(match.group(1), "Avg bus bandwidth")
    return AllReduce(tuple(rows), ranks, tuple(hosts), out_of_bounds, avg)


def all_reduce_verdict(result: AllReduce, floor_gbps: float, gpus: int) -> tuple[Verdict, str]:
    """pass, fail or not_checked, and the words that say why (the evidence a drain reason carries).
    A run without a row, with fewer ranks than GPUs, or that stopped before its totals checked nothing."""
    last = result.last
    if last is None or result.out_of_bounds is None:
        return "not_checked", "nccl no result (the run ended before its totals)"
    if result.ranks and result.ranks < gpus:
        return "not_checked", f"nccl ran on {result.ranks} of {gpus} GPUs"
    wrong = sum(r.wrong or 0 for r in result.rows)
    if wrong or result.out_of_bounds:
        return "fail", f"nccl wrong={wrong} out_of_bounds={result.out_of_bounds} (data corrupted on the way)"
    busbw = f"busbw={last.busbw:.1f}GB/s at {human_size(last.size)}"
    if last.busbw < floor_gbps:
        return "fail", f"nccl {busbw} floor={floor_gbps:g}GB/s"
    return "pass", f"nccl {busbw}"


def human_size(size: int) -> str:
    """Bytes as nccl-tests' -b/-e take them: 16G, 128M, 8K, 100."""
    for unit, factor in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


@dataclass(frozen=True)
class AllReduceRun:
    """One all_reduce_perf over the node's GPUs, judged."""

    verdict: Verdict
    words: str  # `all-reduce busbw 478GB/s`, `... under the floor 431GB/s`, or why it checked nothing
    output: str  # what it printed, stdout then stderr: the evidence of anything but a pass


def run_all_reduce(program: str, size: str, gpus: int, floor_gbps: float, run: Run) -> AllReduceRun:
    """`all_reduce_perf -b <size> -e <size> -f 2 -g <gpus> -c 1` over the first `gpus` GPUs of this node, against
    the bus-bandwidth floor. A tool that cannot start, times out, exits with an error short of a failing result or
    prints no result checked nothing (not_checked), never a failure."""
    argv = [program, "-b", size, "-e", size, "-f", "2", "-g", str(gpus), "-c", "1"]
    done = run_tool(run, argv, NCCL_TIMEOUT_S)
    output = done.stdout + done.stderr
    try:
        result = parse_all_reduce(done.stdout)
    except SourceUnavailable as err:
        return AllReduceRun("not_checked", f"all-reduce not checked: {err}", output)
    verdict, detail = all_reduce_verdict(result, floor_gbps, gpus)
    if verdict != "fail" and done.returncode != 0:
        return AllReduceRun("not_checked", f"all-reduce not checked: {_failure(done)}", output)
    return AllReduceRun(verdict, _all_reduce_words(verdict, detail, result, floor_gbps), output)


def _failure(done: subprocess.CompletedProcess[str]) -> str:
    """Why a run that exited with an error said nothing: a timeout in its own words, else the tool's first line."""
    if done.returncode == 124:
        return f"timed out after {NCCL_TIMEOUT_S}s"
    return exited(done, WHERE)


def _all_reduce_words(verdict: Verdict, detail: str, result: AllReduce, floor_gbps: float) -> str:
    """The verdict's words as the ladder's answer and its audit record carry them: the bandwidth of a run that moved
    the data intact, else all_reduce_verdict's own words."""
    last = result.last
    corrupted = bool(result.out_of_bounds) or any(r.wrong for r in result.rows)
    if last is None or verdict == "not_checked":
        return f"all-reduce not checked: {detail.removeprefix('nccl ')}"
    if corrupted:
        return f"all-reduce {detail.removeprefix('nccl ')}"
    busbw = f"all-reduce busbw {last.busbw:.0f}GB/s"
    return busbw if verdict == "pass" else f"{busbw} under the floor {floor_gbps:g}GB/s"
