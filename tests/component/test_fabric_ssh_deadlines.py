"""fabric-test's SSH calls with real paramiko over loopback TCP: a listener that accepts and never speaks
SSH, and a paramiko SSH server whose sshd side never answers a session or an exec request (its
request handlers block, as a wedged sshd would). Each call ends within its deadline with one line
naming the host and the step; the MaxSessions refusal is still asked again. No sshd is needed."""

import socket
import threading
import time

import paramiko
import pytest

from opsctl.errors import SourceUnavailable
from opsctl.fabrictest.inventory import SshHost
from opsctl.fabrictest.ssh import ParamikoRemote

SLACK = 1.0  # seconds past the deadline a call may take on a busy 2-core machine


class Sshd(paramiko.ServerInterface):
    def __init__(self, release: threading.Event, hang_session=False, hang_exec=False, refusals=0):
        self.release = release
        self.hang_session, self.hang_exec, self.refusals = hang_session, hang_exec, refusals

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind, chanid):
        if self.hang_session:
            self.release.wait()
        if self.refusals > 0:  # what sshd answers beyond MaxSessions
            self.refusals -= 1
            return paramiko.OPEN_FAILED_CONNECT_FAILED
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel, command):
        if self.hang_exec:
            self.release.wait()
            return False

        def answer():
            time.sleep(0.05)  # after the exec request's reply
            channel.sendall(b"ok\n")
            channel.send_exit_status(0)
            channel.close()

        threading.Thread(target=answer, daemon=True).start()
        return True


@pytest.fixture
def listener():
    """(port, serve): serve(None) accepts and stays silent; serve(Sshd) speaks SSH with that server."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    release = threading.Event()
    held: list = []
    behaviour = {}
    host_key = paramiko.RSAKey.generate(1024)

    def accept():
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            held.append(conn)
            if behaviour.get("sshd") is not None:
                transport = paramiko.Transport(conn)
                transport.add_server_key(host_key)
                transport.start_server(server=behaviour["sshd"])
                held.append(transport)

    threading.Thread(target=accept, daemon=True).start()
    yield sock.getsockname()[1], host_key, release, behaviour
    release.set()
    sock.close()
    for thing in held:
        thing.close()


def _remote(tmp_path, port, host_key, connect_timeout=0.5) -> ParamikoRemote:
    key_file = tmp_path / "id_rsa"
    paramiko.RSAKey.generate(1024).write_private_key_file(str(key_file))
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} ssh-rsa {host_key.get_base64()}\n")
    hosts = {"gpu1": SshHost("gpu1", "127.0.0.1", port, "ops", str(key_file), str(known_hosts))}
    return ParamikoRemote(hosts, connect_timeout=connect_timeout)


def _call(call):
    started = time.monotonic()
    try:
        return call(), time.monotonic() - started
    except SourceUnavailable as err:
        return err, time.monotonic() - started


def test_connect_to_a_listener_that_never_speaks_ssh_ends_in_time(tmp_path, listener):
    port, host_key, _, _ = listener
    remote = _remote(tmp_path, port, host_key)
    err, took = _call(lambda: remote.run("gpu1", "true", 30))
    remote.close()
    assert isinstance(err, SourceUnavailable), err
    assert str(err) == f"gpu1: SSH to 127.0.0.1:{port}: the SSH banner timed out after 0.5s"
    assert took < 0.5 + SLACK


@pytest.mark.parametrize("hang,step", [("hang_exec", "gpu1: the exec request timed out (0.8s deadline of `true`)"),
                                       ("hang_session", "gpu1: opening an SSH session timed out (0.8s deadline)")])
def test_a_wedged_sshd_fails_the_command_in_time(tmp_path, listener, hang, step):
    port, host_key, release, behaviour = listener
    behaviour["sshd"] = Sshd(release, **{hang: True})
    remote = _remote(tmp_path, port, host_key)
    err, took = _call(lambda: remote.run("gpu1", "true", 0.8))
    remote.close()
    assert isinstance(err, SourceUnavailable), err
    assert str(err) == step
    assert took < 0.8 + SLACK


def test_an_answering_sshd_runs_the_command_after_refusing_sessions(tmp_path, listener):
    port, host_key, release, behaviour = listener
    behaviour["sshd"] = Sshd(release, refusals=3)
    remote = _remote(tmp_path, port, host_key)
    result, took = _call(lambda: remote.run("gpu1", "true", 5))
    remote.close()
    assert result == (0, "ok\n")
    assert took < 5
