"""A mount that stops answering, as a hard NFS mount whose server went away does: the lab's `nfs-hung`.

The lab kernel has no NFS client, so the hang is a FUSE mount (type `fuse.opsctl-hung`) whose server
never answers: the kernel queues the FUSE handshake and every request after it, so a stat of the mount
point, an open below it, anything that needs the filesystem waits, as on a hung NFS mount (killably: a
SIGKILL ends the waiter, as with NFS's `hard` mounts since Linux 2.6.25). No name in a directory is
involved, so a probe that only ever creates new random names hangs on it as it would on real NFS.

The FUSE connection lives as long as its /dev/fuse descriptor is open: a small holder process keeps it
(its PID file beside the node's storage files) and exits when the process that started it does, so a
lab that stops leaves no live hang. In a lab machine `opsctl-hw` mounts the hang and exits at once: its
wrapper sets OPSCTL_HUNG_MOUNT_STAYS=1, and the holder then stays until `release` or until the machine
stops (which ends every process in it), as the fault does. `release` ends the holder, which aborts the
connection (every waiter gets ENOTCONN at once), and detaches the mount. Both are idempotent, and read
/proc/self/mountinfo rather than the mount point, which would hang them.

Needs root and /dev/fuse: the simulated lab's host has both; a systemd-nspawn machine has /dev/fuse only
when it is bound in (the lab's GPU machines get `--bind=/dev/fuse`, opsctl_lab.machines.nspawn), and
`hang` raises OSError without it.
"""

import ctypes
import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from opsctl_lab import processes

FSTYPE = "fuse.opsctl-hung"
MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2
HOLDER_MARK = "opsctl-hung-holder"
STAYS_ENV = "OPSCTL_HUNG_MOUNT_STAYS"  # "1": the holder outlives the process that mounts the hang
# Keeps the inherited /dev/fuse descriptor open, never reads it, and exits when its parent does (parent
# 0: never; only `release` or the end of the machine ends it).
_HOLDER = f"""
import os, sys, time  # {HOLDER_MARK}
parent = int(sys.argv[1])
while parent == 0 or os.getppid() == parent:
    time.sleep(1)
"""


def holder_parent() -> int:
    """The PID whose exit ends the holder: this process, or 0 (none) where OPSCTL_HUNG_MOUNT_STAYS=1."""
    return 0 if os.environ.get(STAYS_ENV) == "1" else os.getpid()


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)  # the C library Python runs with: mount(2), umount2(2)


def _unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline and backslash in a path as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mounted(point: Path) -> bool:
    """Whether a hang is mounted at `point` (in this process's mount namespace)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" - ", 1)
        if len(fields) == 2 and fields[1].split()[0] == FSTYPE and _unescape(fields[0].split()[4]) == str(point):
            return True
    return False


def _holder(pidfile: Path) -> int | None:
    """The live holder's PID, from its PID file ("<pid> <start time>"), None when there is none."""
    pid = processes.read_pidfile(pidfile)  # None unless that very process still runs
    return pid if pid is not None and HOLDER_MARK in processes.cmdline(pid) else None


def hang(point: Path, pidfile: Path) -> None:
    """Make `point` (an existing directory) hang; nothing to do when it already does."""
    if mounted(point) and _holder(pidfile) is not None:
        return
    release(point, pidfile)  # a mount whose holder is gone answers ENOTCONN: mount it again
    try:
        fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    except OSError as err:
        raise OSError(err.errno, f"a hung mount needs FUSE: /dev/fuse: {err.strerror}", str(point)) from None
    try:
        options = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
        if _libc().mount(b"opsctl-hung", str(point).encode(), FSTYPE.encode(), MS_NOSUID | MS_NODEV, options) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"cannot mount the hang: {os.strerror(code)}", str(point))
        holder = subprocess.Popen([sys.executable, "-I", "-c", _HOLDER, str(holder_parent())], pass_fds=(fd,),
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        processes.write_pidfile(pidfile, holder.pid)
    except BaseException:
        _detach(point)
        raise
    finally:
        os.close(fd)  # the holder's copy keeps the connection (and with it the hang) alive


def release(point: Path, pidfile: Path) -> None:
    """End the hang at `point`: stop its holder (waiters get ENOTCONN), detach the mount."""
    pid = _holder(pidfile)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while processes.alive(pid) and time.monotonic() < deadline:
            try:
                os.waitpid(pid, os.WNOHANG)  # our child when this process started it
            except ChildProcessError:
                pass
            time.sleep(0.05)
    pidfile.unlink(missing_ok=True)
    if mounted(point):
        _detach(point)


def _detach(point: Path) -> None:
    if _libc().umount2(str(point).encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):  # not (or no longer) a mount point
            raise OSError(err, f"cannot detach the hang: {os.strerror(err)}", str(point))
