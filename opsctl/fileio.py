"""Files that root writes and reads in directories a user might write to, safely.

`write_atomic(path, data, mode)` replaces `path` as a whole: readers see the old file or the new one,
never half of one, and after it returns the new file survives a crash. The data goes to a temporary file
beside `path` (the same directory, so the rename is atomic) with a random name, created O_EXCL|O_NOFOLLOW
mode 0600: a name planted in advance (a symlink, a FIFO, a file) is refused, never followed, written
through or opened. Then fchmod to `mode`, fsync, os.replace onto `path`, and fsync of the directory so
that the rename itself is durable. On any failure the temporary file is removed and OSError propagates;
callers turn it into their own one-line error.

`read_secret(path, key)` reads a password or token kept in a file of its own (a config key names the file, never
the secret): its text, stripped, or a SourceUnavailable naming the key and never the secret.

`read_nofollow(path)` reads a file's text without following a symlink at `path`: None when it does not
exist, OSError for a symlink (ELOOP) or anything else that is not a regular file (a FIFO never blocks it).
"""

import errno
import os
import secrets
import stat
from pathlib import Path

from opsctl.errors import SourceUnavailable

# A random temporary name collides only with one planted by someone guessing 64 random bits; a collision
# (EEXIST) takes a new name, a few times.
TEMP_ATTEMPTS = 5


def _temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")


def _create_temp(path: Path) -> tuple[int, Path]:
    for _ in range(TEMP_ATTEMPTS):
        tmp = _temp_name(path)
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), tmp
        except FileExistsError:
            continue
    raise OSError(errno.EEXIST, f"{TEMP_ATTEMPTS} temporary names beside it were taken", str(path))


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` (str is written as UTF-8) atomically and durably; OSError on failure."""
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp = _create_temp(path)
    try:
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable: a directory's entries reach the disk with an fsync of the directory."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_nofollow(path: Path | str) -> str | None:
    """The file's text, None when it does not exist. A symlink at `path` raises OSError (ELOOP); anything
    but a regular file (a FIFO would block the read forever, a device is no state) raises OSError too."""
    try:
        # O_NONBLOCK: opening a FIFO for reading would wait for a writer; a regular file ignores the flag.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "r") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return handle.read()


def read_secret(path: str | None, key: str) -> str:
    """The secret in the file that config key `key` names; SourceUnavailable when it is not set or unreadable."""
    if path is None:
        raise SourceUnavailable(f"cannot read {key} (not set)")
    try:
        return Path(path).read_text().strip()
    except OSError as err:
        raise SourceUnavailable(f"cannot read {key} ({err.strerror})") from None
