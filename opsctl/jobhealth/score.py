"""The robust score of one node against the other nodes of its job: pure, so that tests give it any values.

    score = |x - median| / (1.4826 * MAD)

MAD is the median of the absolute deviations from the median; 1.4826 makes it the standard deviation of
normally spread values, so that the score reads as a z-score (Iglewicz and Hoaglin's modified z-score, whose
usual cut is 3.5) that one or two bad nodes cannot drag, as they drag a mean and a standard deviation.

Healthy nodes of one job are near identical (eight nodes at 1980 MHz have a MAD of 0), where any jitter
would score without bound. So the MAD is taken as at least `job_health.mad_floor` of the median, and a node
is an outlier only when, beside its score, it is at least `job_health.min_deviation` of the median away:
1.5 % of jitter never names a node, whatever the MAD. Fewer than three nodes have no median to stand out
from (of two, either could be the odd one), and a median of 0 has no share to compare with: no score.
"""

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

MAD_SCALE = 1.4826
MIN_NODES = 3


@dataclass(frozen=True)
class Score:
    value: float
    median: float
    score: float  # the robust score, as above
    deviation: float  # |value - median| / |median|


def scores(values: Mapping[str, float], mad_floor: float) -> dict[str, Score]:
    """Each node's score against the median of all of them (itself included); {} when none can be taken."""
    if len(values) < MIN_NODES:
        return {}
    median = statistics.median(values.values())
    if median == 0:
        return {}
    mad = statistics.median(abs(v - median) for v in values.values())
    scale = MAD_SCALE * max(mad, mad_floor * abs(median))
    return {node: Score(value, median, abs(value - median) / scale if scale else 0.0,
                        abs(value - median) / abs(median)) for node, value in values.items()}


def outliers(values: Mapping[str, float], bad: str, mad_floor: float, min_score: float,
             min_deviation: float) -> dict[str, Score]:
    """The nodes on the `bad` side of the median (low or high) whose score and deviation both reach theirs."""
    found = {}
    for node, score in scores(values, mad_floor).items():
        wrong_side = score.value < score.median if bad == "low" else score.value > score.median
        if wrong_side and score.score >= min_score and score.deviation >= min_deviation:
            found[node] = score
    return found
