"""The lab's stand-in for what the kernel logs of an exec with an empty argv. Since Linux 5.18, fs/exec.c
(do_execveat_common) warns once a boot when a process execs a file with no argument at all, not even argv[0]:

    pr_warn_once("process '%s' launched '%s' with NULL argv: empty string added\\n",
                 current->comm, bprm->filename);

which /dev/kmsg gives as (a real record, tests/fixtures/kmsg/kmsg_quoted_driver_text.txt):

    4,1289,10567963506,-;process 'perl' launched '/tmp/k43/NVRM: Xid (PCI:0000:8a:00): 142, pid=1, name=x, y' \
with NULL argv: empty string added

The file's path is the user's to choose, so a user can make the kernel itself write the NVIDIA driver's
words. A lab node shares the host's kernel: that kernel prints the warning once a boot for the host and every
node together, and into the host's log, never into the node's. So the lab runs a user's command on a node
under ptrace, as strace does, and for every exec that the command's processes make with an empty argv and
that succeeds, writes the record the kernel writes, in its words, at its priority (facility 0, KERN_WARNING)
and with its `comm` (read at the exec, before the new program renames the process) and `filename` (the path
as given; `/dev/fd/N/PATH` for execveat relative to a descriptor), into the node's own kernel log: the
first one of each emulated boot only, as pr_warn_once does.

    python -m opsctl_lab.kernel_exec --state HARDWARE_JSON --user USER -- COMMAND [ARG...]

runs COMMAND as USER (its uid, gid and no other groups) and exits with its status; HARDWARE_JSON is the
node's hardware state, whose kernel log (`kmsg` next to it) gets the record. Linux x86-64 and arm64.
"""

import argparse
import ctypes
import fcntl
import os
import pwd
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from opsctl_lab.errors import LabError
from opsctl_lab.hardware import NodeHardware, kernel_log_path, write_kernel_log

KERN_WARNING = 4
# fs/exec.c's words; `comm` and `filename` are current->comm and bprm->filename.
NULL_ARGV = "process '{comm}' launched '{filename}' with NULL argv: empty string added"
NULL_ARGV_WORDS = "' with NULL argv: empty string added"

_PTRACE_TRACEME, _PTRACE_SYSCALL, _PTRACE_SETOPTIONS = 0, 24, 0x4200
_PTRACE_GETEVENTMSG, _PTRACE_GET_SYSCALL_INFO = 0x4201, 0x420E
# TRACESYSGOOD | TRACEFORK | TRACEVFORK | TRACECLONE | TRACEEXEC | EXITKILL: every process the command
# starts is traced, and none outlives the tracer.
_OPTIONS = 0x1 | 0x2 | 0x4 | 0x8 | 0x10 | 0x100000
_EVENT_EXEC = 4
_SYSCALL_INFO_ENTRY, _SYSCALL_INFO_EXIT = 1, 2
_WALL = 0x40000000  # waitpid's __WALL: threads too
# (execve, execveat) by the audit architecture that PTRACE_GET_SYSCALL_INFO names.
_EXEC_CALLS = {0xC000003E: (59, 322), 0xC00000B7: (221, 281)}  # x86-64, arm64
_AT_FDCWD = -100
_PATH_MAX = 4096

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = (ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p)
_libc.ptrace.restype = ctypes.c_long


class _SyscallInfo(ctypes.Structure):
    """struct ptrace_syscall_info (linux/ptrace.h). At an entry stop `value` is the call's number and `args`
    its arguments; at an exit stop `value` is the return value and args[0] is_error."""

    _fields_ = (("op", ctypes.c_uint8), ("pad", ctypes.c_uint8 * 3), ("arch", ctypes.c_uint32),
                ("instruction_pointer", ctypes.c_uint64), ("stack_pointer", ctypes.c_uint64),
                ("value", ctypes.c_uint64), ("args", ctypes.c_uint64 * 6), ("ret_data", ctypes.c_uint32),
                ("reserved", ctypes.c_uint32))


@dataclass(frozen=True)
class Launch:
    """An exec with an empty argv that succeeded: the words the kernel logs of it."""

    comm: str
    filename: str

    @property
    def message(self) -> str:
        return NULL_ARGV.format(comm=self.comm, filename=self.filename)


def _ptrace(request: int, pid: int, addr: int = 0, data: int = 0) -> int:
    """ptrace(2); OSError (ProcessLookupError for ESRCH) when it fails."""
    result = int(_libc.ptrace(request, pid, addr, data))
    if result == -1:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
    return result


def run_traced(argv: list[str], user: str) -> tuple[int, list[Launch]]:
    """Run `argv` as `user`, every process it starts traced; its exit status and the launches seen."""
    try:
        account = pwd.getpwnam(user)
    except KeyError:
        raise LabError(f"no user {user!r}") from None
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": account.pw_dir, "USER": user, "LOGNAME": user,
           "LANG": "C.UTF-8"}
    pid = os.fork()
    if pid == 0:  # the child: traced from its first exec on, as the user
        try:
            _ptrace(_PTRACE_TRACEME, 0)
            os.kill(os.getpid(), signal.SIGSTOP)
            os.setgroups([])
            os.setgid(account.pw_gid)
            os.setuid(account.pw_uid)
            os.execvpe(argv[0], argv, env)
        finally:
            os._exit(127)
    os.waitpid(pid, 0)  # its SIGSTOP
    _ptrace(_PTRACE_SETOPTIONS, pid, 0, _OPTIONS)
    _ptrace(_PTRACE_SYSCALL, pid)
    return _trace(pid)


