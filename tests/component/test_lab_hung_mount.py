"""The lab's hung mount (opsctl_lab.hung_mount) with real FUSE mounts: who it outlives. In the simulated
lab the hang ends with the process that mounted it; in a lab machine (OPSCTL_HUNG_MOUNT_STAYS=1, set by
the machine's opsctl-hw) it outlives that process and lasts until `release`, which ends its waiters too.
Needs root and /dev/fuse."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opsctl.storage.probe import probe_mounts
from opsctl_lab import hung_mount

pytestmark = pytest.mark.skipif(not Path("/dev/fuse").exists() or os.geteuid() != 0, reason="root and /dev/fuse")
HANG = "import sys; from pathlib import Path; from opsctl_lab import hung_mount; " \
       "hung_mount.hang(Path(sys.argv[1]), Path(sys.argv[2]))"


def hang_in_a_process_that_exits(point, pidfile, stays):
    env = dict(os.environ)
    env.pop(hung_mount.STAYS_ENV, None)
    if stays:
        env[hung_mount.STAYS_ENV] = "1"
    subprocess.run([sys.executable, "-c", HANG, str(point), str(pidfile)], env=env, check=True, timeout=30)


def status(point):
    return probe_mounts({str(point): None}, timeout=1.5)[str(point)]


def test_a_hang_that_stays_outlives_its_mounter_until_release(tmp_path):
    point, pidfile = tmp_path / "home", tmp_path / "nfs-hung.pid"
    point.mkdir()
    hang_in_a_process_that_exits(point, pidfile, stays=True)
    try:
        assert hung_mount.mounted(point)
        assert status(point).status == "hung"
        # The waiter says when it reaches its stat: on a loaded host a Python start alone can outlast a
        # fixed sleep, and a stat made after the release would find a plain directory.
        waiter = subprocess.Popen([sys.executable, "-I", "-c",
                                   f"import os; print('stat', flush=True); os.stat({str(point)!r})"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert waiter.stdout.readline() == "stat\n"
        time.sleep(0.5)
        assert waiter.poll() is None  # waits on the mount
    finally:
        hung_mount.release(point, pidfile)
    assert "Transport endpoint is not connected" in waiter.communicate(timeout=10)[1]
    assert not hung_mount.mounted(point) and not pidfile.exists()
    assert status(point).status == "ok"


def test_a_hang_ends_with_its_mounter_where_it_does_not_stay(tmp_path):
    point, pidfile = tmp_path / "home", tmp_path / "nfs-hung.pid"
    point.mkdir()
    hang_in_a_process_that_exits(point, pidfile, stays=False)
    try:
        deadline = time.monotonic() + 10
        while hung_mount._holder(pidfile) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert hung_mount._holder(pidfile) is None  # the holder followed its parent
        found = status(point)
        assert found.status == "error" and "Transport endpoint is not connected" in found.detail
    finally:
        hung_mount.release(point, pidfile)
    assert not hung_mount.mounted(point)
