"""On-disk state of acting runs: the lock, the budgets, handled events and healthy-since times; and the
verdicts of the last run of each kind, which `opsctl health --changes-only` compares against.

Everything lives in one directory (/var/lib/opsctl, or $OPSCTL_STATE_DIR, or config `state_dir`),
created 0700. A directory that others could write to, or that another user owns, is refused (exit 2):
whoever can write there could make opsctl forget a drain or skip one. Files are opened with
O_NOFOLLOW (a symlink planted in their place is refused, never followed) and replaced atomically, so
a crash never leaves half a file. Only the lock holder writes, except the --changes-only record,
which read-only runs write too: two runs at once may lose one record, and the next run of that kind
then logs its non-ok nodes once more.
"""

import errno
import fcntl
import json
import os
import stat
from pathlib import Path
from typing import Any

from opsctl.errors import ConfigError, SafetyStop, StateUnwritable
from opsctl.fileio import read_nofollow, write_atomic
from opsctl.remediation.memory import HandledMemory

HOUR = 3600.0
DAY = 86400.0
LAST_RUNS = "last_runs.json"


def secure_dir(path: Path, create: bool) -> bool:
    """Check (and with create, make) the state directory. False when it does not exist and create is off."""
    try:
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as err:  # a read-only or full filesystem, a permission error: not the config's fault
        raise StateUnwritable(f"state directory {path}: {err.strerror}") from None
    where = f"state directory {path}"
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"{where}: not a directory (a symlink is refused); set state_dir or OPSCTL_STATE_DIR")
    if info.st_uid != os.geteuid():
        raise ConfigError(f"{where}: owned by uid {info.st_uid}, not by this user (uid {os.geteuid()}); run "
                          "opsctl as the user that owns it (root on a provisioned cluster)")
    if info.st_mode & 0o022:
        raise ConfigError(f"{where}: writable by group or others (mode {stat.S_IMODE(info.st_mode):04o}); "
                          f"chmod go-w {path}")
    return True


# The hourly budgets: drains and resumes (`opsctl health`), resets and reboots (`opsctl remediate`).
BUDGET_KINDS = ("drains", "resumes", "resets", "reboots")


