"""A fabric-test run's figures, once its report is out: the metrics for the InfiniBand dashboard (beside
metrics.textfile, opsctl.fabrictest.textfile) and the pictures asked for (opsctl.fabrictest.picture), whose
history strip shows the kept runs of the history (opsctl.fabrictest.history)."""

import time
from collections.abc import Callable, Sequence

from opsctl.config.schema import Config
from opsctl.errors import OpsctlError
from opsctl.fabrictest.figures import PastRun, Scale
from opsctl.fabrictest.history import HistoryRun, assess, culprits, kept
from opsctl.fabrictest.picture import write_pictures
from opsctl.fabrictest.run import FabricTest, read_history
from opsctl.fabrictest.textfile import write_metrics

STRIP_RUNS = 10  # the picture draws the last ten


def publish(config: Config, result: FabricTest, html: str | None, svg: str | None, png: str | None,
            warn: Callable[[str], None], now: float | None = None) -> None:
    now = time.time() if now is None else now
    scale = Scale(expected_gbps=config.hardware.ib_rate_bytes_per_second * 8 / 1e9, slow_gbps=result.slow_gbps)
    write_metrics(config.metrics.textfile, result, scale, now, warn=warn)
    if not (html or svg or png):
        return
    try:
        runs = kept(read_history(config), now)
    except OpsctlError as err:  # the picture goes on without its strip
        warn(f"the picture has no history strip: {err}")
        runs = []
    title = f"opsctl ib fabric-test, {time.strftime('%Y-%m-%d %H:%M %Z', time.localtime(now))}"
    write_pictures(result, scale, html, svg, png, history=past_runs(runs), title=title)


def past_runs(runs: Sequence[HistoryRun]) -> list[PastRun]:
    """The history's runs as the strip draws them, oldest first: per node and rail the best rate its tests
    reached in that run (a bad end never reaches full rate; a good one does with any good partner), and
    marked, the node/rails that the history as a whole names, in each run that tested them."""
    named = {(e.node, e.hca) for e in culprits(assess(runs))}
    strip = []
    for run in runs[-STRIP_RUNS:]:
        best: dict[tuple[str, int], float] = {}
        for test in run.tests:
            for node in (test.node, test.partner):
                key = (node, test.rail)
                best[key] = max(best.get(key, 0.0), test.gbps)
        label = time.strftime("%Y-%m-%d %H:%M", time.localtime(run.time))
        strip.append(PastRun(label=f"run {run.run}, {label}", gbps=best,
                             culprits=frozenset(key for key in best if (key[0], run.hcas[key[1]]) in named)))
    return strip
