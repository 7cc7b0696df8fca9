"""Run the fabric test's rounds: `ib_write_bw` between nodes over SSH, rail-aligned (HCA i to HCA i).

For each pair of a round (opsctl.fabric.pairing plans them), node b serves and node a connects, one
server and one client per rail, each rail on its own TCP port (perftest's 18515 + rail). Every
remote command runs under `timeout`, so a hung test is killed on both ends even when the SSH session
is gone; the client waits for the server's "Waiting for client" banner before it starts. Pairs run
`parallel` at a time. A rail whose test fails or times out measures 0 Gb/s (dead).

SSH is paramiko's, host keys checked against the inventory's known_hosts: an unknown or changed key
is refused, never added.
"""

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import paramiko

from opsctl.errors import OpsctlError, SourceUnavailable
from opsctl.fabric.ib_write_bw import process_ib_write_bw_output
from opsctl.fabric.inventory import SshHost
from opsctl.fabric.pairing import Measurement, Test

PERFTEST_PORT = 18515
READY = "Waiting for client"


class Remote(Protocol):
    """Errors: SourceUnavailable when a host cannot be reached or its key is not the known one."""

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
                result = RailResult(test, rail, 0.0, f"client exit {code}: {_last_line(out)}")
            else:
                report = process_ib_write_bw_output(out)
                gbps = report.bw_average if report.unit == "Gb/sec" else report.bw_average * 8 * 1.048576 / 1000
                result = RailResult(test, rail, gbps)
        except OpsctlError as err:
            if isinstance(err, SourceUnavailable) and "host key" in str(err):
                raise
            result = RailResult(test, rail, 0.0, str(err))
        finally:
            if server is not None:
                server.wait(5)
                server.close()
        if self.on_rail is not None:
            self.on_rail(result)
        return result


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


class ParamikoRemote:
    """One SSH connection per host, opened on first use; commands run on channels of it."""

    def __init__(self, hosts: dict[str, SshHost], connect_timeout: float = 10.0):
        self.hosts = hosts
        self.connect_timeout = connect_timeout
        self._clients: dict[str, paramiko.SSHClient] = {}
        self._lock = threading.Lock()

    def _client(self, name: str) -> paramiko.SSHClient:
        with self._lock:
            if name in self._clients:
                return self._clients[name]
            host = self.hosts[name]
            client = paramiko.SSHClient()
            try:
                if host.known_hosts:
                    client.load_host_keys(host.known_hosts)
                else:
                    client.load_system_host_keys()
            except OSError as err:
                raise SourceUnavailable(f"{name}: cannot read known_hosts {host.known_hosts}: {err.strerror}") from err
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            try:
                client.connect(host.address, port=host.port, username=host.user, key_filename=host.key_file,
                               timeout=self.connect_timeout, allow_agent=host.key_file is None,
                               look_for_keys=host.key_file is None)
            except paramiko.BadHostKeyException as err:
                raise SourceUnavailable(f"{name}: host key of {host.address} changed; refused") from err
            except paramiko.SSHException as err:
                if "not found in known_hosts" in str(err):
                    raise SourceUnavailable(f"{name}: host key of {host.address} is not in known_hosts; "
                                            "refused, never added") from err
                raise SourceUnavailable(f"{name}: SSH to {host.address}: {err}") from err
            except OSError as err:
                raise SourceUnavailable(f"{name}: cannot connect to {host.address}:{host.port}: "
                                        f"{err.strerror or err}") from err
            self._clients[name] = client
            return client

    def _session(self, host: str) -> paramiko.Channel:
        transport = self._client(host).get_transport()
        if transport is None or not transport.is_active():
            raise SourceUnavailable(f"{host}: the SSH connection closed")
        return open_session(transport, host)

    def start(self, host: str, command: str, ready: str, timeout: float) -> "ParamikoRunning":
        channel = self._session(host)
        channel.settimeout(timeout)
        channel.set_combine_stderr(True)
        channel.exec_command(command)
        seen = b""
        deadline = time.monotonic() + timeout
        while ready.encode() not in seen:
            if channel.exit_status_ready() and not channel.recv_ready():
                raise SourceUnavailable(f"{host}: `{command}` ended before it was ready: {_last_line(seen.decode())}")
            if time.monotonic() > deadline:
                channel.close()
                raise SourceUnavailable(f"{host}: `{command}` not ready within {timeout:g}s")
            if channel.recv_ready():
                seen += channel.recv(65536)
            else:
                time.sleep(0.05)
        return ParamikoRunning(channel)

    def run(self, host: str, command: str, timeout: float) -> tuple[int, str]:
        channel = self._session(host)
        channel.settimeout(timeout)
        channel.set_combine_stderr(True)
        channel.exec_command(command)
        chunks = []
        try:
            while True:
                data = channel.recv(65536)
                if not data:
                    break
                chunks.append(data)
            return channel.recv_exit_status(), b"".join(chunks).decode(errors="replace")
        except TimeoutError as err:
            raise SourceUnavailable(f"{host}: `{command}` gave no answer within {timeout:g}s") from err
        finally:
            channel.close()

    def close(self) -> None:
        for client in self._clients.values():
            client.close()


# sshd allows MaxSessions (10 by default) sessions on one connection; the rails of a round use up to 8,
# and the channels of the round before may still be closing. A refused session is asked for again.
SESSION_RETRY_SECONDS = 10.0


class SessionOpener(Protocol):
    def open_session(self) -> paramiko.Channel: ...


def open_session(transport: SessionOpener, host: str, retry_seconds: float = SESSION_RETRY_SECONDS,
                 sleep: Callable[[float], None] = time.sleep) -> paramiko.Channel:
    deadline = time.monotonic() + retry_seconds
    delay = 0.05
    while True:
        try:
            return transport.open_session()
        except paramiko.ChannelException as err:
            if time.monotonic() + delay > deadline:
                raise SourceUnavailable(f"{host}: sshd refused another session ({err}) for {retry_seconds:g}s; "
                                        "raise its MaxSessions or lower ib.parallel") from err
            sleep(delay)
            delay = min(delay * 2, 1.0)


class ParamikoRunning:
    def __init__(self, channel: paramiko.Channel):
        self.channel = channel

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while not self.channel.exit_status_ready():
            if time.monotonic() > deadline:
                return -1  # its `timeout` wrapper ends it on the node
            while self.channel.recv_ready():
                self.channel.recv(65536)
            time.sleep(0.05)
        return int(self.channel.recv_exit_status())

    def close(self) -> None:
        self.channel.close()
