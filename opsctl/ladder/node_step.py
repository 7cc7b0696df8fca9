"""`opsctl node check --remediate-self`: the node's part of the remediation ladder (docs/remediation.md).

The head (`opsctl remediate`) asks through the node's Slurm reason; the node reads it, acts, and answers in
the same place:
  - `opsctl:reset gpuN ...` and no job runs here: `nvidia-smi -r -i N` (persistence mode off around it),
    then the checks;
  - `opsctl:reboot gpuN ...` and the node is back from that reboot (DOWN with that reason, no reboot
    flag left): the checks.
A reason may list several GPUs, `gpu1,gpu3` (a second fault found while the node was on the ladder,
opsctl/health/ladder_reason.py): each is reset in turn, and all are checked at once.
Before the checks the node waits, up to remediation.ready_timeout, until every GPU's NVSwitch fabric is trained
and persistence mode is on (ladder/ready.py): not ready by then is `unchecked` with what it waited for, never a
failure. The checks are `dcgmi diag -r <remediation.validate_level> -j -i N[,M...]` (DCGM's `-i`/`--entity-id`
takes a comma-separated list of entities; opsctl.gpu.dcgm_diag judges each GPU's own results: a skipped or
errored test is "unchecked", never a pass, and one GPU's failure fails the whole) over the GPUs of the reason, or
over every GPU of the node after a reboot and after an NVLink or NVSwitch fault (whole_node); and this run's
InfiniBand and storage checks. When the diag checked every GPU of a node that has more than one and passed,
nccl-tests' `all_reduce_perf` over all of them follows, against validate.nccl_busbw_floor_gbps: NVLinks that trained
at half their speed pass DCGM's diag, and the all-reduce moves data through the NVSwitches at the node's full
bandwidth. A busbw under the floor fails the step; a run that checked nothing is `unchecked`. A diag or an
all-reduce that fails after a reboot, the answer that sends a GPU to RMA, runs a second time: a failure that does
not repeat is `unchecked`, a person's. The answer is
`opsctl:validated-<pass|fail|unchecked> <gpus> <rules> after-<reset|reboot> <detail>`, set through the actor,
compared and set against the reason the node read (a person who changed it meanwhile wins).

What failed stays on the node for the vendor: `<state_dir>/validation/<UTC time>-<step>/` holds the diag's
JSON and `nvidia-smi -q -i N` (or the all-reduce's output), and after a reboot (the failure the head hands to
RMA) NVIDIA's `nvidia-bug-report.sh` output where it is installed. The GPU's serial number goes into the answer
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
from opsctl.gpu.nccl_tests import AllReduceRun, run_all_reduce
from opsctl.gpu.tools import BUG_REPORT_TIMEOUT_S, DIAG_TIMEOUT_S, NVIDIA_SMI_TIMEOUT_S, Run, run_tool
from opsctl.health.xid import xid_catalog
from opsctl.ladder.ready import Pace, wait_ready
from opsctl.ladder.reasons import BOARD_RESTARTS, RESET, Rung, rung_of, serial_word, validated_reason
from opsctl.ladder.reset import ResetOutcome, reset_gpus
from opsctl.slurm import Slurm, SlurmNode
from opsctl.slurm.reach import reach

# Each nvidia-smi -q and nvidia-bug-report.sh, which gathers logs for minutes on a busy node, within the node
# check unit's timeout, which the node_check role derives from the same bounds (opsctl.gpu.tools.node_step_bound_s).
QUERY_TIMEOUT_S = NVIDIA_SMI_TIMEOUT_S
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
    if rung.step in BOARD_RESTARTS and node.back_from_reboot:
        return rung  # back from the reboot (or power cycle) the head asked for: DOWN with its reason, nothing else
    return None


def take_step(config: Config, slurm: Slurm, name: str, other_checks_passed: bool, other_failures: str,
              run: Run = subprocess.run, now: float | None = None, result: ActionResult | None = None,
              pace: Pace = time) -> StepOutcome:
    """Reset or re-check this node's GPU when its reason asks, and answer with the result; the answer's change
    is in `result` (actor/result.py) when one is given. `pace`: the clock the wait for readiness runs on."""
    now = time.time() if now is None else now
    try:
        node = slurm.nodes().get(name)
    except OpsctlError as err:  # the checks above still count; the ladder waits for the next run
        return StepOutcome(f"remediation: not checked, Slurm unreadable: {err}")
    rung = due(node)
    if rung is None or node is None:
        return StepOutcome(f"remediation: nothing asked of {name}")
    try:
        return _take(config, slurm, node, rung, run, now, other_failures if not other_checks_passed else "", result,
                     pace)
    except OpsctlError as err:  # the step may be done; unanswered, the head's step_timeout takes it on
        return StepOutcome(f"remediation: {rung.step} of {rung.fault.gpu_word} not answered: {err}")


def _take(config: Config, slurm: Slurm, node: SlurmNode, rung: Rung, run: Run, now: float,
          other_failures: str, action: ActionResult | None, pace: Pace) -> StepOutcome:
    """The reset (when asked), the wait for the node to be ready, the checks, the answer; `other_failures` ("" when
    none) fails a passing diag."""
    gpus = rung.fault.gpu_indexes
    assert gpus
    evidence = Evidence(Ledger(config), rung.step, now)
    reset = reset_gpus(config, gpus, run) if rung.step == RESET else ResetOutcome()
    if reset.failed:
        return _answer(config, slurm, node, rung, "unchecked", reset.failed, now, action, note=reset.note)
    # Fabric Manager trains the fabric again after a boot or a reset: a diag before it completes fails every GPU.
    ready = wait_ready(config, run, pace)
    if not ready.ready:
        return _answer(config, slurm, node, rung, "unchecked", ready.words(), now, action, note=reset.note)
    # The reason's GPUs always: one that did not come back (lost, so not listed) must fail the diag, not be left out.
    every_gpu = whole_node(rung, ready.gpus)
    checked = tuple(sorted({*every_gpu, *gpus}))
    result, detail = _validate(config, checked, run, evidence, rung.step)
    bandwidth = ""
    if result == "pass" and every_gpu and len(checked) > 1:
        all_reduce, words = _all_reduce(config, len(checked), run, evidence, rung.step)
        # A pass keeps the diag's answer and adds its bandwidth to the audit record; anything else is the answer.
        result, detail, bandwidth = (result, detail, words) if all_reduce == "pass" else (all_reduce, words, "")
    if result == "pass" and other_failures:
        result, detail = "fail", other_failures
    # opsctl history shows how long the node waited, which GPUs the diag checked and the all-reduce's bandwidth.
    note = "; ".join(word for word in (ready.words(), f"diag on GPU {','.join(map(str, checked))}", bandwidth,
                                       reset.note) if word)
    return _answer(config, slurm, node, rung, result, detail, now, action, note=note)


def whole_node(rung: Rung, every_gpu: tuple[int, ...]) -> tuple[int, ...]:
    """Every GPU of the node when the step must check them all, else (): after a reboot (the whole board started
    again), and after a fault of the NVLinks or NVSwitches, which DCGM's tests between GPUs cross (pcie's
    peer-to-peer part): a pass of the one GPU named would resume a node whose links fail its neighbours."""
    if rung.step in BOARD_RESTARTS or any(_crosses_gpus(rule, rung.detail) for rule in rung.fault.rules):
        return every_gpu
    return ()


def _crosses_gpus(rule: str, detail: str) -> bool:
    """An NVLink, NVSwitch or fabric rule, or an XID whose NVIDIA workflow is the NVLink one (74, 136, 155 ...):
    by its own rule (`xid-74`), or the code its evidence names (`xid-reset ... xid=74`)."""
    if rule.startswith(("nvlink-", "nvswitch-", "fabric-")):
        return True
    own = re.fullmatch(r"xid-(\d+)", rule)
    codes = [int(own.group(1))] if own else [int(code) for code in re.findall(r"\bxid=(\d+)\b", detail)]
    return any("NVLINK" in (entry.immediate if (entry := xid_catalog().entries.get(code)) else "")
               for code in codes)


def _validate(config: Config, gpus: tuple[int, ...], run: Run, evidence: "Evidence", after: str) -> tuple[str, str]:
    """The diag's result on every GPU and its words; on anything but a pass, the evidence kept and the serial of
    the GPU that failed (the first of them) named."""
    diag, result, detail, suspects = _diag(config, gpus, run)
    if result == "fail" and after in BOARD_RESTARTS:
        # The answer sends the GPU to RMA: a failure must fail twice. Once only: a person's (unchecked).
        again = _diag(config, gpus, run)
        if again[1] != "fail":
            result, detail = "unchecked", f"failed once, then {again[1]} on a second run: {detail}"
        else:
            diag, detail, suspects = again[0], f"failed twice: {again[2]}", again[3]
    if result == "pass":
        return result, detail
    queries = [run_tool(run, [config.gpu.nvidia_smi, "-q", "-i", str(gpu)], QUERY_TIMEOUT_S).stdout
               for gpu in suspects]
    evidence.keep({"dcgmi-diag.json": diag.stdout, "nvidia-smi-q.txt": "\n".join(queries)})
    if after in BOARD_RESTARTS:
        _bug_report(config.gpu.nvidia_bug_report, run, evidence)
    found = SERIAL.search(queries[0])
    return result, f"{serial_word(found.group(1))} {detail}" if found else detail


def _diag(config: Config, gpus: tuple[int, ...], run: Run) -> tuple[subprocess.CompletedProcess[str], str, str,
                                                                     list[int]]:
    """One `dcgmi diag` over `gpus`: its output, result (pass, fail, unchecked), words, and the GPUs it named."""
    level = config.remediation.validate_level
    entities = ",".join(str(gpu) for gpu in gpus)
    diag = run_tool(run, [config.gpu.dcgmi, "diag", "-r", str(level), "-j", "-i", entities], DIAG_TIMEOUT_S[level])
    try:
        verdict = diag_verdict(process_dcgm_diag_output(diag.stdout), gpus, level)
    except SourceUnavailable as err:
        return diag, "unchecked", str(err), list(gpus)
    named = [f.gpu for f in verdict.failures or verdict.unchecked]
    result = {"pass": "pass", "fail": "fail"}.get(verdict.verdict, "unchecked")
    return diag, result, verdict.describe(), list(dict.fromkeys(named)) or list(gpus)


def _all_reduce(config: Config, gpus: int, run: Run, evidence: "Evidence", after: str) -> tuple[str, str]:
    """nccl-tests' all-reduce over the node's `gpus` GPUs after their diag passed: the result (pass, fail,
    unchecked) and its words (on a pass, the bandwidth). On anything but a pass its output is kept, with
    nvidia-bug-report.sh after a reboot; a failure after a reboot must fail twice, as the diag's."""
    first = _one_all_reduce(config, gpus, run)
    runs = [first]
    result, detail = _step_result(first), first.words
    if result == "fail" and after in BOARD_RESTARTS:
        again = _one_all_reduce(config, gpus, run)
        runs.append(again)
        if again.verdict != "fail":
            result, detail = "unchecked", f"failed once, then {_step_result(again)} on a second run: {detail}"
        else:
            detail = f"failed twice: {again.words}"
    if result != "pass":
        names = ("all_reduce_perf.txt", "all_reduce_perf-second-run.txt")
        evidence.keep({name: done.output for name, done in zip(names, runs, strict=False)})
        if after in BOARD_RESTARTS:
            _bug_report(config.gpu.nvidia_bug_report, run, evidence)
    return result, detail


