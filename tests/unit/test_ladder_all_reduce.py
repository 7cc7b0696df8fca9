"""The node's ladder step after a diag of every GPU (docs/remediation.md, "The all-reduce"): nccl-tests'
all_reduce_perf over all the node's GPUs against validate.nccl_busbw_floor_gbps, twice after a reboot before a
failure stands. Against the lab's emulated H200 (tests/unit/emulated_gpus.py), whose all_reduce_perf runs in process
(opsctl_lab.hwtools.all_reduce_perf.single_node)."""

import json
import subprocess

from opsctl.config import parse_config
from opsctl.gpu import tools
from opsctl.gpu.nccl_tests import all_reduce_verdict, parse_all_reduce, run_all_reduce
from opsctl.ladder.node_step import take_step
from opsctl_lab.hardware import FABRIC_TRAINING_S, GPUS_PER_NODE, NodeHardware
from opsctl_lab.hwtools.all_reduce_perf import PLATEAU_GBPS, single_node
from tests.unit.emulated_gpus import NOW, EmulatedGpus
from tests.unit.fakes import FakeSlurm, node

REBOOTED = "opsctl:reboot gpu2 xid-79 xid=79 count=1"
NVLINK_RESET = "opsctl:reset gpu2 nvlink-degraded gpu2 link7 at 50% of its full speed"
FLOOR = 431  # validate.nccl_busbw_floor_gbps's default


def setup(tmp_path, reason, state="down", flags=(), gpus_class=EmulatedGpus):
    config = parse_config({}, "t", {"OPSCTL_STATE_DIR": str(tmp_path / "state")})
    hw = NodeHardware(node="gpu007")
    slurm = FakeSlurm({"gpu007": node("gpu007", state=state, flags=flags, reason=reason)})
    return config, hw, slurm, gpus_class(hw)


def step(config, slurm, gpus):
    return take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)


def all_reduces(gpus: EmulatedGpus) -> list[str]:
    return [call for call in gpus.calls if call.startswith("-b ")]


def diags(gpus: EmulatedGpus) -> list[str]:
    return [call for call in gpus.calls if call.startswith("diag")]


def audit(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "state" / "audit.jsonl").read_text().splitlines()]


def kept(tmp_path) -> set[str]:
    [directory] = (tmp_path / "state" / "validation").iterdir()
    return {path.name for path in directory.iterdir()}


class SlowOnce(EmulatedGpus):
    """An NVLink at half speed during the first all-reduce only (a transient one)."""

    def __call__(self, argv, **kwargs):
        if argv[0].endswith("all_reduce_perf") and not all_reduces(self):
            self.hw.inject("nvlink-degraded:7", gpu=2, now=self.now)
            try:
                return super().__call__(argv, **kwargs)
            finally:
                self.hw.clear(self.now)
        return super().__call__(argv, **kwargs)


class AllReduceTimesOut(EmulatedGpus):
    def __call__(self, argv, **kwargs):
        if argv[0].endswith("all_reduce_perf"):
            self.calls.append(" ".join(argv[1:]))
            raise subprocess.TimeoutExpired(argv, kwargs["timeout"])
        return super().__call__(argv, **kwargs)


# ---- after a whole-node diag that passed -------------------------------------------------------------------------
def test_a_pass_after_a_reboot_runs_the_all_reduce_over_every_gpu_and_its_bandwidth_is_in_the_audit_record(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, REBOOTED)
    answer = step(config, slurm, gpus)
    assert all_reduces(gpus) == ["-b 16G -e 16G -f 2 -g 8 -c 1"]
    assert gpus.calls.index(all_reduces(gpus)[0]) > gpus.calls.index(diags(gpus)[0])  # after the diag passed
    assert answer.reason == "opsctl:validated-pass gpu2 xid-79 after-reboot pass"  # the reason as before
    detail = audit(tmp_path)[-1]["detail"]
    assert detail.startswith("pass; ") and "; diag on GPU 0,1,2,3,4,5,6,7; all-reduce busbw 4" in detail
    assert not (tmp_path / "state" / "validation").exists()  # a pass keeps no evidence


