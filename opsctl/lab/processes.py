"""Start and stop the lab's daemons by PID. Every daemon runs in the foreground in its own session,
so its PID file names the real process, and `down` can end its whole process group."""

import os
import signal
import subprocess
import time
from pathlib import Path

from opsctl.errors import LabError


def pid_of(pidfile: Path) -> int | None:
    try:
        pid = int(pidfile.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if alive(pid) else None


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def start(name: str, argv: list[str], run_dir: Path, log_dir: Path, env: dict | None = None,
          user: str | None = None) -> int:
    """Start argv as daemon `name` unless it already runs; returns its PID."""
    pidfile = run_dir / f"{name}.pid"
    pid = pid_of(pidfile)
    if pid is not None:
        return pid
    run_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"{name}.log", "ab") as log:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, env={**os.environ, **(env or {})}, user=user)
        except OSError as err:
            raise LabError(f"cannot start {name} ({argv[0]}): {err}") from err
    pidfile.write_text(f"{proc.pid}\n")
    return proc.pid


def stop_all(run_dir: Path, timeout: float = 10.0) -> list[str]:
    """SIGTERM every recorded daemon's process group, SIGKILL what outlives the timeout."""
    pids = {}
    for pidfile in sorted(run_dir.glob("*.pid")) if run_dir.is_dir() else []:
        pid = pid_of(pidfile)
        if pid is not None:
            pids[pidfile.stem] = pid
            _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids.values():
        if alive(pid):
            _signal_group(pid, signal.SIGKILL)
    for pidfile in run_dir.glob("*.pid") if run_dir.is_dir() else []:
        pidfile.unlink(missing_ok=True)
    return sorted(pids)


def stop(name: str, run_dir: Path, timeout: float = 10.0) -> None:
    pidfile = run_dir / f"{name}.pid"
    pid = pid_of(pidfile)
    if pid is not None:
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(pid):
            _signal_group(pid, signal.SIGKILL)
    pidfile.unlink(missing_ok=True)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(pid, sig)


def running(run_dir: Path) -> dict:
    """name -> PID of every recorded daemon that is alive."""
    found = {}
    for pidfile in sorted(run_dir.glob("*.pid")) if run_dir.is_dir() else []:
        pid = pid_of(pidfile)
        if pid is not None:
            found[pidfile.stem] = pid
    return found
