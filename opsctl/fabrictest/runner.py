"""Run the fabric test's rounds: `ib_write_bw` between nodes over SSH, rail-aligned (HCA i to HCA i).

For each pair of a round (opsctl.fabrictest.pairing plans them), node b serves and node a connects, one
server and one client per rail, each rail on its own TCP port (perftest's 18515 + rail). Every
remote command runs under `timeout`, so a hung test is killed on both ends even when the SSH session
is gone; the client waits for the server's "Waiting for client" banner before it starts. Pairs run
`parallel` at a time. A rail whose test fails or times out measures 0 Gb/s (dead).

SSH is opsctl.fabrictest.ssh's: host keys checked against the inventory's known_hosts (an unknown or
changed key is refused, never added, and stops the run), and every SSH step under a deadline. A rail
whose SSH call fails or runs past its deadline counts as 0 Gb/s like a failed test, `warn` is told
in one line (the host and the step), and the run goes on.
"""

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from opsctl.errors import OpsctlError, SourceUnavailable
from opsctl.fabrictest.ib_write_bw import parse_ib_write_bw
from opsctl.fabrictest.inventory import SshHost
from opsctl.fabrictest.pairing import Measurement, Test
from opsctl.fabrictest.ssh import ParamikoRemote as ParamikoRemote  # what `opsctl ib fabric-test` connects with
from opsctl.fabrictest.ssh import last_line

PERFTEST_PORT = 18515
READY = "Waiting for client"


class Remote(Protocol):
    """Errors: SourceUnavailable when a host cannot be reached or its key is not the known one, or a
    step of the command does not finish within `timeout`."""

    def start(self, host: str, command: str, ready: str, timeout: float) -> "Running": ...

    def run(self, host: str, command: str, timeout: float) -> tuple[int, str]: ...


class Running(Protocol):
    def wait(self, timeout: float) -> int: ...

    def close(self) -> None: ...


@dataclass
class RailResult:
    test: Test
    rail: int
    gbps: float
    error: str = ""


@dataclass
class FabricRunner:
    remote: Remote
    hosts: dict[str, SshHost]
    hcas: list[str]
    timeout: float = 60.0
    parallel: int = 8
    results: list[RailResult] = field(default_factory=list)
    on_rail: Callable[[RailResult], None] | None = None
    warn: Callable[[str], None] | None = None  # told of each rail that could not be tested, in one line

    def measure(self, tests: list[Test]) -> list[Measurement]:
        jobs = [(test, rail) for test in tests for rail in range(len(self.hcas))]
        with ThreadPoolExecutor(max_workers=max(1, self.parallel) * len(self.hcas)) as pool:
            done = list(pool.map(lambda job: self._rail(*job), jobs))
        self.results.extend(done)
        return [Measurement(r.test.a, r.test.b, r.rail, r.gbps) for r in done]

    def _rail(self, test: Test, rail: int) -> RailResult:
        hca, port = self.hcas[rail], PERFTEST_PORT + rail
        limit = int(self.timeout)
        base = f"ib_write_bw -d {hca} -p {port} --report_gbits"
        server = None
        try:
            server = self.remote.start(test.b, f"timeout -k 2 {limit} stdbuf -oL {base}", READY, self.timeout)
            code, out = self.remote.run(test.a, f"timeout -k 2 {limit} {base} {self.hosts[test.b].address}",
                                        self.timeout + 5)
            if code != 0:
                result = RailResult(test, rail, 0.0, f"client exit {code}: {last_line(out)}")
            else:
                report = parse_ib_write_bw(out)
                gbps = report.bw_average if report.unit == "Gb/sec" else report.bw_average * 8 * 1.048576 / 1000
                result = RailResult(test, rail, gbps)
        except OpsctlError as err:
            if isinstance(err, SourceUnavailable) and "host key" in str(err):
                raise
            result = RailResult(test, rail, 0.0, str(err))
            if self.warn is not None:
                self.warn(f"{hca} {test.a} <- {test.b} not tested, counted as 0 Gb/s: {err}")
        finally:
            if server is not None:
                server.wait(5)
                server.close()
        if self.on_rail is not None:
            self.on_rail(result)
        return result
