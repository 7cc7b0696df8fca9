"""A forged XID on a simulated node: a user who is not root execs a file named like the NVIDIA driver's XID line
with an empty argv, and `opsctl node check` of the node counts nothing.

The real kernel (fs/exec.c, Linux 5.18 and later) logs such an exec once a boot, quoting the file's path:
`process 'perl' launched '<path>' with NULL argv: empty string added` (a real record:
tests/fixtures/kmsg/kmsg_quoted_driver_text.txt). A simulated node shares the host's kernel, which would print
it once for the host and every node together, into the host's log and not the node's. So the exec runs under
the lab's stand-in for the node's kernel (opsctl_lab.kernel_exec): the user's command really runs as the user,
its execs are traced, and the record the kernel writes for an exec with an empty argv goes into the node's
kernel log in the kernel's words, at facility 0 and KERN_WARNING, the first one of each emulated boot. The
emulated node is booted again first (this boot has not warned yet) and after (its log keeps nothing of this
test)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from opsctl.gpu.kmsg import parse_records
from opsctl_lab.hardware import NodeHardware, write_kernel_log
from opsctl_lab.hca_layout import GPU_BUSES
from opsctl_lab.paths import LabPaths
from tests.conftest import OPSCTL, REPO

pytestmark = pytest.mark.lab
NODE = "gpu032"  # no other lab test uses it
NOBODY = "nobody"
# GPU 3's bus on a lab node: read as the driver's, this would be XID 142 on GPU 3, whose catalog action drains.
FORGED = f"NVRM: Xid (PCI:0000:{GPU_BUSES[3]}:00): 142, pid=1, name=x, y"
# As the user: make the file, then exec it with no argument at all (perl's `exec {PATH} ()`).
EXEC_EMPTY_ARGV = "cp /bin/true \"$1\" && exec perl -e 'exec {$ARGV[0]} ()' \"$1\""


def reboot(paths: LabPaths) -> None:
    """What the node's reboot does to its kernel log: it starts again, empty."""
    hw = NodeHardware.load(paths.hardware(NODE), NODE)
    hw.reboot()
    hw.save(paths.hardware(NODE))
    write_kernel_log(paths.kernel_log(NODE), hw)


def node_check(lab, textfile: Path) -> tuple[int, dict, dict[str, float]]:
    """`opsctl node check` of the node as the lab runs it (its config, the lab's state directory): exit code,
    --json, and the textfile's samples by series."""
    config = LabPaths(lab.lab_dir).node_check_config(NODE)
    proc = subprocess.run([*OPSCTL, "node", "check", "--json", "--config", str(config), "--textfile", str(textfile)],
                          capture_output=True, text=True, timeout=60, env={**os.environ, **lab.env}, cwd=REPO)
    assert proc.returncode in (0, 1), proc.stderr
    samples = dict(line.rsplit(" ", 1) for line in textfile.read_text().splitlines() if not line.startswith("#"))
    return proc.returncode, json.loads(proc.stdout), {series: float(value) for series, value in samples.items()}


def ignored(samples: dict[str, float]) -> dict[str, float]:
    prefix = 'opsctl_node_kernel_log_ignored_records_total{reason="'
    return {series[len(prefix):-2]: value for series, value in samples.items() if series.startswith(prefix)}


def test_a_file_named_like_an_xid_line_execd_with_an_empty_argv_counts_nothing(lab, tmp_path):
    paths = LabPaths(lab.lab_dir)
    home = Path(tempfile.mkdtemp(prefix="opsctl-forged-xid-", dir="/tmp"))
    shutil.chown(home, NOBODY)
    home.chmod(0o755)
    forged = home / FORGED
    reboot(paths)
    try:
        _, _, before = node_check(lab, tmp_path / "before.prom")
        user = subprocess.run([sys.executable, "-m", "opsctl_lab.kernel_exec", "--state", str(paths.hardware(NODE)),
                               "--user", NOBODY, "--", "/bin/sh", "-c", EXEC_EMPTY_ARGV, "sh", str(forged)],
                              capture_output=True, text=True, timeout=60)
        assert user.returncode == 0, user.stderr
        assert forged.stat().st_uid != 0  # the user's own file
        records = parse_records(paths.kernel_log(NODE).read_text())
        assert [(r.priority, r.message) for r in records] == [
            (4, f"process 'perl' launched '{forged}' with NULL argv: empty string added")]

        code, doc, after = node_check(lab, tmp_path / "after.prom")
        kernel = doc["kernel_log"]
        assert kernel["read_ok"] and kernel["xids"] == [] and kernel["sxids"] == [], kernel
        assert code == 0 and [c for c in doc["checks"] if c["failed"]] == [], doc["checks"]
        assert [series for series in after if "xid" in series] == []  # no XID counted, this run or before
        assert ignored(after) == {"quoted": ignored(before)["quoted"] + 1, "userspace": ignored(before)["userspace"]}
    finally:
        reboot(paths)
        shutil.rmtree(home)
