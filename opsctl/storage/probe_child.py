"""The probe of one mount, as the child process of opsctl.storage.probe runs it (`python -I probe_child.py
<mount point> <probe directory or ""> <host>`; it imports nothing but the standard library, so it starts
fast). Exit 0: the mount answered; exit 1 with one line on stderr (`OSError: [Errno 30] Read-only file
system: ...`) otherwise.

The probe directory is often writable by every user (mode 1777, as `root_squash` needs), so the probe
acts on nothing that a user could have put there:

- The directory is opened O_DIRECTORY|O_NOFOLLOW, and everything below goes through that descriptor.
- The probe file is new, with a random name (`.opsctl-probe-<host>-<16 hex digits>`), created
  O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW|O_NONBLOCK, mode 0600: whatever already has that name (a FIFO, a
  directory, a symlink, a file) makes the create fail with EEXIST, and the probe takes another random name
  (a few times). Nothing is ever opened, followed or written through by a name that existed before.
- fstat of the descriptor must show a regular file of ours with one link: owned by our effective uid, or
  by `nobody` (65534) when root writes through an NFS export's root_squash.
- The token goes through that descriptor and is fsynced; the file is opened again for reading, O_NOFOLLOW,
  and must be the same file (device and inode) before its content counts; then it is unlinked.

A predictable name could be planted in advance (a FIFO hangs an open, a directory or a file fails it, a
symlink redirects it); a random one cannot.
"""

import os
import secrets
import stat
import sys

NAME_ATTEMPTS = 5  # random names tried before giving up: a collision needs a planted 64-bit guess
SQUASHED_UID = 65534  # `nobody`: the owner of what root creates through NFS with root_squash (the default anonuid)
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class ProbeError(Exception):
    pass


def random_suffix() -> str:
    return secrets.token_hex(8)


def probe_name(host: str) -> str:
    return f".opsctl-probe-{host}-{random_suffix()}"


def probe(point: str, probe_dir: str | None, host: str) -> None:
    """Stat the mount point; with a probe directory, write a new probe file there, read it back and remove
    it. Raises OSError or ProbeError."""
    os.stat(point)
    if not probe_dir:
        return
    dir_fd = os.open(probe_dir, DIR_FLAGS)
    try:
        _write_and_read_back(dir_fd, host, secrets.token_hex(16).encode())
    finally:
        os.close(dir_fd)


def _create(dir_fd: int, host: str) -> tuple[str, int]:
    for _ in range(NAME_ATTEMPTS):
        name = probe_name(host)
        try:
            return name, os.open(name, CREATE_FLAGS, 0o600, dir_fd=dir_fd)
        except FileExistsError:
            continue  # someone's file has that name: never touch it, take another
    raise ProbeError(f"{NAME_ATTEMPTS} random probe file names were all taken")


def _check_ours(fd: int) -> os.stat_result:
    info = os.fstat(fd)
    owners = {os.geteuid(), SQUASHED_UID} if os.geteuid() == 0 else {os.geteuid()}
    if not stat.S_ISREG(info.st_mode) or info.st_uid not in owners or info.st_nlink != 1:
        raise ProbeError(f"the new probe file is not a regular file of ours (mode {info.st_mode:o}, "
                         f"owner {info.st_uid}, {info.st_nlink} links)")
    return info


def _write_and_read_back(dir_fd: int, host: str, token: bytes) -> None:
    name, fd = _create(dir_fd, host)
    try:
        try:
            written = _check_ours(fd)
            if os.write(fd, token) != len(token):
                raise ProbeError("the probe file took only part of what was written")
            os.fsync(fd)
        finally:
            os.close(fd)
        back = os.open(name, READ_FLAGS, dir_fd=dir_fd)
        try:
            again = os.fstat(back)
            if (again.st_dev, again.st_ino) != (written.st_dev, written.st_ino):
                raise ProbeError("the probe file was replaced before it was read back")
            read = os.read(back, len(token) + 1)
        finally:
            os.close(back)
    finally:
        os.unlink(name, dir_fd=dir_fd)
    if read != token:
        raise ProbeError("the probe file read back differs from what was written")


def main(argv: list[str]) -> int:
    point, probe_dir, host = argv
    try:
        probe(point, probe_dir or None, host)
    except (OSError, ProbeError) as err:
        sys.stderr.write(f"{type(err).__name__}: {err}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
