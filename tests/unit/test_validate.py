"""Active validation: `opsctl node validate` on a node (opsctl/validate/node.py) with the real tools' outputs,
which nodes a sweep of `opsctl validate --idle` takes and how it waits for its jobs (opsctl/validate/sweep.py),
and the sbatch/squeue/scancel calls (opsctl/slurm/cli.py). The lab tier runs the whole sweep on real Slurm
and Prometheus (tests/integration/lab/test_lab_validate.py)."""

import subprocess
from pathlib import Path

import pytest

from opsctl.config import parse_config
from opsctl.errors import ConfigError, SourceUnavailable
from opsctl.slurm import SlurmNode
from opsctl.slurm.base import Job, JobSpec
from opsctl.slurm.cli import SlurmCliImpl, parse_squeue
from opsctl.validate.node import metrics_text, validate_node
from opsctl.validate.sweep import Clock, NodeValidation, Sweep, await_jobs, choose, run_sweep
from tests.unit.fakes import gpu_nodes, node

FIXTURES = Path(__file__).parents[1] / "fixtures"
NCCL_GOOD = (FIXTURES / "nccl" / "nccl-tests290_all_reduce_perf_8xH100_single_node.txt").read_text()
NCCL_SLOW = (FIXTURES / "nccl" / "nccl-tests290_all_reduce_perf_2x8xH100_RING_degraded.txt").read_text()
DIAG_GB10 = (FIXTURES / "gpu" / "dcgmi_diag_r1_j_dcgm4.2.3_gb10.json").read_text()  # one GPU, software: Fail


def config(**validate):
    return parse_config({"hardware": {"gpus_per_node": 1}, "validate": {"diag_level": 1, **validate}}, "t", {})


def runner(outputs: dict[str, subprocess.CompletedProcess]):
    """subprocess.run's shape: the answer of the tool named by argv[0]'s last part; records each argv."""
    calls = []

    def run(argv, **_):
        calls.append(argv)
        return outputs[Path(argv[0]).name]
    run.calls = calls
    return run


def done(stdout="", rc=0, stderr=""):
    return subprocess.CompletedProcess([], rc, stdout, stderr)


def test_a_failed_diag_and_a_slow_all_reduce_are_written_with_the_runs_time_and_exit_1():
    run = runner({"dcgmi": done(DIAG_GB10, 226), "all_reduce_perf": done(NCCL_SLOW)})
    validation = validate_node(config(), run, now=1_800_000_000.0)
    assert validation.verdict == "fail"
    assert [(o.test, o.verdict, o.devices) for o in validation.outcomes] == [
        ("dcgm-diag", "fail", ("gpu0",)), ("nccl", "fail", ("node",))]
    assert run.calls[1] == ["/opt/nccl-tests/build/all_reduce_perf", "-b", "16G", "-e", "16G", "-f", "2",
                            "-g", "1", "-c", "1"]
    text = metrics_text(validation)
    assert 'opsctl_node_validate{test="dcgm-diag",device="gpu0"} 1800000000.000\n' in text
    assert 'opsctl_node_validate{test="nccl",device="node"} 1800000000.000\n' in text
    assert "opsctl_node_validate_nccl_busbw_gbps 89.9\n" in text
    assert text.endswith("opsctl_node_validate_timestamp_seconds 1800000000.000\n")


def test_a_test_that_could_not_run_has_no_series_and_is_never_a_pass():
    run = runner({"dcgmi": done("", 127, "dcgmi: No such file or directory"), "all_reduce_perf": done(NCCL_GOOD)})
    validation = validate_node(config(), run, now=1_800_000_000.0)
    assert validation.verdict == "not_checked"
    text = metrics_text(validation)
    assert 'test="dcgm-diag"' not in text and 'opsctl_node_validate{test="nccl",device="node"} 0\n' in text
    assert validation.outcomes[0].detail.endswith("(dcgmi: No such file or directory)")


def test_an_all_reduce_that_exits_non_zero_after_a_good_table_is_not_checked():
    run = runner({"dcgmi": done("", 127), "all_reduce_perf": done(NCCL_GOOD + "gpu001: NCCL WARN Cuda failure\n"
                                                                  "exiting\n", 1)})
    nccl = validate_node(config(), run).outcomes[1]
    assert (nccl.verdict, nccl.detail) == ("not_checked", "nccl exit 1: gpu001: NCCL WARN Cuda failure")


