"""`opsctl node check --remediate-self`: the node's part of the remediation ladder (docs/remediation.md).

The head (`opsctl remediate`) asks through the node's Slurm reason; the node reads it, acts, and answers in
the same place:
  - `opsctl:reset gpuN ...` and no job runs here: `nvidia-smi -r -i N` (persistence mode off around it),
    then the checks;
  - `opsctl:reboot gpuN ...` and the node is back from that reboot (DOWN with that reason, no reboot
    flag left): the checks.
A reason may list several GPUs, `gpu1,gpu3` (a second fault found while the node was on the ladder,
opsctl/health/ladder_reason.py): each is reset in turn, and all are checked at once.
The checks are `dcgmi diag -r <remediation.validate_level> -j -i N[,M...]` (DCGM's `-i`/`--entity-id` takes a
comma-separated list of entities; opsctl.gpu.dcgm_diag judges each GPU's own results: a skipped or errored test
is "unchecked", never a pass, and one GPU's failure fails the whole) and this run's InfiniBand and storage
checks. The answer is `opsctl:validated-<pass|fail|unchecked> <gpus> <rules> after-<reset|reboot> <detail>`, set
through the actor, compared and set against the reason the node read (a person who changed it meanwhile wins).

What failed stays on the node for the vendor: `<state_dir>/validation/<UTC time>-<step>/` holds the diag's
JSON and `nvidia-smi -q -i N`, and after a reboot (the failure the head hands to RMA) NVIDIA's
`nvidia-bug-report.sh` output where it is installed. The GPU's serial number goes into the answer
(`serial=...`), so that the head's RMA bundle and `sinfo -R` name the board without logging in here.
"""

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from opsctl.actor.act import VALIDATED, Actor, Change, cap_reason
from opsctl.actor.ledger import Ledger
from opsctl.actor.result import ActionResult
from opsctl.config.schema import Config
from opsctl.errors import OpsctlError, SourceUnavailable
from opsctl.gpu.dcgm_diag import diag_verdict, process_dcgm_diag_output
from opsctl.gpu.tools import BUG_REPORT_TIMEOUT_S, DIAG_TIMEOUT_S, NVIDIA_SMI_TIMEOUT_S, Run, run_tool
from opsctl.ladder.reasons import REBOOT, RESET, Rung, rung_of, serial_word, validated_reason
from opsctl.slurm import Slurm, SlurmNode
from opsctl.slurm.reach import reach

