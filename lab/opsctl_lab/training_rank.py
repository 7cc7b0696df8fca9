"""One rank of an emulated data-parallel training job: compute a step, all-reduce with the peers (a barrier,
opsctl_lab.sync_job), again, until the job's last step; and publish what its GPUs do (opsctl_lab.training_load).

The node's hardware state decides how it goes: a `slow-gpu` makes that GPU's step SLOW_GPU_STEP_FACTOR as
long (the node's other GPUs finish early and wait for it, as the other nodes do), `hang` stops the rank where
it is (alive, its GPUs idle) until the fault is cleared, and a fault that ends the CUDA contexts ends the rank
(`fatal`, given by the caller: RankFailed).
"""

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from opsctl_lab.hardware import SLOW_GPU_STEP_FACTOR, NodeHardware
from opsctl_lab.sync_job import JobBarrier
from opsctl_lab.training_load import COMPUTE, DONE, HUNG, WAIT, DutyMeter, RankLoad

STEP_S = 1.0
HEARTBEAT_S = 0.25  # well within training_load.STALE_S
# A tenth of a step: every rank of every job reads its peers' votes this often while it waits, and the lab's
# jobs run 8 to 24 ranks on two cores (at 0.01 s, 16 waiting ranks kept most of a core busy).
BARRIER_POLL_S = 0.1


class RankFailed(Exception):
    """The rank's GPU failed under it: its last line, as PyTorch prints it."""


@dataclass
class TrainingRank:
    barrier: JobBarrier
    job: str
    hardware: Callable[[], NodeHardware]
    fatal: Callable[[NodeHardware], str]
    load_file: Path | None  # None: another rank of the node publishes its load
    step_s: float = STEP_S
    poll_s: float = HEARTBEAT_S
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    load: RankLoad = field(init=False)
    duty: DutyMeter = field(init=False)

    def __post_init__(self) -> None:
        now = self.clock()
        before = RankLoad.read(self.load_file) if self.load_file is not None else None
        self.load = RankLoad(job=self.job, rank=self.barrier.rank, pid=os.getpid(), phase=COMPUTE, started=now,
                             total_steps=before.total_steps if before is not None else 0)
        self.duty = DutyMeter(self.load.gpus, now)

    def run(self, seconds: float) -> int:
        """Step until the job's last step (a rank's deadline passed); the steps this rank completed."""
        deadline = self.clock() + seconds
        try:
            while True:
                step = self.load.step + 1
                self._compute()
                self.barrier.arrive(step, stop=self.clock() >= deadline)
                self._publish(WAIT)
                last = self.barrier.wait(step, idle=self._idle)
                self.load.step, self.load.total_steps = step, self.load.total_steps + 1
                self._publish(WAIT)  # the step's all-reduce traffic, at once
                if last:
                    break
        except BaseException:
            self.barrier.abandon()
            raise
        finally:
            self.duty.cut(self.clock())
            self._publish(DONE)
        self.barrier.leave()
        return self.load.step

    def _compute(self) -> None:
        """One step's computing: each GPU for its time (a slow one longer); a hang starts it again after."""
        while True:
            slow = self._hold()
            start = self.clock()
            ends = {gpu: start + self.step_s * (SLOW_GPU_STEP_FACTOR if gpu in slow else 1.0)
                    for gpu in self.load.gpus}
            for gpu, end in ends.items():
                self.duty.computed(gpu, start, end)
            finish = max(ends.values())
            hung = False
            while (now := self.clock()) < finish and not hung:
                self._publish(COMPUTE, [gpu for gpu, end in ends.items() if end > now])
                self.sleep(min(self.poll_s, finish - now))
                hung = self._hung(self.hardware())
            if not hung:
                return
            self.duty.cut(self.clock())

    def _idle(self) -> None:
        """Between looks at the barrier (often: a step is short, and its wait part of what it costs): every
        poll_s the node's state (a hang, a fatal XID) and a heartbeat."""
        if self.clock() - self.load.updated >= self.poll_s:
            self._hold()
            self._publish(WAIT)
        self.sleep(min(self.poll_s, BARRIER_POLL_S))

    def _hold(self) -> set[int]:
        """Block while the node's rank hangs, fail on a fatal fault; the node's slow GPUs."""
        while True:
            hw = self.hardware()
            said = self.fatal(hw)
            if said:
                raise RankFailed(said)
            if not self._hung(hw):
                return {f.gpu for f in hw.active if f.fault == "slow-gpu" and f.gpu is not None}
            self._publish(HUNG)
            self.sleep(self.poll_s)

    @staticmethod
    def _hung(hw: NodeHardware) -> bool:
        return hw.node_fault("hang")

    def _publish(self, phase: str, computing: list[int] | None = None) -> None:
        now = self.clock()
        self.load.phase, self.load.computing, self.load.updated = phase, computing or [], now
        self.load.duty = self.duty.shares(now)
        if self.load_file is not None:
            self.load.save(self.load_file)
