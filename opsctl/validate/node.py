"""`opsctl node validate`: the active checks on this node, as a validation job runs them (docs/validate.md).

- `dcgmi diag -r <validate.diag_level> -j` over every GPU (opsctl.gpu.dcgm_diag);
- nccl-tests' `all_reduce_perf -b S -e S -g <GPUs> -c 1` at `validate.nccl_bytes`, against
  `validate.nccl_busbw_floor_gbps` (opsctl.gpu.nccl_tests).

A test that was skipped, errored, timed out or could not start is "not checked": never a pass. The results
go to node_exporter's textfile collector (one file, written atomically), where the catalog rule `validate`
drains on them through `opsctl health`'s safety rails:

    opsctl_node_validate{test="nccl",device="node"} 0                  passed
    opsctl_node_validate{test="dcgm-diag",device="gpu3"} 1.8e+09       failed: the value is when it ran
    opsctl_node_validate_nccl_busbw_gbps 476.5                         the bus bandwidth measured
    opsctl_node_validate_timestamp_seconds 1.8e+09                     when this run ended

A preflight's verdict on the node's rails goes to a file beside it (pairs_textfile), with its own time:

    opsctl_node_validate_pairs_timestamp_seconds 1.8e+09               when it was recorded
    opsctl_node_validate{test="nccl-pair",device="mlx5_3"} 1.8e+09     a rail the preflight named

A failure's value is the run's time, not 1: the rule remembers what it drained on (memory: level), so a
person who resumes the node is not overruled by the same result, while a later run that fails again is a
new event. A test not checked has no series.
"""

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from opsctl.config.schema import Config
from opsctl.errors import SourceUnavailable
from opsctl.gpu.dcgm_diag import diag_verdict, process_dcgm_diag_output
from opsctl.gpu.nccl_tests import Verdict, all_reduce_verdict, parse_all_reduce
from opsctl.gpu.tools import DIAG_TIMEOUT_S, Run, run_tool

NODE = "node"
NCCL, DIAG = "nccl", "dcgm-diag"
NCCL_PAIR = "nccl-pair"  # opsctl validate --preflight: two nodes, one rail at a time
TIMESTAMP = "opsctl_node_validate_timestamp_seconds"  # when this node's own run ended
PAIRS_TIMESTAMP = "opsctl_node_validate_pairs_timestamp_seconds"  # when a preflight recorded its rails
# The tests whose results another run writes, in a file of their own with its own time.
RESULT_TIMES = {NCCL_PAIR: PAIRS_TIMESTAMP}
# all_reduce_perf at 16 GiB on 8 H200 takes seconds; starting NCCL and the CUDA contexts, up to a minute.
NCCL_TIMEOUT_S = 300


@dataclass(frozen=True)
class TestOutcome:
    test: str  # nccl, dcgm-diag
    verdict: Verdict  # pass, fail, not_checked
    detail: str  # why, in words
    devices: tuple[str, ...] = (NODE,)  # what failed: gpu3, ... or the node itself


@dataclass
class Validation:
    outcomes: list[TestOutcome] = field(default_factory=list)
    busbw_gbps: float | None = None
    ended: float = 0.0

    @property
    def verdict(self) -> Verdict:
        verdicts = {o.verdict for o in self.outcomes}
        return "fail" if "fail" in verdicts else "not_checked" if "not_checked" in verdicts or not verdicts \
            else "pass"


def _nccl(config: Config, run: Run) -> tuple[TestOutcome, float | None]:
    size = config.validate.nccl_bytes
    argv = [config.validate.all_reduce_perf, "-b", size, "-e", size, "-f", "2",
            "-g", str(config.hardware.gpus_per_node), "-c", "1"]
    done = run_tool(run, argv, NCCL_TIMEOUT_S)
    try:
        result = parse_all_reduce(done.stdout)
    except SourceUnavailable as err:
        return TestOutcome(NCCL, "not_checked", str(err)), None
    verdict, detail = all_reduce_verdict(result, config.validate.nccl_busbw_floor_gbps,
                                         config.hardware.gpus_per_node)
    if done.returncode != 0 and verdict != "fail":
        verdict, detail = "not_checked", f"nccl exit {done.returncode}: {_failure_line(done)}".strip()
    busbw = result.last.busbw if result.last is not None and verdict != "not_checked" else None
    return TestOutcome(NCCL, verdict, detail), busbw


