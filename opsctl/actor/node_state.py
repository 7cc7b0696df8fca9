"""State that a node keeps for itself in its state directory: where `opsctl node check` stopped reading
each kernel log (opsctl/nodecheck/kernel_log.py says what is kept and why).

It is written as the head's state is (never through a symlink, replaced atomically), under a lock of its own:
two node checks at once (the timer's and one by hand) would each count the same new records. A state that
cannot be read or written is `PositionsUnreadable`, which the node check turns into a check that could not
run, never a failure.
"""

import errno
import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from opsctl.actor.lock import secure_dir
from opsctl.fileio import read_nofollow, write_atomic

STATE_FILE = "kernel_log.json"
LOCK_FILE = "kernel_log.lock"
STATE_VERSION = 1


class PositionsUnreadable(Exception):
    pass


def os_reason(err: OSError) -> str:
    return "a symlink, refused" if err.errno == errno.ELOOP else (err.strerror or str(err))


class KernelLogPositions:
    """Each kernel log's state (KernelLogState.to_json) by its path: in the simulated lab, the nodes of one
    host read a file each and share one state directory."""

    def __init__(self, state_dir: Path):
        self.directory = Path(state_dir)
        self.path = self.directory / STATE_FILE

    @contextmanager
    def locked(self) -> Iterator[None]:
        secure_dir(self.directory, create=True)
        path = self.directory / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as err:
            raise PositionsUnreadable(f"lock {path}: {os_reason(err)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def load(self) -> dict[str, Any]:
        try:
            text = read_nofollow(self.path)  # a symlink planted there is refused, never followed
            data = {"version": STATE_VERSION, "logs": {}} if text is None else json.loads(text)
        except OSError as err:
            raise PositionsUnreadable(f"state file {self.path}: {os_reason(err)}; move it away to reset") from None
        except ValueError as err:
            raise PositionsUnreadable(f"state file {self.path} is unreadable ({err}); move it away to reset") from None
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION or not isinstance(data.get("logs"),
                                                                                                 dict):
            raise PositionsUnreadable(f"state file {self.path} is unreadable (not a version {STATE_VERSION} kernel "
                                      "log state); move it away to reset")
        logs: dict[str, Any] = data["logs"]
        return logs

    def save(self, logs: dict[str, Any]) -> None:
        try:
            write_atomic(self.path, json.dumps({"version": STATE_VERSION, "logs": logs}, indent=1), mode=0o600)
        except OSError as err:
            raise PositionsUnreadable(f"state file {self.path}: {os_reason(err)}") from None