class StateDir:
    def __init__(self, path: Path):
        self.path = Path(path)

    def _ensure(self) -> None:
        secure_dir(self.path, create=True)

    def _load(self, name: str, default: Any) -> Any:
        if not secure_dir(self.path, create=False):
            return default
        try:
            text = read_nofollow(self.path / name)
            return default if text is None else json.loads(text)
        except (OSError, ValueError) as err:
            raise ConfigError(f"state file {self.path / name} is unreadable ({err}); move it away to reset") \
                from None

    def _save(self, name: str, data: object) -> None:
        self._ensure()
        try:
            write_atomic(self.path / name, json.dumps(data, indent=1, sort_keys=True), mode=0o600)
        except OSError as err:  # a full disk or a permission error: the safety record may be missing (exit 3)
            raise StateUnwritable(f"state file {self.path / name}: {err.strerror}") from None

    # ---- budgets: times of past drains and resumes -------------------------------------------
    def recent(self, kind: str, now: float) -> list[float]:
        """Times of the `kind` (one of BUDGET_KINDS) within the last hour."""
        return [t for t in self._load("budget.json", {}).get(kind, []) if now - t < HOUR]

    def record(self, kind: str, count: int, now: float) -> None:
        if count:
            data = {k: self.recent(k, now) for k in BUDGET_KINDS}
            data[kind] = data[kind] + [now] * count
            self._save("budget.json", data)

    # ---- holds: nodes a person took off the remediation ladder (`opsctl hold`) ------------------
    def holds(self) -> dict[str, dict[str, Any]]:
        """node -> {"since", "user", "why"}."""
        holds = self._load("holds.json", {})
        if not isinstance(holds, dict):
            raise ConfigError(f"state file {self.path / 'holds.json'} is unreadable (not an object); move it away "
                              "to reset")
        return holds

    def save_holds(self, holds: dict[str, dict[str, Any]]) -> None:
        self._save("holds.json", holds)

    # ---- handled events ----------------------------------------------------------------------
    def handled(self) -> HandledMemory:
        try:
            return HandledMemory.from_json(self._load("handled.json", []))
        except TypeError as err:
            raise ConfigError(f"state file {self.path / 'handled.json'} is unreadable ({err}); move it away to "
                              "reset") from None

    def save_handled(self, memory: HandledMemory) -> None:
        self._save("handled.json", memory.to_json())

    # ---- healthy-since, for resume -------------------------------------------------------------
    def healthy_since(self) -> dict[str, float]:
        return dict(self._load("healthy_since.json", {}))

    def save_healthy_since(self, data: dict[str, float]) -> None:
        self._save("healthy_since.json", data)

    # ---- resumes: when opsctl last put each node back in service ------------------------------------
    def resumed(self) -> dict[str, float]:
        """node -> the time of opsctl's last resume of it (kept for a day)."""
        data = self._load("resumed.json", {})
        return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def record_resumes(self, nodes: list[str], now: float) -> None:
        data = {n: t for n, t in self.resumed().items() if now - t < DAY}
        self._save("resumed.json", data | dict.fromkeys(nodes, now))

    # ---- validations: when `opsctl validate` last validated each node ----------------------------
    def validated(self) -> dict[str, float]:
        """node -> the time its last validation job ended (whatever its result)."""
        data = self._load("validated.json", {})
        return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def save_validated(self, data: dict[str, float]) -> None:
        self._save("validated.json", data)

    def validate_queue(self) -> dict[str, dict[str, Any]]:
        """node -> {"since": when it was queued, "why": in words}: the nodes that the next `opsctl validate
        --idle` takes first, however recently they were validated (`opsctl suspects --queue`)."""
        data = self._load("validate-queue.json", {})
        return {str(k): v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}

    def save_validate_queue(self, data: dict[str, dict[str, Any]]) -> None:
        self._save("validate-queue.json", data)

    # ---- the verdicts of the last complete run of each kind, for `health --changes-only` --------
    def last_run(self, kind: str) -> dict[str, Any] | None:
        """The record saved by save_last_run for this kind of run; None before the first."""
        record = self._last_runs().get(kind)
        if record is None:
            return None
        nodes = record.get("nodes") if isinstance(record, dict) else None
        if not isinstance(record, dict) or not isinstance(nodes, dict) or not all(
                isinstance(v, dict) and isinstance(v.get("status"), str) for v in nodes.values()):
            raise ConfigError(f"state file {self.path / LAST_RUNS} is unreadable (no nodes with a status for "
                              f"{kind!r}); move it away to reset")
        return record

    def save_last_run(self, kind: str, record: dict[str, Any]) -> None:
        """Replace the record of one kind, keeping the others (a read-only run never hides the timer's)."""
        self._save(LAST_RUNS, {**self._last_runs(), kind: record})

    def _last_runs(self) -> dict[str, Any]:
        runs = self._load(LAST_RUNS, {})
        if not isinstance(runs, dict):
            raise ConfigError(f"state file {self.path / LAST_RUNS} is unreadable (not an object); move it away to "
                              "reset")
        return runs


class RunLock:
    """A non-blocking flock on <state dir>/lock: a second acting run gets SafetyStop, never waits."""

    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / "lock"
        self.fd: int | None = None

    def __enter__(self) -> "RunLock":
        secure_dir(self.path.parent, create=True)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as err:  # a symlink planted in its place is the config's problem; a full disk is not
            error = ConfigError if err.errno == errno.ELOOP else StateUnwritable
            raise error(f"lock {self.path}: {err.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise SafetyStop(f"another acting opsctl holds {self.path}; not acting") from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
