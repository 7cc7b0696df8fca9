"""The node check's look at its GPUs, for `--drain-self` as Slurm's HealthCheckProgram: a node that boots with a
GPU off the bus, or whose NVSwitch fabric never trains, drains itself before it takes a job.

    $ nvidia-smi --query-gpu=index,fabric.state,fabric.status,persistence_mode --format=csv,noheader
    0, Completed, Success, Enabled
    Unable to determine the device handle for GPU0000:8A:00.0: Unknown Error      (exit 15: fell off the bus)

- `gpu-count` (device `node`): fewer GPUs answer than the node should have. What it should have is what Slurm
  was told (its NodeName line's gres): a node that provisioning gave a line of its own for a lost GPU is
  `opsctl hw quarantine`'s (opsctl:hw-mismatch), and counting it here again would hold it with a second reason
  after the GPU is back. Without Slurm's word, hardware.gpus_per_node.
- `gpu-fabric` (device `gpu<N>`): the GPU's fabric is not Completed with Success. Fabric Manager trains it after
  every boot (about a minute on HGX): while the node has been up less than remediation.ready_timeout an untrained
  fabric is "not yet", never a failure.

Neither goes to the textfile: DCGM's catalog rules judge the GPUs on the head, from dcgm-exporter. A node whose
nvidia-smi is missing (exit 127) has no GPU stack to judge; one whose nvidia-smi fails otherwise (the driver not
loaded) lists no GPU, which drain_self.shared_shaped leaves to `opsctl health`, as it does a fabric that trains on
no GPU at all (a Fabric Manager rollout on every node at once).
"""

from dataclasses import dataclass
from pathlib import Path

from opsctl.errors import SourceUnavailable
from opsctl.gpu.nvidia_smi import RC_FELL_OFF_BUS, CsvValue, parse_nvidia_smi_csv
from opsctl.gpu.tools import READY_QUERY_TIMEOUT_S, Run, exited, run_tool
from opsctl.ladder.ready import NO_FABRIC, READY_FIELDS
from opsctl.nodecheck.report import NODE, CheckResult

COUNT = "gpu-count"
FABRIC = "gpu-fabric"
CHECKS = (COUNT, FABRIC)
RC_NOT_FOUND = 127  # run_tool's exit status for a tool that could not start


@dataclass(frozen=True)
class GpuReport:
    found: tuple[CheckResult, ...] = ()
    answering: int | None = None  # how many GPUs nvidia-smi listed; None when it was not asked or not read
    skipped: str = ""  # why the GPUs were not judged (all or in part), "" when they were
    absent: bool = False  # no nvidia-smi at all: a node without a GPU stack
    lines: tuple[str, ...] = ()  # what was found, for the command's text

    @property
    def judged(self) -> bool:
        """Every GPU check was made (a resume waits for them), or there is nothing to judge."""
        return self.absent or not self.skipped


def read_uptime(path: str = "/proc/uptime") -> float | None:
    """Seconds since this node booted; None when unreadable."""
    try:
        return float(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def check_gpus(nvidia_smi: str, run: Run, expected: int, uptime_s: float | None, settle_s: float) -> GpuReport:
    """Query the GPUs once and judge them: `expected` GPUs, each fabric trained (only `not yet` while the node has
    been up at most `settle_s`)."""
    argv = [nvidia_smi, "--query-gpu=" + ",".join(READY_FIELDS), "--format=csv,noheader"]
    out = run_tool(run, argv, READY_QUERY_TIMEOUT_S)
    if out.returncode == RC_NOT_FOUND:
        return GpuReport(skipped=f"no GPU stack: {exited(out, 'nvidia-smi')}", absent=True)
    if out.returncode not in (0, RC_FELL_OFF_BUS):
        # The driver not loaded: no GPU answers. Counted as none, which drains nothing on its own (shared-shaped).
        why = exited(out, "nvidia-smi")
        return GpuReport(found=(CheckResult(COUNT, NODE, True),), answering=0,
                         lines=(f"gpus: none answer ({why}), {expected} expected",))
    try:
        rows = parse_nvidia_smi_csv(out.stdout, READY_FIELDS)
    except SourceUnavailable as err:
        return GpuReport(skipped=str(err))
    return judge(rows, expected, uptime_s, settle_s)


def judge(rows: list[dict[str, CsvValue]], expected: int, uptime_s: float | None, settle_s: float) -> GpuReport:
    listed = [row for row in rows if isinstance(row["index"], int)]
    found = [CheckResult(COUNT, NODE, len(listed) < expected)]
    lines = [f"gpus: {len(listed)} answer, {expected} expected"]
    settling = uptime_s is None or uptime_s <= settle_s
    waiting = []
    for row in listed:
        state, status = row["fabric.state"], row["fabric.status"]
        if state in NO_FABRIC or (state == "Completed" and status == "Success"):
            found.append(CheckResult(FABRIC, f"gpu{row['index']}", False))
        elif state != "Completed" and settling:
            waiting.append(f"gpu{row['index']} {state}")
        else:
            found.append(CheckResult(FABRIC, f"gpu{row['index']}", True))
            lines.append(f"gpu{row['index']} fabric {state}" + (f" ({status})" if state == "Completed" else ""))
    skipped = ""
    if waiting:
        up = "an unknown time" if uptime_s is None else f"{uptime_s:.0f}s"
        skipped = f"not yet: fabric still training ({', '.join(waiting)}), up {up}"
        lines.append(skipped)
    return GpuReport(found=tuple(found), answering=len(listed), skipped=skipped, lines=tuple(lines))


def every_gpu_failed(found: list[CheckResult]) -> bool:
    """No GPU answers, or the fabric failed on every GPU that does: the shape of a cause every node shares."""
    fabric = [r for r in found if r.check == FABRIC]
    if any(r.check == COUNT and r.failed for r in found) and not fabric:
        return True
    return bool(fabric) and all(r.failed for r in fabric)


def slurm_gpus(gres: str) -> int | None:
    """The GPU count a node's configured gres gives ("gpu:h200:7(S:0-1)" -> 7); None when it names none."""
    for item in gres.split(","):
        parts = item.split("(", 1)[0].split(":")
        if parts[0] == "gpu" and len(parts) > 1 and parts[-1].isdigit():
            return int(parts[-1])
    return None
