"""Processes the lab starts and stops, and the host commands it runs: one place for both tiers.

A PID file holds "<pid> <start time>", the start time being the process's start in clock ticks
since boot (/proc/<pid>/stat field 22). A PID that the kernel has given to another process since
has another start time, so the lab never signals a process it did not start. Daemons run in the
foreground in their own session, so a PID file names the real process and `stop` can end its whole
process group.
"""

import os
import signal
import subprocess
import time
from pathlib import Path

from opsctl_lab.errors import LabError


def run(args: list[str], check: bool = True, timeout: float = 600,
        **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run a host command; a failure becomes one LabError line that names the command."""
    try:
        # The callers pass run()'s own keywords (cwd, env, input); as **object they match no overload.
        result: subprocess.CompletedProcess[str] = subprocess.run(  # type: ignore[call-overload]
            args, capture_output=True, text=True, timeout=timeout, **kwargs)
    except FileNotFoundError as err:
        raise LabError(f"{args[0]} is not installed (make deps-lab or deps-machines installs what the lab needs)") \
            from err
    except subprocess.TimeoutExpired as err:
        raise LabError(f"{' '.join(args[:3])} ... took longer than {timeout:.0f}s") from err
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise LabError(f"{' '.join(args)} failed (rc {result.returncode}): {detail[-1] if detail else 'no output'}")
    return result


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot); None when it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # After the ")" of the command name: field 3 (state) is fields[0], field 22 (starttime) fields[19].
    return None if fields[0] == "Z" else int(fields[19])


def alive(pid: int, started: int | None = None) -> bool:
    """True while `pid` runs (not a zombie) and, when `started` is given, is that same process."""
    now = start_time(pid)
    return now is not None and (started is None or now == started)


def write_pidfile(path: Path, pid: int) -> None:
    path.write_text(f"{pid} {start_time(pid) or 0}\n")


def read_pidfile(path: Path) -> int | None:
    """The PID in `path` if that very process still runs, else None."""
    try:
        parts = path.read_text().split()
        pid, started = int(parts[0]), int(parts[1]) if len(parts) > 1 else None
    except (OSError, ValueError, IndexError):
        return None
    return pid if alive(pid, started) else None


def _signal(pid: int, sig: int, group: bool) -> None:
    try:
        if group:
            try:
                os.killpg(pid, sig)
                return
            except PermissionError:
                pass
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop_pids(pids: list[int], grace: float = 10.0, group: bool = False) -> bool:
    """SIGTERM each (its process group with `group`), wait up to `grace` seconds for all, then
    SIGKILL what is left. True if every one ended within the grace."""
    started = {pid: start_time(pid) for pid in pids}
    live = [pid for pid, st in started.items() if st is not None]
    for pid in live:
        _signal(pid, signal.SIGTERM, group)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        for pid in live:
            _reap(pid)
        live = [pid for pid in live if alive(pid, started[pid])]
        if not live:
            return True
        time.sleep(0.05)
    for pid in live:
        _signal(pid, signal.SIGKILL, group)
        _reap(pid)
    return False


def start(name: str, argv: list[str], run_dir: Path, log_dir: Path, env: dict[str, str] | None = None,
          user: str | None = None) -> int:
    """Start argv as daemon `name` unless it already runs; returns its PID."""
    pidfile = run_dir / f"{name}.pid"
    pid = read_pidfile(pidfile)
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
    write_pidfile(pidfile, proc.pid)
    return proc.pid


def running(run_dir: Path) -> dict[str, int]:
    """name -> PID of every recorded daemon that is alive."""
    found = {}
    for pidfile in sorted(run_dir.glob("*.pid")) if run_dir.is_dir() else []:
        pid = read_pidfile(pidfile)
        if pid is not None:
            found[pidfile.stem] = pid
    return found


def stop(name: str, run_dir: Path, timeout: float = 10.0) -> None:
    pidfile = run_dir / f"{name}.pid"
    pid = read_pidfile(pidfile)
    if pid is not None:
        stop_pids([pid], timeout, group=True)
    pidfile.unlink(missing_ok=True)


def stop_all(run_dir: Path, timeout: float = 10.0) -> list[str]:
    """Stop every recorded daemon's process group at once; SIGKILL what outlives the timeout."""
    found = running(run_dir)
    stop_pids(list(found.values()), timeout, group=True)
    for pidfile in run_dir.glob("*.pid") if run_dir.is_dir() else []:
        pidfile.unlink(missing_ok=True)
    return sorted(found)
