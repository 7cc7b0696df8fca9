"""The last fabric test's figures as metrics for node_exporter's textfile collector, for the InfiniBand
dashboard's "Fabric test" row (opsctl/dashboards/infiniband.py).

Written beside opsctl's own metrics (metrics.textfile, e.g. /var/lib/prometheus/node-exporter/opsctl.prom) as
`<its stem>-fabric-test.prom`, on the host that runs the test, so that node_exporter there serves both and
neither run erases the other's; with no metrics.textfile configured nothing is written. Per node and rail
(labels `slurm_node`, `device` the HCA, `rail`), as in the picture (opsctl.fabrictest.figures):

    opsctl_fabric_test_rail_gbps{slurm_node="gpu010",device="mlx5_3",rail="3"} 196.2   (a rail not tested: none)
    opsctl_fabric_test_culprit{slurm_node="gpu010",device="mlx5_3",rail="3"} 1          (named slow or dead, else 0)
    opsctl_fabric_test_rail_status{...} 2                         (0 good, 1 unknown, 2 slow, 3 dead)

and the run's `opsctl_fabric_test_expected_gbps`, `opsctl_fabric_test_slow_gbps` and
`opsctl_fabric_test_timestamp_seconds`. Each run replaces the whole file (atomically, opsctl.fileio), so a
node no longer tested drops out. A file that cannot be written is a warning: the run's result stands.
"""

from collections.abc import Callable
from pathlib import Path

from opsctl.fabrictest.figures import Scale, figures
from opsctl.fabrictest.pairing import DEAD, GOOD, SLOW, UNKNOWN
from opsctl.fabrictest.run import FabricTest
from opsctl.fileio import write_atomic

STATUS = {GOOD: 0, UNKNOWN: 1, SLOW: 2, DEAD: 3}
GBPS = "opsctl_fabric_test_rail_gbps"
CULPRIT = "opsctl_fabric_test_culprit"
RAIL_STATUS = "opsctl_fabric_test_rail_status"
EXPECTED = "opsctl_fabric_test_expected_gbps"
SLOW_GBPS = "opsctl_fabric_test_slow_gbps"
TIMESTAMP = "opsctl_fabric_test_timestamp_seconds"


def fabric_textfile(metrics_textfile: str) -> Path:
    """Where the fabric test's metrics go: beside opsctl's own textfile."""
    path = Path(metrics_textfile)
    return path.with_name(f"{path.stem}-fabric-test{path.suffix}")


def metrics_text(result: FabricTest, scale: Scale, now: float) -> str:
    rows = figures(result)
    lines = [f"# HELP {GBPS} The bandwidth the last fabric test measured on the node's rail, Gb/s (a culprit's "
             "worst, else its last against a partner not named on that rail).",
             f"# TYPE {GBPS} gauge"]
    lines += [f"{GBPS}{{{_labels(f.node, f.hca, f.rail)}}} {f.gbps:.2f}" for f in rows if f.gbps is not None]
    lines += [f"# HELP {CULPRIT} 1 when the last fabric test named the node's rail slow or dead, else 0.",
              f"# TYPE {CULPRIT} gauge"]
    lines += [f"{CULPRIT}{{{_labels(f.node, f.hca, f.rail)}}} {int(f.culprit)}" for f in rows]
    lines += [f"# HELP {RAIL_STATUS} The last fabric test's verdict on the node's rail: 0 good, 1 unknown, 2 slow, "
              "3 dead.",
              f"# TYPE {RAIL_STATUS} gauge"]
    lines += [f"{RAIL_STATUS}{{{_labels(f.node, f.hca, f.rail)}}} {STATUS[f.verdict]}" for f in rows]
    for name, value, what in ((EXPECTED, scale.expected_gbps, "The rate a healthy rail is drawn against, Gb/s."),
                              (SLOW_GBPS, scale.slow_gbps, "Below this a rail is slow, Gb/s (ib.slow_gbps)."),
                              (TIMESTAMP, now, "When the last fabric test ended.")):
        lines += [f"# HELP {name} {what}", f"# TYPE {name} gauge", f"{name} {value:.3f}"]
    return "\n".join(lines) + "\n"


def _labels(node: str, hca: str, rail: int) -> str:
    return f'slurm_node="{_escape(node)}",device="{_escape(hca)}",rail="{rail}"'


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def write_metrics(metrics_textfile: str | None, result: FabricTest, scale: Scale, now: float,
                  warn: Callable[[str], None]) -> Path | None:
    """Write the run's metrics beside metrics.textfile; None when it is not configured or not written."""
    if not metrics_textfile:
        return None
    path = fabric_textfile(metrics_textfile)
    try:
        write_atomic(path, metrics_text(result, scale, now), 0o644)
    except OSError as err:
        warn(f"metrics.textfile: {path}: {err.strerror or err}; fabric test metrics not written")
        return None
    return path
