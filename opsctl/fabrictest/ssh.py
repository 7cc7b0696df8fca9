"""fabric-test's SSH: paramiko, one connection per host, commands on channels of it, every step under
a deadline, because a host can accept the connection and then never answer.

Host keys are checked against the inventory's known_hosts: an unknown or changed key is refused,
never added. Deadlines: connecting (TCP, banner, key exchange, authentication: each within
`connect_timeout`), then opening a session, the exec request, each read and the exit status
(together within the command's timeout, counted once connected). The connection sends keepalives.
paramiko's exec request and exit status wait without a timeout of their own: a timer closes the
channel at the deadline (which wakes the exec request), and the exit status is waited for on the
event paramiko sets. A step past its deadline closes its channel and is a SourceUnavailable of one
line naming the host, the step and the deadline. sshd's refusal of a session beyond its MaxSessions
is asked again for SESSION_RETRY_SECONDS.
"""

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import paramiko

from opsctl.errors import SourceUnavailable
from opsctl.fabrictest.inventory import SshHost

KEEPALIVE_SECONDS = 15.0
# What paramiko raises when a connection or channel fails or is closed under it.
_SSH_ERRORS = (paramiko.SSHException, OSError, EOFError)


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


@dataclass(frozen=True)
class Deadline:
    seconds: float  # the allowance, as messages name it
    end: float  # time.monotonic() when it has passed

    @classmethod
    def after(cls, seconds: float) -> "Deadline":
        return cls(seconds, time.monotonic() + seconds)

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())


def _timed_out(host: str, step: str, deadline: Deadline, command: str) -> SourceUnavailable:
    return SourceUnavailable(f"{host}: {step} timed out ({deadline.seconds:g}s deadline of `{command}`)")


def _why(err: BaseException) -> str:
    return (err.strerror if isinstance(err, OSError) else None) or str(err) or type(err).__name__


class ParamikoRemote:
    """One SSH connection per host, opened on first use; commands run on channels of it."""

    def __init__(self, hosts: dict[str, SshHost], connect_timeout: float = 10.0,
                 keepalive_seconds: float = KEEPALIVE_SECONDS,
                 client_factory: Callable[[], paramiko.SSHClient] = paramiko.SSHClient):
        self.hosts = hosts
        self.connect_timeout = connect_timeout
        self.keepalive_seconds = keepalive_seconds
        self._client_factory = client_factory
        self._clients: dict[str, paramiko.SSHClient] = {}
        self._connecting: dict[str, threading.Lock] = {}  # per host: one slow host holds up no other
        self._lock = threading.Lock()

    def _client(self, name: str) -> paramiko.SSHClient:
        with self._lock:
            host_lock = self._connecting.setdefault(name, threading.Lock())
        with host_lock:
            if name not in self._clients:
                client = self._connect(name)
                with self._lock:
                    self._clients[name] = client
            return self._clients[name]

    def _connect(self, name: str) -> paramiko.SSHClient:
        host = self.hosts[name]
        client = self._client_factory()
        try:
            if host.known_hosts:
                client.load_host_keys(host.known_hosts)
            else:
                client.load_system_host_keys()
        except OSError as err:
            raise SourceUnavailable(f"{name}: cannot read known_hosts {host.known_hosts}: {err.strerror}") from err
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        limit = self.connect_timeout
        started = time.monotonic()
        try:
            client.connect(host.address, port=host.port, username=host.user, key_filename=host.key_file,
                           timeout=limit, banner_timeout=limit, auth_timeout=limit, channel_timeout=limit,
                           allow_agent=host.key_file is None, look_for_keys=host.key_file is None)
            transport = client.get_transport()
            if transport is None:
                raise paramiko.SSHException("no transport after connect")
            transport.set_keepalive(self.keepalive_seconds)
        except _SSH_ERRORS as err:
            message = _connect_error(name, host, client.get_transport(), err, limit,
                                     out_of_time=time.monotonic() - started >= 0.9 * limit)
            client.close()
            raise SourceUnavailable(message) from err
        return client

    def _deadline(self, host: str, timeout: float) -> Deadline:
        """A command's deadline, counted once connected (connecting has deadlines of its own)."""
        self._client(host)
        return Deadline.after(timeout)

    def _session(self, host: str, command: str, deadline: Deadline) -> paramiko.Channel:
        """A channel on which `command` runs, the exec request answered, within the deadline."""
        transport = self._client(host).get_transport()
        if transport is None or not transport.is_active():
            raise SourceUnavailable(f"{host}: the SSH connection closed")
        channel = open_session(transport, host, deadline=deadline)
        try:
            channel.set_combine_stderr(True)
            exec_within(channel, host, command, deadline)
        except BaseException:
            channel.close()
            raise
        return channel

    def start(self, host: str, command: str, ready: str, timeout: float) -> "ParamikoRunning":
        deadline = self._deadline(host, timeout)
        channel = self._session(host, command, deadline)
        seen = b""
        try:
            while ready.encode() not in seen:  # recv() only what is there: the deadline is this loop's
                if channel.recv_ready():
                    seen += channel.recv(65536)
                elif channel.exit_status_ready():
                    raise SourceUnavailable(f"{host}: `{command}` ended before it was ready: "
                                            f"{last_line(seen.decode(errors='replace'))}")
                elif not deadline.left():
                    raise _timed_out(host, f"waiting for {ready!r}", deadline, command)
                else:
                    time.sleep(0.05)
        except _SSH_ERRORS as err:
            channel.close()
            raise SourceUnavailable(f"{host}: `{command}`: the SSH channel failed: {_why(err)}") from err
        except BaseException:
            channel.close()
            raise
        return ParamikoRunning(channel)

    def run(self, host: str, command: str, timeout: float) -> tuple[int, str]:
        deadline = self._deadline(host, timeout)
        channel = self._session(host, command, deadline)
        chunks = []
        try:
            while True:
                channel.settimeout(deadline.left())
                try:
                    data = channel.recv(65536)
                except TimeoutError as err:
                    raise _timed_out(host, "reading the output", deadline, command) from err
                if not data:
                    break
                chunks.append(data)
            # paramiko's recv_exit_status() waits without a deadline; the event it waits on takes one
            if not channel.status_event.wait(deadline.left()):
                raise _timed_out(host, "waiting for the exit status", deadline, command)
            return channel.recv_exit_status(), b"".join(chunks).decode(errors="replace")
        except _SSH_ERRORS as err:
            raise SourceUnavailable(f"{host}: `{command}`: the SSH channel failed: {_why(err)}") from err
        finally:
            channel.close()

    def close(self) -> None:
        with self._lock:
            clients = list(self._clients.values())
        for client in clients:
            client.close()


