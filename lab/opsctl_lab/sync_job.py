"""The lock-step of a synchronous (data-parallel) training job's emulated ranks: after each step every rank
waits for all the others at an all-reduce barrier, as NCCL's all-reduce of the gradients makes them wait.

The ranks of one job step share a directory (`JobBarrier.directory`), on one file system as every rank of the
simulated lab is. A rank that finished computing step n writes `r<rank>.s<n>`, once and atomically, holding
"go" or "stop" (its own deadline has passed); step n completes for a rank when the files of every rank exist.
Every rank then reads the same votes, so all ranks stop after the same step, and a job of `--seconds` ends
on every node together. A rank that starts late simply arrives late: the others wait for its files.

A rank removes its file of step n-1 once step n completed: every peer has then arrived at n, so none still
reads n-1. After the last step each rank writes `r<rank>.done`; the rank that sees every rank done removes
the directory (a peer still reading the last step's votes has not written its `.done`).
"""

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

GO, STOP = "go", "stop"
POLL_S = 0.05


def job_directory(base: Path, job: str, step: str) -> Path:
    """Where the ranks of one job step meet: a srun of its own in the same job meets apart."""
    return Path(base) / f"job-{job}.{step}"


def write_once(path: Path, text: str) -> None:
    """A file a reader (a peer, the emulator) reads whole or not at all."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(tmp, 0o644)  # the emulator may run as another user than the job
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass
class JobBarrier:
    directory: Path
    rank: int
    ranks: int

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)

    def _vote(self, rank: int, step: int) -> Path:
        return self.directory / f"r{rank}.s{step}"

    def arrive(self, step: int, stop: bool) -> None:
        """This rank finished computing `step`; `stop`: it wants this to be the job's last step."""
        write_once(self._vote(self.rank, step), STOP if stop else GO)

    def votes(self, step: int) -> list[str] | None:
        """Every rank's vote on `step`, or None while a rank has not arrived."""
        out = []
        for rank in range(self.ranks):
            try:
                out.append(self._vote(rank, step).read_text())
            except FileNotFoundError:
                return None
        return out

    def wait(self, step: int, idle: Callable[[], None] = lambda: time.sleep(POLL_S)) -> bool:
        """Block until every rank arrived at `step` (calling `idle` between looks, which may raise to give
        up); True: the job ends with this step."""
        while (votes := self.votes(step)) is None:
            idle()
        self._vote(self.rank, step - 1).unlink(missing_ok=True)
        return STOP in votes

    def leave(self) -> None:
        """After the last step: the last rank out removes the directory."""
        write_once(self.directory / f"r{self.rank}.done", "")
        if all((self.directory / f"r{rank}.done").exists() for rank in range(self.ranks)):
            shutil.rmtree(self.directory, ignore_errors=True)

    def abandon(self) -> None:
        """A rank that is killed or dies takes its files with it; the directory goes with the last of them."""
        for path in self.directory.glob(f"r{self.rank}.*"):
            path.unlink(missing_ok=True)
        try:
            self.directory.rmdir()
        except OSError:  # a peer's files are still there, or a peer removed it already
            pass
