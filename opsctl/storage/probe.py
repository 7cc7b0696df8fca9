"""Does a mount answer? A stat of a hung NFS or Lustre mount blocks in the kernel, uninterruptibly, so it
runs in a child process that the check waits for with a timeout and then abandons: the check itself
never hangs. The children of all mounts run at once, so the check takes one timeout at most.

Where a probe directory is configured, the child also writes a probe file there, reads it back and
removes it: a mount that answers stat but refuses writes (read-only, quota, a server gone read-only) is
found too. The file name carries the host name, so nodes that share the directory never collide.
"""

import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

# Runs with -I (isolated: no site packages, no environment), so it starts fast and imports nothing of ours.
_CHILD = """
import os, sys
path, probe, token = sys.argv[1], sys.argv[2], sys.argv[3]
os.stat(path)
if probe:
    with open(probe, "w") as out:
        out.write(token)
        out.flush()
        os.fsync(out.fileno())
    with open(probe) as back:
        read = back.read()
    os.unlink(probe)
    if read != token:
        sys.exit("the probe file read back differs from what was written")
"""


@dataclass(frozen=True)
class ProbeResult:
    point: str
    status: str  # "ok", "hung" (no answer within the timeout) or "error" (the stat or the probe failed)
    detail: str = ""


def probe_file(probe_dir: str) -> str:
    return os.path.join(probe_dir, f".opsctl-probe-{socket.gethostname()}")


def probe_mounts(points: dict[str, str | None], timeout: float) -> dict[str, ProbeResult]:
    """Mount point -> result, for {mount point: probe directory or None}."""
    started = time.monotonic()
    children = {}
    for point, probe_dir in points.items():
        argv = [sys.executable, "-I", "-c", _CHILD, point, probe_file(probe_dir) if probe_dir else "",
                secrets.token_hex(8)]
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