def test_nvlinks_at_half_speed_pass_the_diag_and_fail_the_all_reduce_with_its_output_kept(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, NVLINK_RESET, state="idle", flags=("DRAIN",))
    hw.inject("nvlink-degraded:7", gpu=2, now=NOW - 60)
    answer = step(config, slurm, gpus)
    assert diags(gpus) == ["diag -r 2 -j -i 0,1,2,3,4,5,6,7"] and len(all_reduces(gpus)) == 1  # once after a reset
    assert answer.reason.startswith("opsctl:validated-fail gpu2 nvlink-degraded after-reset all-reduce busbw 2")
    assert answer.reason.endswith(f"GB/s under the floor {FLOOR}GB/s")
    assert kept(tmp_path) == {"all_reduce_perf.txt"}
    assert "nvidia-bug-report.sh" not in " ".join(gpus.calls)  # after a reset: the ladder reboots, no RMA yet


# ---- twice after a reboot -----------------------------------------------------------------------------------------
def test_an_all_reduce_failure_after_a_reboot_fails_only_on_a_second_failing_run(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, REBOOTED)
    hw.inject("nvlink-degraded:7", gpu=2, now=NOW - 60)
    answer = step(config, slurm, gpus)
    assert len(all_reduces(gpus)) == 2
    assert answer.reason.startswith("opsctl:validated-fail gpu2 xid-79 after-reboot failed twice: all-reduce busbw ")
    assert kept(tmp_path) == {"all_reduce_perf.txt", "all_reduce_perf-second-run.txt"}
    assert "--output-file" in " ".join(gpus.calls)  # nvidia-bug-report.sh for the RMA, where installed


def test_an_all_reduce_failure_that_does_not_repeat_after_a_reboot_is_a_persons(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, REBOOTED, gpus_class=SlowOnce)
    answer = step(config, slurm, gpus)
    assert len(all_reduces(gpus)) == 2
    assert answer.reason.startswith("opsctl:validated-unchecked gpu2 xid-79 after-reboot failed once, then pass on a "
                                    "second run: all-reduce busbw ")
    assert "all_reduce_perf.txt" in kept(tmp_path)


# ---- when it does not run -----------------------------------------------------------------------------------------
def test_no_all_reduce_when_the_diag_checked_only_the_reasons_gpu(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, "opsctl:reset gpu2 row-remap-pending row_remap_pending=1",
                                    state="idle", flags=("DRAIN",))
    hw.inject("row-remap-pending", gpu=2, now=NOW - 60)
    hw.inject("nvlink-degraded:7", gpu=2, now=NOW - 60)  # the all-reduce would fail, had it run
    answer = step(config, slurm, gpus)
    assert diags(gpus) == ["diag -r 2 -j -i 2"] and all_reduces(gpus) == []
    assert answer.reason == "opsctl:validated-pass gpu2 row-remap-pending after-reset pass"
    assert "all-reduce" not in audit(tmp_path)[-1]["detail"]


def test_no_all_reduce_when_the_diag_failed(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, REBOOTED)
    hw.inject("row-remap-failure", gpu=2, now=NOW - 60)
    answer = step(config, slurm, gpus)
    assert len(diags(gpus)) == 2 and all_reduces(gpus) == []
    assert answer.reason.startswith("opsctl:validated-fail gpu2 xid-79 after-reboot serial=")


# ---- an all-reduce that checks nothing ----------------------------------------------------------------------------
def test_an_all_reduce_that_times_out_is_unchecked_never_a_failure(tmp_path):
    config, hw, slurm, gpus = setup(tmp_path, NVLINK_RESET, state="idle", flags=("DRAIN",),
                                    gpus_class=AllReduceTimesOut)
    answer = step(config, slurm, gpus)
    assert answer.reason == ("opsctl:validated-unchecked gpu2 nvlink-degraded after-reset all-reduce not checked: "
                             f"timed out after {tools.NCCL_TIMEOUT_S}s")
    assert kept(tmp_path) == {"all_reduce_perf.txt"}