def _connect_error(name: str, host: SshHost, transport: paramiko.Transport | None, err: BaseException,
                   limit: float, out_of_time: bool) -> str:
    """One line for a failed connect, naming the step it stopped at."""
    where = f"{name}: SSH to {host.address}:{host.port}"
    if isinstance(err, paramiko.BadHostKeyException):
        return f"{name}: host key of {host.address} changed; refused"
    if "not found in known_hosts" in str(err):
        return f"{name}: host key of {host.address} is not in known_hosts; refused, never added"
    if isinstance(err, OSError) and (transport is None or not transport.remote_version):
        return f"{name}: cannot connect to {host.address}:{host.port} within {limit:g}s: {_why(err)}"
    if transport is None or not transport.remote_version:
        step = "the SSH banner"
    elif not transport.initial_kex_done:
        step = "the key exchange"
    elif not transport.is_authenticated():
        step = "authentication"
    else:
        step = "setting up the connection"
    if out_of_time:  # paramiko's message then is whatever failed next ("No existing session")
        return f"{where}: {step} timed out after {limit:g}s"
    return f"{where}: {step} failed: {_why(err)}"


def exec_within(channel: paramiko.Channel, host: str, command: str, deadline: Deadline) -> None:
    """channel.exec_command(command), which waits for sshd's answer without a deadline: a timer closes
    the channel when the deadline passes, which ends that wait (paramiko wakes the waiter on close)."""
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        try:
            channel.close()  # wakes the waiter first, then tells sshd
        except _SSH_ERRORS:
            pass  # the connection went meanwhile: the channel is closed all the same

    timer = threading.Timer(deadline.left(), expire)
    timer.daemon = True
    timer.start()
    try:
        channel.exec_command(command)
    except _SSH_ERRORS as err:
        if expired.is_set():
            raise _timed_out(host, "the exec request", deadline, command) from err
        raise SourceUnavailable(f"{host}: sshd refused to run `{command}`: {_why(err)}") from err
    finally:
        timer.cancel()
    if expired.is_set():  # answered as the timer fired: the channel is closed all the same
        raise _timed_out(host, "the exec request", deadline, command)


# sshd allows MaxSessions (10 by default) sessions on one connection; the rails of a round use up to 8,
# and the channels of the round before may still be closing. A refused session is asked for again.
SESSION_RETRY_SECONDS = 10.0


class SessionOpener(Protocol):
    def open_session(self, *, timeout: float | None = None) -> paramiko.Channel: ...


def open_session(transport: SessionOpener, host: str, retry_seconds: float = SESSION_RETRY_SECONDS,
                 sleep: Callable[[float], None] = time.sleep, deadline: Deadline | None = None) -> paramiko.Channel:
    """A session channel within the deadline (sshd's answer to each request included; 60 s without
    one); a refusal is asked again for `retry_seconds`, or until the deadline when that comes first."""
    deadline = deadline or Deadline.after(60.0)
    refusals_end = min(time.monotonic() + retry_seconds, deadline.end)
    delay = 0.05
    while True:
        try:
            return transport.open_session(timeout=deadline.left())
        except paramiko.ChannelException as err:
            if time.monotonic() + delay > refusals_end:
                raise SourceUnavailable(f"{host}: sshd refused another session ({err}) for "
                                        f"{min(retry_seconds, deadline.seconds):g}s; raise its MaxSessions or "
                                        "lower ib.parallel") from err
            sleep(delay)
            delay = min(delay * 2, 1.0)
        except _SSH_ERRORS as err:
            # paramiko raises SSHException("Timeout opening channel.") at its deadline
            if "Timeout opening channel" in str(err) or not deadline.left():
                raise SourceUnavailable(f"{host}: opening an SSH session timed out ({deadline.seconds:g}s "
                                        "deadline)") from err
            raise SourceUnavailable(f"{host}: opening an SSH session failed: {_why(err)}") from err


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
