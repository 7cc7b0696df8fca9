"""The node check's look at its GPUs, for `--drain-self` as Slurm's HealthCheckProgram: a node that boots with a
GPU off the bus, or whose NVSwitch fabric training failed, drains itself before it takes a job.

    $ nvidia-smi --query-gpu=index,fabric.state,fabric.status,persistence_mode --format=csv,noheader
    0, Completed, Success, Enabled
    Unable to determine the device handle for GPU0000:8A:00.0: Unknown Error      (exit 15: fell off the bus)

- `gpu-count` (device `node`): fewer GPUs answer than the node should have. What it should have is what Slurm
  was told (its NodeName line's gres): a node that provisioning gave a line of its own for a lost GPU is
  `opsctl hw quarantine`'s (opsctl:hw-mismatch), and counting it here again would hold it with a second reason
  after the GPU is back. Without Slurm's word, hardware.gpus_per_node.
- `gpu-fabric` (device `gpu<N>`): the GPU's fabric training ended, Completed, with a status other than Success.
  A fabric still training (Not Started, In Progress: Fabric Manager trains it for about a minute after each boot)
  is "not yet", never a failure, and a resume waits for it: slurmd's start already waited for it, bounded
  (slurm_compute's opsctl-gpus-ready), and a fabric that never trains is the head's to drain, from DCGM's own
  field (the catalog's fabric rules), as it sees every node at once.

Neither goes to the textfile: DCGM's catalog rules judge the GPUs on the head, from dcgm-exporter. A node whose
nvidia-smi is missing (exit 127) has no GPU stack to judge; one whose nvidia-smi fails otherwise (the driver not
loaded) lists no GPU, which drain_self.shared_shaped leaves to `opsctl health`, as it does a fabric that failed on
every GPU at once (a Fabric Manager rollout on every node).
"""

from dataclasses import dataclass

from opsctl.errors import SourceUnavailable
from opsctl.gpu.nvidia_smi import RC_FELL_OFF_BUS, CsvValue, parse_nvidia_smi_csv
from opsctl.gpu.tools import READY_QUERY_TIMEOUT_S, Run, exited, run_tool
from opsctl.ladder.ready import FABRIC_FAILED, FABRIC_TRAINING, READY_FIELDS, fabric_state
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


def check_gpus(nvidia_smi: str, run: Run, expected: int) -> GpuReport:
    """Query the GPUs once and judge them: `expected` GPUs, and no fabric whose training failed."""
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
    return judge(rows, expected)


def judge(rows: list[dict[str, CsvValue]], expected: int) -> GpuReport:
    listed = [row for row in rows if isinstance(row["index"], int)]
    found = [CheckResult(COUNT, NODE, len(listed) < expected)]
    lines = [f"gpus: {len(listed)} answer, {expected} expected"]
    waiting = []
    for row in listed:
        state, status = row["fabric.state"], row["fabric.status"]
        fabric = fabric_state(state, status)
        if fabric == FABRIC_TRAINING:
            waiting.append(f"gpu{row['index']} {state}")
            continue
        found.append(CheckResult(FABRIC, f"gpu{row['index']}", fabric == FABRIC_FAILED))
        if fabric == FABRIC_FAILED:
            lines.append(f"gpu{row['index']} fabric Completed ({status})")
    skipped = ""
    if waiting:
        skipped = f"not yet: fabric still training ({', '.join(waiting)})"
        lines.append(skipped)
    return GpuReport(found=tuple(found), answering=len(listed), skipped=skipped, lines=tuple(lines))


def every_gpu_failed(gpus: GpuReport, found: list[CheckResult]) -> bool:
    """No GPU answers, or the fabric failed on every GPU that does: the shape of a cause every node shares."""
    fabric = [r for r in found if r.check == FABRIC]
    return gpus.answering == 0 or (len(fabric) == gpus.answering and all(r.failed for r in fabric))


def slurm_gpus(gres: str) -> int | None:
    """The GPU count a node's configured gres gives ("gpu:h200:7(S:0-1)" -> 7); None when it names none."""
    for item in gres.split(","):
        parts = item.split("(", 1)[0].split(":")
        if parts[0] == "gpu" and len(parts) > 1 and parts[-1].isdigit():
            return int(parts[-1])
    return None
