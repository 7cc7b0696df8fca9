"""fabric-test's SSH sessions.

sshd refuses a session beyond its MaxSessions (ChannelException 2, "Connect failed") while the channels
of the round before are still closing; the session is asked for again, and a refusal that lasts is one
clear error.

Every SSH step has a deadline: a host that accepts the connection and then never answers (the session
request, the exec request), never ends its output or never sends its exit status fails that call in
its time, with one line naming the host and the step, and the fabric test goes on. The fakes behave as
paramiko does where it matters: exec_command waits for sshd's answer until the channel is closed,
open_session waits until its timeout (paramiko's default: an hour), recv honours settimeout with
TimeoutError (socket.timeout), and close() sets status_event. Each call runs in a thread of its own,
so that a call that blocks fails its test instead of hanging the suite."""

import threading
import time
from dataclasses import dataclass, field

import paramiko
import pytest

from opsctl.errors import SourceUnavailable
from opsctl.fabrictest.inventory import SshHost
from opsctl.fabrictest.pairing import Test
from opsctl.fabrictest.runner import READY, FabricRunner
from opsctl.fabrictest.ssh import ParamikoRemote, open_session
from tests.conftest import FIXTURES

REPORT = (FIXTURES / "infiniband" / "ib_write_bw_ib_read_bw_cx7_ndr_b2b_client.txt").read_bytes()
SLACK = 0.6  # seconds a call may take past its deadline on a busy 2-core machine


class Transport:
    def __init__(self, refusals: int):
        self.refusals = refusals
        self.asked = 0

    def open_session(self, timeout=None):
        self.asked += 1
        if self.asked <= self.refusals:
            raise paramiko.ChannelException(2, "Connect failed")
        return "channel"


def test_a_refused_session_is_asked_for_again():
    transport = Transport(refusals=3)
    assert open_session(transport, "gpu1", sleep=lambda _s: None) == "channel"
    assert transport.asked == 4


def test_a_lasting_refusal_is_one_error_naming_the_host():
    with pytest.raises(SourceUnavailable, match="gpu1: sshd refused another session"):
        open_session(Transport(refusals=10**6), "gpu1", retry_seconds=0.2)


# --- fakes of paramiko's client, transport and channel ------------------------------------------------


@dataclass
class Host:
    """How a fake host's sshd and commands behave."""

    answers_session: bool = True
    answers_exec: bool = True
    chunks: list[bytes] | None = None  # None: the fabric test's outputs (server banner, client report)
    interval: float = 0.0  # between chunks
    eof: bool = True  # after the chunks; False: the output never ends
    exit_status: int | None = 0  # None: never sent
    channels: list["Channel"] = field(default_factory=list)

    def output(self, command: str) -> list[bytes]:
        if self.chunks is not None:
            return list(self.chunks)
        return [f"{READY} connections\n".encode()] if "stdbuf" in command else [REPORT]


class Channel:
    def __init__(self, host: Host):
        self.host = host
        self.closed = threading.Event()
        self.status_event = threading.Event()
        self.timeout = None
        self.command = None
        self._chunks: list[bytes] = []
        self._due = 0.0

    def set_combine_stderr(self, combine):
        pass

    def settimeout(self, timeout):
        self.timeout = timeout

    def exec_command(self, command):
        self.command = command
        if not self.host.answers_exec:
            self.closed.wait()  # paramiko's Channel._wait_for_event(), which close() wakes
            raise paramiko.SSHException("Channel closed.")
        self._chunks = self.host.output(command)
        self._due = time.monotonic() + self.host.interval
        self._maybe_exit()

    def _maybe_exit(self):
        if not self._chunks and self.host.eof and self.host.exit_status is not None:
            self.status_event.set()

    def recv_ready(self):
        return bool(self._chunks) and time.monotonic() >= self._due

    def recv(self, nbytes):
        if self._chunks:
            wait = self._due - time.monotonic()
            if self.timeout is not None and wait > self.timeout:
                self.closed.wait(self.timeout)
                raise TimeoutError
            time.sleep(max(0.0, wait))
            self._due = time.monotonic() + self.host.interval
            chunk = self._chunks.pop(0)
            self._maybe_exit()
            return chunk
        if self.host.eof or self.closed.is_set():
            return b""
        if not self.closed.wait(self.timeout):
            raise TimeoutError
        return b""

    def exit_status_ready(self):
        return self.closed.is_set() or self.status_event.is_set()

    def recv_exit_status(self):
        self.status_event.wait()
        return self.host.exit_status if self.host.exit_status is not None else -1

    def close(self):
        self.closed.set()
        self.status_event.set()


