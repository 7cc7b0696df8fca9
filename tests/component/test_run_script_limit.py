"""tests/run.py's stream limit, on a real stream: a stream that runs past it is interrupted, says where it
was, and fails the run, instead of running on until CI's own limit kills it without a word."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.component

REPO = Path(__file__).resolve().parents[2]
HUNG = '''
import time


def test_hangs():
    time.sleep(300)
'''


def test_a_stream_past_its_limit_is_interrupted_where_it_hung_and_fails_the_run(tmp_path):
    hung = tmp_path / "hung.py"
    hung.write_text(HUNG)
    logs = tmp_path / "logs"
    started = time.monotonic()
    # Room for the inner pytest to start and reach the test on a loaded 2-core machine (its start alone took more
    # than 5 s in a full CI run), so that the interrupt finds it in the test, not in its start.
    proc = subprocess.run([sys.executable, "tests/run.py", "--streams", "lab", "--no-chroot-build",
                           "--stream-limit", "20", "--logs", str(logs), "--tests", f"lab=-p no:cacheprovider {hung}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert time.monotonic() - started < 60, proc.stdout
    assert proc.returncode == 1, proc.stdout
    assert "==== tests/run.py: lab ran past its 20 s: SIGINT, its log says where it was" in proc.stdout
    log = (logs / "lab.log").read_text()
    assert f"{hung}:6: KeyboardInterrupt" in log, log
    # The closing table: pytest, interrupted, exits 2 (its "interrupted"), within the limit and the teardown.
    row = next(line.split() for line in proc.stdout.splitlines() if line.startswith("lab "))
    assert row[3] == "2" and float(row[1]) < 60, proc.stdout