def _one_all_reduce(config: Config, gpus: int, run: Run) -> AllReduceRun:
    return run_all_reduce(config.validate.all_reduce_perf, config.validate.nccl_bytes, gpus,
                          config.validate.nccl_busbw_floor_gbps, run)


def _step_result(done: AllReduceRun) -> str:
    """The answer's word for an all-reduce's verdict: one that checked nothing is unchecked."""
    return {"pass": "pass", "fail": "fail"}.get(done.verdict, "unchecked")


def _bug_report(program: str, run: Run, evidence: "Evidence") -> None:
    """NVIDIA's `nvidia-bug-report.sh --output-file <evidence>/nvidia-bug-report.log` (it writes the file
    gzipped, `.log.gz`), which NVIDIA's support asks for with an RMA. Not installed (exit 127) or failing:
    the rest of the evidence stands alone."""
    if evidence.directory is not None and evidence.directory.is_dir():
        run_tool(run, [program, "--output-file", str(evidence.directory / "nvidia-bug-report.log")],
                 BUG_REPORT_TIMEOUT_S)


class Evidence:
    """The failing diag's or all-reduce's evidence for the vendor, kept through the ledger (a node that cannot write
    it still answers); `directory` once kept."""

    def __init__(self, ledger: Ledger, step: str, now: float):
        self.ledger, self.step, self.now = ledger, step, now
        self.directory: Path | None = None

    def keep(self, files: dict[str, str]) -> None:
        self.directory = self.ledger.keep_evidence(self.step, self.now, files)


def _answer(config: Config, slurm: Slurm, node: SlurmNode, rung: Rung, result: str, detail: str,
            now: float, action: ActionResult | None = None, note: str = "") -> StepOutcome:
    """Set the answer through the actor; `note` goes to its audit record only (opsctl history), not the reason."""
    reason = cap_reason(validated_reason(result, rung.fault, rung.step, detail), config.safety.reason_max_length)
    change = Change(node=node.name, event=VALIDATED, seen=node, reason=reason, checks=rung.fault.rules,
                    evidence=rung.fault.gpu_word, detail=f"{detail}; {note}" if note else detail, budget=False)
    with Actor(config, slurm, now, result=action) as actor:
        acted = actor.apply([change])
    if acted.dropped:
        return StepOutcome(f"remediation: {node.name} changed meanwhile, not answered ({acted.dropped[0][1]})")
    return StepOutcome(f"remediation: {rung.step} of {rung.fault.gpu_word} checked: {result}; reason {reason}",
                       reason)