# Each nvidia-smi call (-pm, -r, -q) and nvidia-bug-report.sh, which gathers logs for minutes on a busy node,
# within the node check unit's timeout, which the node_check role derives from the same bounds
# (opsctl.gpu.tools.node_step_bound_s).
RESET_TIMEOUT_S = NVIDIA_SMI_TIMEOUT_S
SERIAL = re.compile(r"^\s*Serial Number\s*:\s*(\S+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class StepOutcome:
    line: str  # what happened, for the node check's output
    reason: str = ""  # the validated-* reason set ("" when nothing was due)


def due(node: SlurmNode | None) -> Rung | None:
    """The ladder step this node must take now, None when there is none: the head's judgement of what opsctl may
    touch (opsctl/slurm/reach.py) holds here too, so a node that Slurm or a person holds takes no step."""
    rung = rung_of(node) if node is not None else None
    if rung is None or node is None or rung.fault.gpu_indexes is None:
        return None
    if rung.step == RESET and node.drained and not node.runs_jobs and reach(node).ok:
        return rung
    if rung.step == REBOOT and node.state == "down" and reach(node, down_ok=True).ok:
        return rung  # back from the reboot the head asked for: DOWN with its reason, nothing else set
    return None


def take_step(config: Config, slurm: Slurm, name: str, other_checks_passed: bool, other_failures: str,
              run: Run = subprocess.run, now: float | None = None, result: ActionResult | None = None) -> StepOutcome:
    """Reset or re-check this node's GPU when its reason asks, and answer with the result; the answer's change
    is in `result` (actor/result.py) when one is given."""
    now = time.time() if now is None else now
    try:
        node = slurm.nodes().get(name)
    except OpsctlError as err:  # the checks above still count; the ladder waits for the next run
        return StepOutcome(f"remediation: not checked, Slurm unreadable: {err}")
    rung = due(node)
    if rung is None or node is None:
        return StepOutcome(f"remediation: nothing asked of {name}")
    try:
        return _take(config, slurm, node, rung, run, now, other_failures if not other_checks_passed else "", result)
    except OpsctlError as err:  # the step may be done; unanswered, the head's step_timeout takes it on
        return StepOutcome(f"remediation: {rung.step} of {rung.fault.gpu_word} not answered: {err}")


def _take(config: Config, slurm: Slurm, node: SlurmNode, rung: Rung, run: Run, now: float,
          other_failures: str, action: ActionResult | None) -> StepOutcome:
    """The reset (when asked), the checks, the answer; `other_failures` ("" when none) fails a passing diag."""
    gpus = rung.fault.gpu_indexes
    assert gpus
    evidence = Evidence(Ledger(config), rung.step, now)
    for gpu in gpus if rung.step == RESET else ():
        reset = _reset(config.gpu.nvidia_smi, gpu, run)
        if reset.returncode != 0:
            why = " ".join((reset.stdout + reset.stderr).split()) or f"exit {reset.returncode}"
            failed = f"reset failed (exit {reset.returncode})" + (f" on GPU {gpu}" if len(gpus) > 1 else "")
            return _answer(config, slurm, node, rung, "unchecked", f"{failed}: {why}", now, action)
    result, detail = _validate(config, gpus, run, evidence, rung.step)
    if result == "pass" and other_failures:
        result, detail = "fail", other_failures
    return _answer(config, slurm, node, rung, result, detail, now, action)


def _reset(nvidia_smi: str, gpu: int, run: Run) -> subprocess.CompletedProcess[str]:
    """`nvidia-smi -r -i GPU`, persistence mode off around it: the persistence daemon holds the device, and
    nvidia-smi refuses the reset ("In use by another client", exit 255) while it does (NVIDIA/NVSentinel
    issue 1690). Persistence mode is turned back on whatever the reset did."""
    run_tool(run, [nvidia_smi, "-pm", "0", "-i", str(gpu)], RESET_TIMEOUT_S)
    try:
        return run_tool(run, [nvidia_smi, "-r", "-i", str(gpu)], RESET_TIMEOUT_S)
    finally:
        run_tool(run, [nvidia_smi, "-pm", "1", "-i", str(gpu)], RESET_TIMEOUT_S)


def _validate(config: Config, gpus: tuple[int, ...], run: Run, evidence: "Evidence", after: str) -> tuple[str, str]:
    """The diag's result on every GPU and its words; on anything but a pass, the evidence kept and the serial of
    the GPU that failed (the first of them) named."""
    level = config.remediation.validate_level
    entities = ",".join(str(gpu) for gpu in gpus)
    diag = run_tool(run, [config.gpu.dcgmi, "diag", "-r", str(level), "-j", "-i", entities], DIAG_TIMEOUT_S[level])
    suspects = list(gpus)
    try:
        verdict = diag_verdict(process_dcgm_diag_output(diag.stdout), gpus, level)
        result, detail = {"pass": "pass", "fail": "fail"}.get(verdict.verdict, "unchecked"), verdict.describe()
        named = [f.gpu for f in verdict.failures or verdict.unchecked]
        suspects = list(dict.fromkeys(named)) or suspects
    except SourceUnavailable as err:
        result, detail = "unchecked", str(err)
    if result == "pass":
        return result, detail
    queries = [run_tool(run, [config.gpu.nvidia_smi, "-q", "-i", str(gpu)], RESET_TIMEOUT_S).stdout
               for gpu in suspects]
    evidence.keep({"dcgmi-diag.json": diag.stdout, "nvidia-smi-q.txt": "\n".join(queries)})
    if after == REBOOT:
        _bug_report(config.gpu.nvidia_bug_report, run, evidence)
    found = SERIAL.search(queries[0])
    return result, f"{serial_word(found.group(1))} {detail}" if found else detail


def _bug_report(program: str, run: Run, evidence: "Evidence") -> None:
    """NVIDIA's `nvidia-bug-report.sh --output-file <evidence>/nvidia-bug-report.log` (it writes the file
    gzipped, `.log.gz`), which NVIDIA's support asks for with an RMA. Not installed (exit 127) or failing:
    the rest of the evidence stands alone."""
    if evidence.directory is not None and evidence.directory.is_dir():
        run_tool(run, [program, "--output-file", str(evidence.directory / "nvidia-bug-report.log")],
                 BUG_REPORT_TIMEOUT_S)


class Evidence:
    """The failing diag's evidence for the vendor, kept through the ledger (a node that cannot write it still
    answers); `directory` once kept."""

    def __init__(self, ledger: Ledger, step: str, now: float):
        self.ledger, self.step, self.now = ledger, step, now
        self.directory: Path | None = None

    def keep(self, files: dict[str, str]) -> None:
        self.directory = self.ledger.keep_evidence(self.step, self.now, files)


def _answer(config: Config, slurm: Slurm, node: SlurmNode, rung: Rung, result: str, detail: str,
            now: float, action: ActionResult | None = None) -> StepOutcome:
    reason = cap_reason(validated_reason(result, rung.fault, rung.step, detail), config.safety.reason_max_length)
    change = Change(node=node.name, event=VALIDATED, seen=node, reason=reason, checks=rung.fault.rules,
                    evidence=rung.fault.gpu_word, detail=detail, budget=False)
    with Actor(config, slurm, now, result=action) as actor:
        acted = actor.apply([change])
    if acted.dropped:
        return StepOutcome(f"remediation: {node.name} changed meanwhile, not answered ({acted.dropped[0][1]})")
    return StepOutcome(f"remediation: {rung.step} of {rung.fault.gpu_word} checked: {result}; reason {reason}",
                       reason)