class FakeTransport:
    def __init__(self, host: Host):
        self.host = host
        self.keepalive = None

    def is_active(self):
        return True

    def set_keepalive(self, interval):
        self.keepalive = interval

    def open_session(self, timeout=None):
        if not self.host.answers_session:
            threading.Event().wait(3600 if timeout is None else timeout)
            raise paramiko.SSHException("Timeout opening channel.")
        channel = Channel(self.host)
        self.host.channels.append(channel)
        return channel


class Fleet:
    """paramiko.SSHClient's stand-in: `client_factory` of ParamikoRemote."""

    def __init__(self, **hosts: Host):
        self.hosts = hosts
        self.clients: list[Client] = []

    def ssh_hosts(self) -> dict[str, SshHost]:
        return {name: SshHost(name, f"10.0.0.{i}", 22, "ops", "/k", "/kh") for i, name in enumerate(self.hosts, 1)}

    def __call__(self):
        client = Client(self)
        self.clients.append(client)
        return client


class Client:
    def __init__(self, fleet: Fleet):
        self.fleet = fleet
        self.transport = None
        self.connect_args = None

    def load_host_keys(self, path):
        pass

    def load_system_host_keys(self):
        pass

    def set_missing_host_key_policy(self, policy):
        assert isinstance(policy, paramiko.RejectPolicy)

    def connect(self, hostname, **kwargs):
        self.connect_args = kwargs
        name = next(n for n, h in self.fleet.ssh_hosts().items() if h.address == hostname)
        self.transport = FakeTransport(self.fleet.hosts[name])

    def get_transport(self):
        return self.transport

    def close(self):
        pass


def remote(fleet: Fleet) -> ParamikoRemote:
    return ParamikoRemote(fleet.ssh_hosts(), connect_timeout=0.5, client_factory=fleet)


def within(seconds: float, call):
    """(value or exception, seconds taken) of call(), failing when it is still blocked after `seconds`."""
    outcome = {}

    def target():
        try:
            outcome["value"] = call()
        except BaseException as err:  # noqa: BLE001 - handed to the test
            outcome["value"] = err

    started = time.monotonic()
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds:g}s"
    return outcome["value"], time.monotonic() - started


# --- deadlines ----------------------------------------------------------------------------------------


def test_connect_has_a_deadline_for_every_step_and_keepalives():
    fleet = Fleet(gpu1=Host(chunks=[b"ok\n"]))
    value, _ = within(2, lambda: remote(fleet).run("gpu1", "true", 1))
    assert value == (0, "ok\n")
    [client] = fleet.clients
    assert {key: client.connect_args[key] for key in ("timeout", "banner_timeout", "auth_timeout")} == {
        "timeout": 0.5, "banner_timeout": 0.5, "auth_timeout": 0.5}
    assert client.transport.keepalive and client.transport.keepalive > 0


def test_an_exec_request_never_answered_fails_in_time_naming_host_and_step():
    fleet = Fleet(gpu1=Host(answers_exec=False))
    err, took = within(0.3 + SLACK + 1, lambda: remote(fleet).run("gpu1", "ib_write_bw -d mlx5_0", 0.3))
    assert isinstance(err, SourceUnavailable), err
    assert str(err) == "gpu1: the exec request timed out (0.3s deadline of `ib_write_bw -d mlx5_0`)"
    assert took < 0.3 + SLACK
    assert all(channel.closed.is_set() for channel in fleet.hosts["gpu1"].channels)