def test_a_sweep_takes_idle_nodes_not_validated_lately_the_longest_waiting_first():
    nodes = gpu_nodes(8, gpu002=node("gpu002", "allocated"), gpu003=node("gpu003", "mixed"),
                      gpu004=node("gpu004", flags=("DRAIN",), reason="opsctl:xid-79 gpu3"),
                      gpu005=node("gpu005", reason="a person's note"))
    nodes["gpu006"] = SlurmNode("gpu006", "idle", partitions=("gpu",), gres="")
    last = {"gpu001": 1000.0, "gpu007": 5000.0, "gpu008": 9_000.0}
    sweep = choose(nodes, last, None, 10_000.0, config(interval="1h", max_nodes_per_sweep=1))
    assert {n: v.result for n, v in sweep.nodes.items()} == {
        "gpu001": "", "gpu002": "skip:busy", "gpu003": "skip:busy", "gpu004": "skip:not-idle",
        "gpu005": "skip:not-idle", "gpu006": "skip:no-gpus", "gpu007": "skip:sweep-full",
        "gpu008": "skip:validated-recently"}
    scoped = choose(nodes, last, {"gpu007", "gpu008"}, 10_000.0, config(interval="1h"))
    assert {n: v.result for n, v in scoped.nodes.items()} == {"gpu007": "", "gpu008": "skip:validated-recently"}


class FakeJobs:
    """squeue's answers, one per poll; records cancels."""

    def __init__(self, polls):
        self.polls = list(polls)
        self.cancelled = []

    def queued(self, ids):
        return {i: j for i, j in (self.polls.pop(0) if len(self.polls) > 1 else self.polls[0]).items() if i in ids}

    def cancel(self, ids):
        self.cancelled += ids


class JumpingClock(Clock):
    def __init__(self):
        self.t = 0.0

    def now(self):
        return self.t

    def sleep(self, seconds):
        self.t += seconds


def sweep_of(**jobs) -> Sweep:
    sweep = Sweep()
    for name, job in jobs.items():
        sweep.nodes[name] = NodeValidation(name, job=job, result="submitted")
    return sweep


def test_jobs_that_ran_are_waited_for_and_one_that_never_started_is_cancelled_at_the_timeout():
    sweep = sweep_of(gpu001="11", gpu002="12")
    polls = [{"11": Job("11", "RUNNING"), "12": Job("12", "PENDING", "Priority")},
             {"11": Job("11", "COMPLETED"), "12": Job("12", "PENDING", "Priority")},
             {"12": Job("12", "PENDING", "Priority")}]
    jobs = FakeJobs(polls)
    await_jobs(config(job_timeout="1m"), jobs, sweep, JumpingClock())
    assert (sweep.nodes["gpu001"].result, sweep.nodes["gpu002"].result) == ("ended", "skip:never-started")
    assert jobs.cancelled == ["12"]
    assert sweep.nodes["gpu002"].detail == "job 12 cancelled after validate.job_timeout (the node was busy)"


def test_a_job_that_ran_past_the_timeout_is_cancelled_and_its_node_not_checked():
    sweep = sweep_of(gpu001="21")
    jobs = FakeJobs([{"21": Job("21", "RUNNING")}])
    await_jobs(config(job_timeout="1m"), jobs, sweep, JumpingClock())
    assert (sweep.nodes["gpu001"].result, jobs.cancelled) == ("not-checked", ["21"])


def test_squeue_lines_read_and_anything_else_is_a_source_error():
    assert parse_squeue("11|RUNNING|None\n12|PENDING|Priority\n") == {
        "11": Job("11", "RUNNING", ""), "12": Job("12", "PENDING", "Priority")}
    with pytest.raises(SourceUnavailable, match="squeue printed 'JOBID STATE'"):
        parse_squeue("JOBID STATE\n")


def test_jobs_go_through_sbatch_squeue_and_scancel_next_to_scontrol():
    calls = []

    def run(argv, **_):
        calls.append(argv)
        if argv[0].endswith("sbatch"):
            return done("4242;opsctl-lab\n")
        if argv[0].endswith("squeue"):
            return done("", 1, "slurm_load_jobs error: Invalid job id specified")
        return done("")
    slurm = SlurmCliImpl(scontrol="/usr/local/slurm/bin/scontrol", run=run, environ={"SLURM_CONF": "/dev/null"})
    assert slurm.submit(JobSpec("opsctl-validate", "gpu007", "validate", "opsctl node validate", 20)) == "4242"
    assert slurm.queued(["4242"]) == {}  # ended and gone from slurmctld
    slurm.cancel(["4242"])
    assert calls[0] == ["/usr/local/slurm/bin/sbatch", "--parsable", "--job-name=opsctl-validate",
                        "--partition=validate", "--nodelist=gpu007", "--nodes=1", "--exclusive", "--time=20",
                        "--chdir=/", "--output=/dev/null", "--wrap=opsctl node validate"]
    assert calls[1][0] == "/usr/local/slurm/bin/squeue" and calls[2] == ["/usr/local/slurm/bin/scancel", "4242"]


def test_a_site_without_node_exporter_is_told_validate_needs_it(tmp_path):
    cfg = parse_config({"prometheus": {"jobs": {"dcgm": "dcgm", "node": None}}}, "t",
                       {"OPSCTL_STATE_DIR": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"^config key prometheus.jobs.node: opsctl validate reads"):
        run_sweep(cfg, None, None, None, None, dry_run=True)
