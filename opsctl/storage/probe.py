"""Does a mount answer? A stat of a hung NFS or Lustre mount blocks in the kernel, uninterruptibly, so it
runs in a child process that the check waits for with a timeout and then abandons: the check itself
never hangs. The children of all mounts run at once, so the check takes one timeout at most.

Where a probe directory is configured, the child also writes a new probe file there, reads it back and
removes it: a mount that answers stat but refuses writes (read-only, quota, a server gone read-only) is
found too. The child is opsctl.storage.probe_child: the file has a random name, created O_EXCL|O_NOFOLLOW,
so nothing a user plants in a shared probe directory can block, fail or redirect it; the host name in
the name keeps what nodes that share the directory leave there apart.
"""

import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# Runs with -I (isolated: no site packages, no environment), so it starts fast and imports nothing of ours.
CHILD = str(Path(__file__).with_name("probe_child.py"))


@dataclass(frozen=True)
class ProbeResult:
    point: str
    status: str  # "ok", "hung" (no answer within the timeout) or "error" (the stat or the probe failed)
    detail: str = ""


def probe_mounts(points: dict[str, str | None], timeout: float) -> dict[str, ProbeResult]:
    """Mount point -> result, for {mount point: probe directory or None}."""
    started = time.monotonic()
    children = {}
    for point, probe_dir in points.items():
        argv = [sys.executable, "-I", CHILD, point, probe_dir or "", socket.gethostname()]
        children[point] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    results = {}
    for point, child in children.items():
        try:
            if child.poll() is None:
                child.wait(timeout=max(0.0, started + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            # A child stuck in the kernel may not die at once; it is not waited for (it is reaped at exit).
            child.kill()
            results[point] = ProbeResult(point, "hung", f"no answer within {timeout:g}s")
            continue
        _, err = child.communicate()  # it has exited: its few lines of stderr are there to read
        if child.returncode == 0:
            results[point] = ProbeResult(point, "ok")
        else:
            results[point] = ProbeResult(point, "error", _last_line(err))
    return results


def _last_line(stderr: str) -> str:
    """The exception line of the child's traceback: `PermissionError: [Errno 13] Permission denied: ...`."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1] if lines else "failed"
