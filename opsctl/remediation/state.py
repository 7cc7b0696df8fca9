"""On-disk state of acting runs: the lock, the drain budget, handled XIDs and healthy-since times.

Everything lives in one directory (/var/lib/opsctl, or $OPSCTL_STATE_DIR, or config `state_dir`).
Files are replaced atomically, so a crash never leaves half a file; only the lock holder writes.
"""

import errno
import fcntl
import json
import os
from pathlib import Path
from typing import Any

from opsctl.errors import ConfigError, SafetyStop
from opsctl.health.evaluate import HandledXid

HOUR = 3600.0
# Records of handled XIDs are kept this long; the last-XID gauge (xid_source: gauge) needs them for
# as long as the gauge may still show the old code, which is until the GPU's next XID or driver reload.
HANDLED_KEEP_S = 90 * 86400.0


class StateDir:
    def __init__(self, path: Path):
        self.path = Path(path)

    def _ensure(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"state directory {self.path}: {err.strerror} (set state_dir or OPSCTL_STATE_DIR)") \
                from None

    def _load(self, name: str, default: Any) -> Any:
        try:
            return json.loads((self.path / name).read_text())
        except FileNotFoundError:
            return default
        except (OSError, ValueError) as err:
            raise ConfigError(f"state file {self.path / name} is unreadable ({err}); move it away to reset") \
                from None

    def _save(self, name: str, data: object) -> None:
        self._ensure()
        tmp = self.path / f".{name}.{os.getpid()}"
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, self.path / name)

    # ---- budget: times of past drains ------------------------------------------------------
    def drains_last_hour(self, now: float) -> list[float]:
        return [t for t in self._load("budget.json", {}).get("drains", []) if now - t < HOUR]

    def record_drains(self, count: int, now: float) -> None:
        self._save("budget.json", {"drains": self.drains_last_hour(now) + [now] * count})

    # ---- handled XIDs ----------------------------------------------------------------------
    def handled_xids(self) -> list[HandledXid]:
        return [HandledXid(**rec) for rec in self._load("handled_xids.json", [])]

    def record_xids(self, records: list[HandledXid], now: float) -> None:
        keep = [r for r in self.handled_xids() if now - r.time < HANDLED_KEEP_S]
        self._save("handled_xids.json", [r.__dict__ for r in keep + records])

    # ---- healthy-since, for resume ---------------------------------------------------------
    def healthy_since(self) -> dict[str, float]:
        return dict(self._load("healthy_since.json", {}))

    def save_healthy_since(self, data: dict[str, float]) -> None:
        self._save("healthy_since.json", data)


class RunLock:
    """A non-blocking flock on <state dir>/lock: a second acting run gets SafetyStop, never waits."""

    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / "lock"
        self.fd: int | None = None

    def __enter__(self) -> "RunLock":
        StateDir(self.path.parent)._ensure()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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