def test_a_server_whose_exec_is_never_answered_fails_in_time():
    fleet = Fleet(gpu1=Host(answers_exec=False))
    err, took = within(0.3 + SLACK + 1, lambda: remote(fleet).start("gpu1", "ib_write_bw", READY, 0.3))
    assert isinstance(err, SourceUnavailable), err
    assert str(err) == "gpu1: the exec request timed out (0.3s deadline of `ib_write_bw`)"
    assert took < 0.3 + SLACK and fleet.hosts["gpu1"].channels[0].closed.is_set()


def test_a_session_request_never_answered_fails_in_time():
    fleet = Fleet(gpu1=Host(answers_session=False))
    err, took = within(0.3 + SLACK + 1, lambda: remote(fleet).run("gpu1", "true", 0.3))
    assert isinstance(err, SourceUnavailable), err
    assert str(err) == "gpu1: opening an SSH session timed out (0.3s deadline)"
    assert took < 0.3 + SLACK


def test_output_that_keeps_trickling_is_cut_at_the_deadline():
    # Each read answers within the timeout, so a timeout per read alone never ends this one.
    fleet = Fleet(gpu1=Host(chunks=[b"."] * 100, interval=0.1))
    err, took = within(0.4 + SLACK + 1, lambda: remote(fleet).run("gpu1", "cat", 0.4))
    assert isinstance(err, SourceUnavailable), err
    assert str(err) == "gpu1: reading the output timed out (0.4s deadline of `cat`)"
    assert took < 0.4 + SLACK and fleet.hosts["gpu1"].channels[0].closed.is_set()


def test_an_exit_status_never_sent_fails_in_time():
    fleet = Fleet(gpu1=Host(chunks=[b"done\n"], exit_status=None))
    err, took = within(0.3 + SLACK + 1, lambda: remote(fleet).run("gpu1", "true", 0.3))
    assert isinstance(err, SourceUnavailable), err
    assert str(err) == "gpu1: waiting for the exit status timed out (0.3s deadline of `true`)"
    assert took < 0.3 + SLACK


def test_a_round_goes_on_past_a_host_that_never_answers_and_names_it():
    fleet = Fleet(gpu1=Host(), gpu2=Host(answers_exec=False), gpu3=Host(), gpu4=Host())
    warnings = []
    runner = FabricRunner(remote(fleet), fleet.ssh_hosts(), ["mlx5_0", "mlx5_1"], timeout=0.3, parallel=2,
                          warn=warnings.append)
    measured, took = within(0.3 + SLACK + 2, lambda: runner.measure([Test("gpu1", "gpu2"), Test("gpu3", "gpu4")]))
    assert took < 0.3 + SLACK
    assert sorted((m.a, m.b, m.rail, round(m.gbps, 2)) for m in measured) == [
        ("gpu1", "gpu2", 0, 0.0), ("gpu1", "gpu2", 1, 0.0), ("gpu3", "gpu4", 0, 392.34), ("gpu3", "gpu4", 1, 392.34)]
    assert sorted(warnings) == [
        f"mlx5_{rail} gpu1 <- gpu2 not tested, counted as 0 Gb/s: gpu2: the exec request timed out (0.3s deadline "
        f"of `timeout -k 2 0 stdbuf -oL ib_write_bw -d mlx5_{rail} -p {18515 + rail} --report_gbits`)"
        for rail in (0, 1)]
    assert sorted(r.error for r in runner.results if r.test.b == "gpu2") == [
        w.split(" 0 Gb/s: ", 1)[1] for w in sorted(warnings)]
    assert all(channel.closed.is_set() for host in fleet.hosts.values() for channel in host.channels)
    assert not fleet.hosts["gpu1"].channels  # the client of a pair whose server never started is not run
