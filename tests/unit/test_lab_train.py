"""The lab's emulated training rank (opsctl_lab.hwtools.train): ranks of one job step in lock-step through
their barrier files, wait for a slow peer, block on a hung one, end together, and die on a fatal XID. Ranks
run in threads here with steps of a few hundredths of a second; a fake peer is the test writing its votes."""

import threading
import time
from pathlib import Path

import pytest

from opsctl_lab.hardware import NodeHardware
from opsctl_lab.hwtools import train
from opsctl_lab.sync_job import JobBarrier
from opsctl_lab.training_load import COMPUTE, DONE, HUNG, WAIT, RankLoad
from opsctl_lab.training_rank import RankFailed, TrainingRank

STEP_S = 0.03


class Job:
    """Ranks of one job on nodes n0..n<ranks-1>, each node with its hardware state and load file."""

    def __init__(self, tmp: Path, ranks: int, step_s: float = STEP_S) -> None:
        self.tmp, self.ranks, self.step_s = tmp, ranks, step_s
        self.directory = tmp / "jobs" / "job-7.0"
        self.hw = [NodeHardware(node=f"n{i}") for i in range(ranks)]
        self.results: dict[int, object] = {}
        self.threads: list[threading.Thread] = []

    def load_file(self, rank: int) -> Path:
        return self.tmp / f"n{rank}" / "train.json"

    def rank(self, rank: int) -> TrainingRank:
        self.load_file(rank).parent.mkdir(parents=True, exist_ok=True)
        return TrainingRank(JobBarrier(self.directory, rank, self.ranks), "7", lambda: self.hw[rank], train.fatal,
                            self.load_file(rank), step_s=self.step_s, poll_s=0.01)

    def start(self, rank: int, seconds: float) -> None:
        def run() -> None:
            try:
                self.results[rank] = self.rank(rank).run(seconds)
            except RankFailed as err:
                self.results[rank] = err
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)

    def load(self, rank: int) -> RankLoad:
        """The rank's load file, once its thread has written it."""
        return until(lambda: RankLoad.read(self.load_file(rank)))

    def join(self) -> None:
        for thread in self.threads:
            thread.join(10)
        assert not any(thread.is_alive() for thread in self.threads)


def until(check, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)
    return result


def test_ranks_that_start_apart_step_together_and_end_after_the_same_step(tmp_path):
    job = Job(tmp_path, 3)
    job.start(0, 0.3)
    time.sleep(0.1)  # rank 0 waits at its first all-reduce for the ranks not yet started
    assert job.load(0).phase == WAIT and job.load(0).step == 0
    job.start(1, 0.3)
    job.start(2, 0.3)
    job.join()
    steps = set(job.results.values())
    assert len(steps) == 1 and next(iter(steps)) >= 3, job.results  # every rank ended after the same step
    assert {(job.load(r).phase, job.load(r).total_steps) for r in range(3)} == {(DONE, job.results[0])}
    assert not job.directory.exists()  # the last rank out removed the job's files


def test_a_rank_waits_for_a_peer_that_has_not_arrived_and_follows_its_stop(tmp_path):
    job = Job(tmp_path, 2)
    peer = JobBarrier(job.directory, 1, 2)
    job.start(0, float("inf"))
    until(lambda: job.load(0).phase == WAIT)
    time.sleep(5 * STEP_S)
    assert (job.load(0).phase, job.load(0).step) == (WAIT, 0)  # blocked at step 1's all-reduce
    peer.arrive(1, stop=False)
    until(lambda: job.load(0).step == 1)
    until(lambda: job.load(0).phase == WAIT)
    peer.arrive(2, stop=True)  # the peer's deadline passed: both end after step 2, however long rank 0 had
    job.join()
    assert job.results == {0: 2} and job.load(0).phase == DONE


def test_a_slow_gpu_makes_its_rank_compute_longer_and_every_peer_wait(tmp_path):
    job = Job(tmp_path, 3, step_s=0.1)  # long enough that a busy machine's scheduling does not blur the shares
    job.hw[1].inject("slow-gpu", gpu=2)
    for rank in range(3):
        job.start(rank, float("inf"))
    until(lambda: all(job.load(r).step >= 6 for r in range(3)), timeout=10)
    duty = {r: job.load(r).duty for r in range(3)}
    job.hw[1].inject("xid:79", gpu=0)  # end the job: rank 1 dies, the others would wait for ever
    job.hw[0].inject("xid:79", gpu=0)
    job.hw[2].inject("xid:79", gpu=0)
    job.join()
    # The slow GPU computes the whole step (1.6 of the others' 1); every other GPU, on its node or another,
    # waits about 0.6 of it: 1 / 1.6 of the time computing.
    others = [duty[r][str(g)] for r in range(3) for g in range(8) if (r, g) != (1, 2)]
    assert max(others) < 0.75 and duty[1]["2"] > max(others) + 0.2, duty


