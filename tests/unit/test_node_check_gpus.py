"""The node check's GPU checks (opsctl/nodecheck/gpu.py) and what `--drain-self` does with them: a node that boots
with a GPU off the bus drains itself, even while slurmd is only registering; a fabric still training is "not
yet" (no drain, no resume), a fabric whose training failed is a failure; every GPU failing at once is shaped like a
shared cause; gpu-count is judged against the GPUs Slurm was told the node has. The rows are
nvidia-smi's `--query-gpu=index,fabric.state,fabric.status,persistence_mode --format=csv,noheader`, worded as the
real H200 capture prints them (tests/fixtures/gpu/nvidia-smi_q_and_query-gpu_csv_H200_1gpu.txt: "Completed",
"Success"; the lost GPU's line as nvidia-smi prints it with exit 15)."""

import subprocess

from opsctl.config import parse_config
from opsctl.errors import ExitCode
from opsctl.nodecheck import REASON_PREFIX, CheckResult, drain_self
from opsctl.nodecheck.drain_self import registering
from opsctl.nodecheck.gpu import GpuReport, check_gpus, slurm_gpus
from opsctl.slurm import SlurmNode
from tests.unit.fakes import FakeSlurm, gpu_nodes

PASSING = [CheckResult("ib-port-state", "node", False)]
LOST = "Unable to determine the device handle for GPU0000:8A:00.0: Unknown Error\n"


def rows(*states: str, gpus: int = 8) -> str:
    """One row a GPU: all trained, or the states given for the first GPUs ("In Progress")."""
    out = []
    for gpu in range(gpus):
        state = states[gpu] if gpu < len(states) else "Completed"
        status = "Success" if state == "Completed" else "N/A"
        out.append(f"{gpu}, {state}, {status}, Enabled")
    return "\n".join(out) + "\n"


def answering(stdout: str, rc: int = 0):
    def run(argv, **_):
        return subprocess.CompletedProcess(argv, rc, stdout, "")
    return run


def gpus_of(stdout: str, rc: int = 0) -> GpuReport:
    return check_gpus("nvidia-smi", answering(stdout, rc), 8)


def failed(report: GpuReport) -> list[tuple[str, str]]:
    return [(r.check, r.device) for r in report.found if r.failed]


def config_for(tmp_path):
    return parse_config({}, "t", env={"OPSCTL_STATE_DIR": str(tmp_path / "state")})


def test_a_lost_gpu_fails_gpu_count_and_a_trained_board_passes():
    assert failed(gpus_of(rows())) == []
    lost = gpus_of(LOST + rows(gpus=7), rc=15)
    assert failed(lost) == [("gpu-count", "node")] and lost.answering == 7 and lost.judged


def test_a_fabric_still_training_is_not_yet_and_one_whose_training_failed_fails():
    training = gpus_of(rows("In Progress", "Not Started"))
    assert failed(training) == [] and not training.judged
    assert training.skipped == "not yet: fabric still training (gpu0 In Progress, gpu1 Not Started)"
    done_badly = gpus_of("0, Completed, Failure, Enabled\n" + rows().split("\n", 1)[1])
    assert failed(done_badly) == [("gpu-fabric", "gpu0")] and done_badly.judged


def test_a_board_without_a_fabric_and_a_node_without_nvidia_smi_fail_nothing():
    assert failed(gpus_of(rows(*["[Not Supported]"] * 8))) == []
    missing = check_gpus("nvidia-smi", lambda argv, **_: (_ for _ in ()).throw(FileNotFoundError(2, "No such file")),
                         8)
    assert missing.absent and missing.judged and missing.found == ()


def test_slurm_gres_gives_the_gpu_count():
    assert slurm_gpus("gpu:h200:7(S:0-1)") == 7 and slurm_gpus("gpu:8,shard:4") == 8 and slurm_gpus("") is None


def test_a_node_booting_with_a_lost_gpu_drains_itself_while_slurmd_registers(tmp_path):
    """At slurmd's start Slurm shows the node NOT_RESPONDING (DOWN for it after a reboot): the health check's point."""
    config = config_for(tmp_path)
    booting = SlurmNode("gpu007", "down", ("NOT_RESPONDING",), "Not responding", ("gpu",), "gpu:h200:8")
    slurm = FakeSlurm(gpu_nodes(64, gpu007=booting))
    outcome = drain_self(config, slurm, "gpu007", PASSING, gpus=gpus_of(LOST + rows(gpus=7), rc=15))
    assert outcome.exit_code == ExitCode.FAILING
    assert slurm.nodes()["gpu007"].reason == f"{REASON_PREFIX} gpu-count node"