def test_an_all_reduce_that_cannot_start_or_prints_no_result_is_unchecked(tmp_path):
    def missing(argv, **kwargs):
        raise FileNotFoundError(2, "No such file or directory")

    def no_table(argv, **kwargs):
        return subprocess.CompletedProcess(argv, 0, "# nThread 1 nGpus 8 minBytes 17179869184\n", "")

    missed = run_all_reduce("/opt/nccl-tests/build/all_reduce_perf", "16G", 8, FLOOR, missing)
    assert (missed.verdict, missed.words) == ("not_checked", "all-reduce not checked: all_reduce_perf exited 127: "
                                                             "/opt/nccl-tests/build/all_reduce_perf: No such file or "
                                                             "directory")
    empty = run_all_reduce("all_reduce_perf", "16G", 8, FLOOR, no_table)
    assert empty.verdict == "not_checked" and empty.words.startswith("all-reduce not checked: no result")


def test_the_all_reduce_runs_within_its_own_timeout():
    seen = {}

    def recorded(argv, **kwargs):
        seen.update(argv=argv, timeout=kwargs["timeout"])
        return subprocess.CompletedProcess(argv, 0, "", "")

    run_all_reduce("all_reduce_perf", "16G", 8, FLOOR, recorded)
    assert seen == {"argv": ["all_reduce_perf", "-b", "16G", "-e", "16G", "-f", "2", "-g", "8", "-c", "1"],
                    "timeout": tools.NCCL_TIMEOUT_S}
    assert tools.NCCL_TIMEOUT_S == 300


def test_the_node_check_bound_counts_two_all_reduces_over_more_than_one_gpu():
    """The node check unit's timeout (node_step_bound_s over 8 GPUs) has room for the all-reduce and its second run;
    the head's step_timeout (over one GPU) needs none: the all-reduce takes the place of what a passing diag skips."""
    for level in tools.DIAG_TIMEOUT_S:
        per_gpu = tools.NVIDIA_SMI_CALLS_PER_GPU * tools.NVIDIA_SMI_TIMEOUT_S
        assert tools.node_step_bound_s(level, 8) - 7 * per_gpu - tools.node_step_bound_s(level, 1) \
            == 2 * tools.NCCL_TIMEOUT_S


# ---- the lab's emulated all_reduce_perf, alone on a node -----------------------------------------------------------
def test_the_emulated_single_node_run_prints_what_the_parser_reads_at_nvlink_bandwidth():
    printed = single_node(NodeHardware(node="gpu007"), ["-b", "128M", "-e", "16G", "-f", "2", "-g", "8"], NOW)
    result = parse_all_reduce(printed.stdout)
    assert printed.rc == 0 and result.ranks == GPUS_PER_NODE and result.hosts == ("gpu007",)
    assert result.last is not None and result.last.size == 16 << 30 and len(result.rows) == 8
    assert FLOOR < result.last.busbw <= PLATEAU_GBPS
    assert all_reduce_verdict(result, FLOOR, GPUS_PER_NODE)[0] == "pass"


def test_the_emulated_single_node_run_under_a_degraded_nvlink_falls_under_the_floor():
    hw = NodeHardware(node="gpu007")
    hw.inject("nvlink-degraded:7", gpu=5, now=NOW - 60)
    result = parse_all_reduce(single_node(hw, ["-b", "16G", "-e", "16G", "-g", "8"], NOW).stdout)
    assert result.last is not None and result.last.busbw < FLOOR
    assert all_reduce_verdict(result, FLOOR, GPUS_PER_NODE)[0] == "fail"


def test_the_emulated_single_node_run_fails_as_cuda_does_before_the_fabric_is_trained():
    hw = NodeHardware(node="gpu007")
    hw.reset_gpu(3, NOW)
    printed = single_node(hw, ["-b", "16G", "-e", "16G", "-g", "8"], NOW + FABRIC_TRAINING_S / 2)
    assert printed.rc == 1 and "'system not yet initialized'" in printed.stdout
    assert parse_all_reduce(printed.stdout).rows == ()
