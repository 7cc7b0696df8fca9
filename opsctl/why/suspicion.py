"""The suspicion score: a node that keeps turning up in failed jobs that nothing explains.

Over `why.suspect_lookback`, for each node: the jobs it ran, and the failed ones (FAILED, NODE_FAIL,
TIMEOUT: a job's own end, not a person's scancel) that no evidence explains. A failed job that `opsctl
why` explains counts against the nodes with evidence only, and not against their job mates. A node is a
suspect once its unexplained failures reach `why.suspect_min_failed_jobs` and are at least
`why.suspect_failed_fraction` of its jobs. A suspect is queued for `opsctl validate`, never drained: the
score is a reason to look, not a fault.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from opsctl.config.schema import Config
from opsctl.slurm.accounting import FinishedJob

SUSPECT_STATES = {"FAILED", "NODE_FAIL", "TIMEOUT"}


@dataclass
class Score:
    node: str
    jobs: int = 0
    failed: int = 0  # failed jobs with no evidence on any of their nodes
    explained: int = 0  # failed jobs with evidence on this node

    @property
    def fraction(self) -> float:
        return self.failed / self.jobs if self.jobs else 0.0

    def suspect(self, config: Config) -> bool:
        return self.failed >= config.why.suspect_min_failed_jobs and \
            self.fraction >= config.why.suspect_failed_fraction

    def words(self) -> str:
        return f"{self.failed} of its {self.jobs} jobs failed with no evidence on any node"


def counted(jobs: Iterable[FinishedJob]) -> list[FinishedJob]:
    """The jobs that count: ended, with nodes."""
    return [job for job in jobs if job.ended and job.nodes]


def failed_jobs(jobs: Iterable[FinishedJob]) -> list[FinishedJob]:
    return [job for job in jobs if job.state in SUSPECT_STATES]


def score(jobs: Iterable[FinishedJob], evidence: dict[str, set[str]], unknown: frozenset[str] = frozenset()
          ) -> dict[str, Score]:
    """node -> its score. `evidence`: failed job id -> the nodes with evidence in it (empty: none); the
    failed jobs in `unknown` (Prometheus had no data of some of their nodes) count for no one."""
    scores: dict[str, Score] = {}
    for job in jobs:
        explained_by = evidence.get(job.id, set())
        for node in job.nodes:
            entry = scores.setdefault(node, Score(node))
            entry.jobs += 1
            if job.state not in SUSPECT_STATES or job.id in unknown:
                continue
            if node in explained_by:
                entry.explained += 1
            elif not explained_by:
                entry.failed += 1
    return dict(sorted(scores.items()))