def test_registering_is_not_responding_alone_with_no_reason_but_slurms():
    assert registering(SlurmNode("n", "idle", ("NOT_RESPONDING",)))
    # A job's end the boot cut short: slurmctld shows it until the node registers (seen on a lab machine).
    assert registering(SlurmNode("n", "idle", ("COMPLETING", "NOT_RESPONDING")))
    assert not registering(SlurmNode("n", "idle", ("COMPLETING",)))
    assert not registering(SlurmNode("n", "down", ("NOT_RESPONDING",), "ticket-9 bad psu"))
    assert not registering(SlurmNode("n", "idle", ("NOT_RESPONDING", "MAINTENANCE")))
    assert not registering(SlurmNode("n", "idle", ("NOT_RESPONDING", "DRAIN"), "Not responding"))


def test_a_person_holding_a_booting_node_is_still_left_alone(tmp_path):
    config = config_for(tmp_path)
    held = SlurmNode("gpu007", "down", ("NOT_RESPONDING",), "ticket-9 bad psu", ("gpu",), "gpu:h200:8")
    slurm = FakeSlurm(gpu_nodes(64, gpu007=held))
    drain_self(config, slurm, "gpu007", PASSING, gpus=gpus_of(LOST + rows(gpus=7), rc=15))
    assert slurm.nodes()["gpu007"].reason == "ticket-9 bad psu" and slurm.calls == []


def test_no_gpu_answering_or_every_fabric_failed_is_shaped_like_a_shared_cause(tmp_path):
    config = config_for(tmp_path)
    slurm = FakeSlurm(gpu_nodes(64))
    every_failed = "".join(f"{gpu}, Completed, Failure, Enabled\n" for gpu in range(8))
    for report in (gpus_of("", rc=9), gpus_of(every_failed)):
        outcome = drain_self(config, slurm, "gpu007", PASSING, gpus=report)
        assert outcome.exit_code == ExitCode.FAILING and "shared cause" in " ".join(outcome.lines) + \
            " ".join(outcome.skipped.values())
    assert slurm.calls == []
    # A GPU lost while the others still train is the node's own.
    drain_self(config, slurm, "gpu007", PASSING, gpus=gpus_of(LOST + rows(*["In Progress"] * 7, gpus=7), rc=15))
    assert slurm.nodes()["gpu007"].reason == f"{REASON_PREFIX} gpu-count node"


def test_a_resume_waits_until_the_fabric_was_judged(tmp_path):
    config = config_for(tmp_path)
    slurm = FakeSlurm(gpu_nodes(64))
    drain_self(config, slurm, "gpu007", PASSING, gpus=gpus_of(LOST + rows(gpus=7), rc=15))
    assert slurm.nodes()["gpu007"].drained
    outcome = drain_self(config, slurm, "gpu007", PASSING, gpus=gpus_of(rows("In Progress")))
    assert slurm.nodes()["gpu007"].drained and "stays drained: not yet" in "\n".join(outcome.lines)
    outcome = drain_self(config, slurm, "gpu007", PASSING, gpus=gpus_of(rows()))
    assert not slurm.nodes()["gpu007"].drained and outcome.resumed == ["gpu007"]


def test_gpu_count_is_judged_against_the_gpus_slurm_was_told_the_node_has(tmp_path):
    """A node provisioning gave a NodeName line of its own for a lost GPU (gres gpu:h200:7) is opsctl hw
    quarantine's: the node check does not hold it with a second reason that outlives the repair."""
    config = config_for(tmp_path)
    own_line = SlurmNode("gpu007", "idle", (), "", ("gpu",), "gpu:h200:7(S:0-1)")
    slurm = FakeSlurm(gpu_nodes(64, gpu007=own_line))
    outcome = drain_self(config, slurm, "gpu007", PASSING, gpus=gpus_of(LOST + rows(gpus=7), rc=15))
    assert outcome.exit_code == ExitCode.OK and slurm.calls == []


def test_a_node_booting_while_slurm_still_shows_a_job_completing_drains_itself_too(tmp_path):
    """As a lab machine rebooted outside Slurm showed it: IDLE+COMPLETING+NOT_RESPONDING, no reason."""
    config = config_for(tmp_path)
    booting = SlurmNode("gpu007", "idle", ("COMPLETING", "NOT_RESPONDING"), "", ("gpu",), "gpu:h200:8")
    slurm = FakeSlurm(gpu_nodes(64, gpu007=booting))
    drain_self(config, slurm, "gpu007", PASSING, gpus=gpus_of(LOST + rows(gpus=7), rc=15))
    assert slurm.nodes()["gpu007"].reason == f"{REASON_PREFIX} gpu-count node"