def test_a_hung_peer_blocks_every_rank_until_it_is_cleared(tmp_path):
    job = Job(tmp_path, 3)
    for rank in range(3):
        job.start(rank, float("inf"))
    until(lambda: all(job.load(r).step >= 2 for r in range(3)))
    job.hw[2].inject("hang")
    until(lambda: job.load(2).phase == HUNG)
    held = {r: job.load(r).step for r in range(3)}
    time.sleep(10 * STEP_S)
    assert {r: job.load(r).step for r in range(3)} == held  # nobody completes a step
    assert job.load(0).phase == job.load(1).phase == WAIT and job.load(2).phase == HUNG
    assert max(held.values()) - min(held.values()) <= 1
    job.hw[2].clear()
    until(lambda: all(job.load(r).step > max(held.values()) + 1 for r in range(3)))
    for hw in job.hw:
        hw.inject("xid:48", gpu=1)
    job.join()
    assert all(isinstance(result, RankFailed) for result in job.results.values())


def test_a_context_ending_xid_kills_the_rank_with_pytorchs_line_and_leaves_no_files(tmp_path):
    job = Job(tmp_path, 1)
    job.start(0, float("inf"))
    until(lambda: job.load(0).step >= 1)
    job.hw[0].inject("xid:79", gpu=3)
    job.join()
    assert str(job.results[0]) == "GPU 3: CUDA error: unspecified launch failure (Xid 79)"
    assert job.load(0).phase == DONE
    assert not job.directory.exists() or not any(job.directory.iterdir())


@pytest.mark.parametrize("fault, said", [("xid:48", "unspecified launch failure (Xid 48)"),
                                         ("gpu-missing", "no CUDA-capable device is detected"),
                                         ("xid:13", ""), ("slow-gpu", ""), ("hang", "")])
def test_only_a_fault_that_ends_cuda_contexts_is_fatal(fault, said):
    hw = NodeHardware(node="n0")
    hw.inject(fault, gpu=1)
    assert train.fatal(hw) == (f"GPU 1: CUDA error: {said}" if said else "")


def test_a_new_job_on_the_node_counts_its_steps_on_from_the_last_ones(tmp_path):
    """The traffic counters derive from total_steps: a second job must not start them again."""
    for expected_before in (0, 2):
        job = Job(tmp_path, 1)
        rank = job.rank(0)
        assert rank.load.total_steps == expected_before
        assert rank.run(0.0) == 1  # a deadline already past: one step, the job's last
        assert job.load(0).total_steps == expected_before + 1
        job.load(0).save(job.load_file(0))
        bumped = job.load(0)
        bumped.total_steps += 1
        bumped.save(job.load_file(0))


def test_the_rank_describes_itself_from_sruns_environment(tmp_path, monkeypatch):
    pattern = tmp_path / "lab" / "nodes" / "{node}" / "hardware.json"
    monkeypatch.delenv("OPSCTL_TRAIN_SYNC_DIR", raising=False)
    monkeypatch.setenv("OPSCTL_HW_STATE_PATTERN", str(pattern))
    monkeypatch.setenv("OPSCTL_HW_STATE", str(tmp_path / "lab" / "nodes" / "gpu003" / "hardware.json"))
    rank = train.rank_for({"SLURM_JOB_ID": "812", "SLURM_STEP_ID": "0", "SLURM_PROCID": "2", "SLURM_NTASKS": "8",
                           "SLURM_NNODES": "8", "SLURM_LOCALID": "0"})
    assert rank.barrier.directory == tmp_path / "lab" / "jobs" / "job-812.0"
    assert (rank.barrier.rank, rank.barrier.ranks, rank.job) == (2, 8, "812")
    assert rank.load_file == tmp_path / "lab" / "nodes" / "gpu003" / "train.json"
    assert rank.load.phase == COMPUTE
    second = train.rank_for({"SLURM_JOB_ID": "812", "SLURM_PROCID": "3", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1"})
    assert second.load_file is None  # the node's first rank speaks for its GPUs
