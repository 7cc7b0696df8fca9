"""The state directory's safety: who may own it, and the run lock that one acting opsctl at a time holds.

The directory (/var/lib/opsctl, or $OPSCTL_STATE_DIR, or config `state_dir`) is created 0700. A directory
that others could write to, or that another user owns, is refused (exit 2): whoever can write there could
make opsctl forget a drain or skip one.
"""

import errno
import fcntl
import os
import stat
import time
from pathlib import Path

from opsctl.errors import ConfigError, SafetyStop, StateUnwritable


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


class RunLock:
    """A non-blocking flock on <state dir>/lock: a second acting run gets SafetyStop, never waits. `name`
    another lock of the directory, and `wait` seconds to wait for it (a requeue waits for another requeue:
    each holds its lock for one job)."""

    def __init__(self, state_dir: Path, name: str = "lock", wait: float = 0.0):
        self.path = Path(state_dir) / name
        self.wait = wait
        self.fd: int | None = None

    def __enter__(self) -> "RunLock":
        secure_dir(self.path.parent, create=True)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as err:  # a symlink planted in its place is the config's problem; a full disk is not
            error = ConfigError if err.errno == errno.ELOOP else StateUnwritable
            raise error(f"lock {self.path}: {err.strerror}") from None
        deadline = time.monotonic() + self.wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as err:
                if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN) and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
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
