"""Processes this tier started, identified by pid file plus command line, so that `down` ends only
its own processes."""

import os
import signal
import time
from pathlib import Path


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def pid_alive(pid: int, needle: str) -> bool:
    """True while `pid` runs and its command line contains `needle` (a reused pid does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z" and needle in cmdline(pid)


def stop_pid(pid: int, sig: int = signal.SIGTERM, grace: float = 20) -> bool:
    """Send `sig`, wait up to `grace` seconds, then SIGKILL. True if it ended within the grace."""
    needle = cmdline(pid)
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(pid)
        if not pid_alive(pid, needle):
            return True
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _reap(pid)
    return False


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
