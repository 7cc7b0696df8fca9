"""opsctl's own metrics: what its health runs did, for Prometheus (docs/observability.md).

`opsctl health --watch` serves them on `metrics.listen_address`; a one-shot run (the timer's) writes
them to `metrics.textfile` for node_exporter's textfile collector. The command layer calls
`RunRecorder.wrap` around each run; nothing in the health or remediation core knows about metrics.
"""

from opsctl.metrics.recorder import RunRecorder
from opsctl.metrics.state import FAMILIES, MetricsState

__all__ = ["FAMILIES", "MetricsState", "RunRecorder"]