def _failure_line(done: subprocess.CompletedProcess[str]) -> str:
    """What a failed run said first about its failure (nccl-tests: "host: Test CUDA failure file:line '...'"),
    else its last line."""
    lines = [line.strip() for line in (done.stdout + "\n" + done.stderr).splitlines() if line.strip()]
    return next((line for line in lines if "failure" in line.lower() or "error" in line.lower()),
                lines[-1] if lines else "")


def _diag(config: Config, run: Run) -> TestOutcome:
    level = config.validate.diag_level
    done = run_tool(run, [config.gpu.dcgmi, "diag", "-r", str(level), "-j"], DIAG_TIMEOUT_S[level])
    try:
        found = diag_verdict(process_dcgm_diag_output(done.stdout), range(config.hardware.gpus_per_node), level)
    except SourceUnavailable as err:
        return TestOutcome(DIAG, "not_checked", f"{err}{f' ({done.stderr.strip()})' if done.stderr.strip() else ''}")
    gpus = tuple(sorted({f"gpu{f.gpu}" for f in found.failures})) or (NODE,)
    return TestOutcome(DIAG, found.verdict, f"dcgm-diag r{level} {found.describe()}", gpus)


def validate_node(config: Config, run: Run = subprocess.run, now: float | None = None) -> Validation:
    """Run every test; none stops the others."""
    diag = _diag(config, run)
    nccl, busbw = _nccl(config, run)
    return Validation([diag, nccl], busbw, time.time() if now is None else now)


RESULT_HEADER = ["# HELP opsctl_node_validate Result of an active check of opsctl node validate, per test and device: "
                 "0 passed, else the time it failed.",
                 "# TYPE opsctl_node_validate gauge"]


def pairs_textfile(textfile: Path) -> Path:
    """Where a preflight's multi-node result goes: beside the node's own results (node_exporter merges the
    two files), so that neither run erases the other's."""
    return textfile.with_name(f"{textfile.stem}-pairs{textfile.suffix}")


def pairs_metrics_text(failed_hcas: list[str], now: float) -> str:
    """The preflight's verdict on this node's rails: each rail it named, failed at `now`; else a pass. The
    file carries its own time: a pass (0) reads the same from any preflight, and the preflight waits for
    this time, not the node's own run's, before it reads the verdict."""
    lines = [f'opsctl_node_validate{{test="{NCCL_PAIR}",device="{hca}"}} {now:.3f}' for hca in failed_hcas] or [
        f'opsctl_node_validate{{test="{NCCL_PAIR}",device="{NODE}"}} 0']
    stamp = [f"# HELP {PAIRS_TIMESTAMP} When opsctl validate --preflight last recorded this node's rails.",
             f"# TYPE {PAIRS_TIMESTAMP} gauge",
             f"{PAIRS_TIMESTAMP} {now:.3f}"]
    return "\n".join(stamp + RESULT_HEADER + lines) + "\n"


def metrics_text(validation: Validation) -> str:
    lines = list(RESULT_HEADER)
    for outcome in validation.outcomes:
        if outcome.verdict == "not_checked":
            continue
        value = f"{validation.ended:.3f}" if outcome.verdict == "fail" else "0"
        lines += [f'opsctl_node_validate{{test="{outcome.test}",device="{device}"}} {value}'
                  for device in outcome.devices]
    if validation.busbw_gbps is not None:
        lines += ["# HELP opsctl_node_validate_nccl_busbw_gbps The all-reduce bus bandwidth the last validation "
                  "measured (GB/s).",
                  "# TYPE opsctl_node_validate_nccl_busbw_gbps gauge",
                  f"opsctl_node_validate_nccl_busbw_gbps {validation.busbw_gbps:.1f}"]
    lines += [f"# HELP {TIMESTAMP} When opsctl node validate last ran.",
              f"# TYPE {TIMESTAMP} gauge",
              f"{TIMESTAMP} {validation.ended:.3f}"]
    return "\n".join(lines) + "\n"
