"""Record each health run into the metrics, and publish them: served while `--watch` runs, written to
node_exporter's textfile directory after a one-shot run.

The textfile is replaced atomically and durably (opsctl.fileio.write_atomic: a new file with a random
name beside it, created O_EXCL|O_NOFOLLOW, then renamed), so node_exporter never reads half a file and
a name planted in the textfile directory is never followed. A textfile that cannot be written is
reported on stderr and never changes the run's exit code: metrics must not stop opsctl from draining.
"""

import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.registry import Collector

from opsctl.config.schema import MetricsConfig
from opsctl.errors import ConfigError, OpsctlError, SafetyStop
from opsctl.fileio import read_nofollow, write_atomic
from opsctl.health.run import RunResult
from opsctl.metrics.observe import run_facts
from opsctl.metrics.state import MetricsState

Run = Callable[[], RunResult]


class RunRecorder:
    def __init__(self, config: MetricsConfig, serve: bool, warn: Callable[[str], None],
                 clock: Callable[[], float] = time.time):
        self.state = MetricsState()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.state)
        self.listen = config.listen_address if serve else None
        self.textfile = None if serve else config.textfile
        self.warn = warn
        self.clock = clock
        if self.textfile:
            self._restore(Path(self.textfile))

    @property
    def active(self) -> bool:
        return bool(self.listen or self.textfile)

    def start(self) -> None:
        """Serve /metrics on metrics.listen_address (a --watch run); before the first run, so a scrape
        during it already answers."""
        if not self.listen:
            return
        host, _, port = self.listen.rpartition(":")
        try:
            start_http_server(int(port), addr=host.strip("[]"), registry=self.registry)
        except OSError as err:
            raise ConfigError(f"config key metrics.listen_address: cannot listen on {self.listen}: "
                              f"{err.strerror or err}") from None

    def wrap(self, run: Run) -> Run:
        if not self.active:
            return run

        def recorded() -> RunResult:
            started = time.monotonic()
            try:
                result = run()
            except OpsctlError as err:
                # The health run raises SafetyStop only when another acting run holds the lock.
                if isinstance(err, SafetyStop):
                    self.state.record_refusal("lock")
                self._finish(int(err.exit_code), started)
                raise
            self.state.record_completed(run_facts(result), self.clock())
            self._finish(int(result.exit_code), started)
            return result

        return recorded

    def _finish(self, exit_code: int, started: float) -> None:
        self.state.record_run(exit_code, time.monotonic() - started, self.clock())
        if self.textfile:
            self._write(Path(self.textfile))

    def _restore(self, path: Path) -> None:
        try:
            text = read_nofollow(path)  # a symlink or FIFO planted there is refused, never followed or waited on
        except OSError as err:
            self.warn(f"opsctl: warning: metrics.textfile {path}: {err.strerror}; counters start again from 0")
            return
        if text is None:
            return
        try:
            self.state.restore(text)
        except ValueError:
            self.warn(f"opsctl: warning: metrics.textfile {path} is not in Prometheus' text format; "
                      "counters start again from 0")

    def _write(self, path: Path) -> None:
        try:
            write_atomic(path, generate_latest(self.registry), 0o644)
        except OSError as err:
            self.warn(f"opsctl: warning: metrics.textfile {path}: {err.strerror or err}; metrics not written")


def write_textfile(path: Path, collector: Collector, warn: Callable[[str], None]) -> None:
    """Another run's metrics (opsctl job-health's) in a textfile of their own, replaced whole as the health run's
    is; a file that cannot be written is a warning, never the run's failure."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        write_atomic(path, generate_latest(registry), 0o644)
    except OSError as err:
        warn(f"opsctl: warning: {path}: {err.strerror or err}; metrics not written")