def _trace(first: int) -> tuple[int, list[Launch]]:
    pending: dict[int, Launch] = {}  # process -> the launch its exec under way would log
    launches: list[Launch] = []
    status_of_first = 127
    while True:
        try:
            pid, status = os.waitpid(-1, _WALL)
        except ChildProcessError:  # every traced process has ended
            return status_of_first, launches
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            pending.pop(pid, None)
            if pid == first:  # a shell's status: 128 + the signal that ended it
                status_of_first = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
            continue
        stop, event, deliver = os.WSTOPSIG(status), status >> 16, 0
        if stop == signal.SIGTRAP | 0x80:
            _at_syscall(pid, pending, launches)
        elif stop == signal.SIGTRAP and event == _EVENT_EXEC:
            former = _event_message(pid)  # a thread that exec'd takes the thread group leader's id
            if former != pid and former in pending:
                pending[pid] = pending.pop(former)
        elif not (stop == signal.SIGTRAP and event) and stop != signal.SIGSTOP:
            deliver = stop  # the process's own signal; a new process's first SIGSTOP is the tracer's
        try:
            _ptrace(_PTRACE_SYSCALL, pid, 0, deliver)
        except ProcessLookupError:  # killed meanwhile
            pending.pop(pid, None)


def _at_syscall(pid: int, pending: dict[int, Launch], launches: list[Launch]) -> None:
    info = _SyscallInfo()
    _ptrace(_PTRACE_GET_SYSCALL_INFO, pid, ctypes.sizeof(info), ctypes.addressof(info))
    if info.op == _SYSCALL_INFO_ENTRY:
        calls = _EXEC_CALLS.get(info.arch)
        if calls and info.value in calls and (launch := _empty_argv_launch(pid, info, info.value == calls[1])):
            pending[pid] = launch
    elif info.op == _SYSCALL_INFO_EXIT and pid in pending:
        launch = pending.pop(pid)
        if not info.args[0]:  # is_error: an exec that failed loaded nothing
            launches.append(launch)


def _empty_argv_launch(pid: int, info: _SyscallInfo, execveat: bool) -> Launch | None:
    """At an exec's entry: the launch it logs when its argv holds no string (argv NULL, or argv[0] NULL)."""
    path_at, argv_at = (info.args[1], info.args[2]) if execveat else (info.args[0], info.args[1])
    try:
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as memory:
            if argv_at and int.from_bytes(os.pread(memory.fileno(), 8, argv_at), sys.byteorder):
                return None
            path = _string(memory.fileno(), path_at)
        comm = Path(f"/proc/{pid}/comm").read_bytes().rstrip(b"\n")
    except OSError:  # an address the process cannot read either: the exec fails with EFAULT
        return None
    if execveat:
        path = _fd_path(ctypes.c_int32(info.args[0] & 0xFFFFFFFF).value, path)
    return Launch(comm.decode(errors="replace"), path.decode(errors="replace"))


def _fd_path(dirfd: int, path: bytes) -> bytes:
    """bprm->filename of an execveat (alloc_bprm): the path, or the descriptor's /dev/fd name before it."""
    if dirfd == _AT_FDCWD or path.startswith(b"/"):
        return path
    return f"/dev/fd/{dirfd}".encode() + (b"/" + path if path else b"")


def _string(fd: int, address: int) -> bytes:
    """A NUL-terminated string of the process's memory, read a page at most at a time."""
    out = b""
    while len(out) < _PATH_MAX:
        chunk = os.pread(fd, 4096 - (address + len(out)) % 4096, address + len(out))
        if not chunk:
            break
        if b"\0" in chunk:
            return out + chunk[:chunk.index(b"\0")]
        out += chunk
    return out


def _event_message(pid: int) -> int:
    message = ctypes.c_ulong()
    _ptrace(_PTRACE_GETEVENTMSG, pid, 0, ctypes.addressof(message))
    return int(message.value)


def log_launches(hw: NodeHardware, launches: list[Launch], now: float) -> bool:
    """Write the first launch's record unless this boot's log has one already (pr_warn_once); whether one was."""
    if not launches or any(r["message"].endswith(NULL_ARGV_WORDS) and r["prio"] == KERN_WARNING
                           for r in hw.kernel_log):
        return False
    hw.log_kernel(KERN_WARNING, launches[0].message, now)
    return True


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m opsctl_lab.kernel_exec")
    parser.add_argument("--state", required=True, type=Path, help="the node's hardware state (hardware.json)")
    parser.add_argument("--user", required=True)
    parser.add_argument("command", nargs="+")
    args = parser.parse_args(argv)
    code, launches = run_traced(args.command, args.user)
    with open(args.state.with_name(args.state.name + ".lock"), "w") as lock:  # opsctl-hw's lock
        fcntl.flock(lock, fcntl.LOCK_EX)
        hw = NodeHardware.load(args.state, args.state.parent.name)
        if log_launches(hw, launches, time.time()):
            hw.save(args.state)
            write_kernel_log(kernel_log_path(args.state), hw)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
