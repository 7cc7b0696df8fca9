"""`opsctl lab up` twice changes nothing; `down` leaves no process; `up` after `down` works.
Runs after the other lab tests (file order) and leaves the lab up for later ones."""

from pathlib import Path

import pytest

from opsctl_lab import processes
from tests.conftest import opsctl

pytestmark = pytest.mark.lab


def _pids(lab_dir: Path) -> dict:
    """name -> the PID each daemon's PID file records ("<pid> <start time>")."""
    return {p.stem: int(p.read_text().split()[0]) for p in (lab_dir / "run").glob("*.pid")}


def _lab_processes(lab_dir: Path) -> list[str]:
    """Live processes whose command line names a path in the lab directory (the lab machines, a
    separate tier under <lab>/machines, are not this lab's)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        # Paths under the lab directory (the emulator's --nodes-file is one); another lab's directory
        # may share the prefix (/var/lib/opsctl-lab-2), hence the slash.
        ours = f"{lab_dir}/" in cmdline.replace(f"{lab_dir / 'machines'}/", "")
        if state != "Z" and ours:
            found.append(f"{proc.name}: {cmdline[:120]}")
    return found


def test_second_up_changes_nothing(lab):
    configs = [lab.lab_dir / "slurm" / "slurm.conf", lab.lab_dir / "prometheus" / "prometheus.yml"]
    before = (_pids(lab.lab_dir), [c.read_text() for c in configs])
    proc = opsctl("lab", "up", env=lab.env)
    assert "lab ready" in proc.stdout
    assert (_pids(lab.lab_dir), [c.read_text() for c in configs]) == before
    # Everything the tier runs is running: exit 0 (1 once it is down, below).
    assert opsctl("lab", "status", env=lab.env, check=False).returncode == 0


def test_up_with_other_size_is_refused_while_running(lab):
    proc = opsctl("lab", "up", "--nodes", "3", env=lab.env, check=False)
    assert proc.returncode == 2 and "lab down" in proc.stderr


def test_down_leaves_no_process_then_up_reports_what_it_kept_and_reset_cleans(lab):
    # A fault, a person's drain, a held job and a maintenance reservation that their makers left (a test,
    # a preflight stopped halfway) survive `down` and `up`: `up` counts the reserved node as settled and
    # says so; `reset` clears all four.
    opsctl("lab", "inject", "gpu012", "xid:79", "--gpu", "3", env=lab.env)
    lab.run("scontrol", "update", "nodename=gpu013", "state=drain", "reason=ticket-123 bad dimm")
    lab.run("scontrol", "create", "reservation", "ReservationName=left-behind", "Nodes=gpu014", "StartTime=now",
            "Duration=240", "Users=root", "Flags=MAINT")
    held = lab.run("sbatch", "--parsable", "--hold", "-o", "/dev/null", "--wrap", "true").stdout.strip()
    pids = _pids(lab.lab_dir)
    assert len(pids) >= 4 + 2 * lab.nodes
    opsctl("lab", "down", env=lab.env)
    for name, pid in pids.items():
        assert not processes.alive(pid), name
    assert _lab_processes(lab.lab_dir) == []
    status = opsctl("lab", "status", env=lab.env, check=False)
    assert status.returncode == 1 and "not running" in status.stdout
    up = opsctl("lab", "up", env=lab.env, timeout=300).stdout
    assert f"lab ready: {lab.nodes} nodes ({lab.nodes - 2} idle, 1 drain, 1 maint)" in up, up
    assert "  drain    gpu013" in up and "  maint    gpu014" in up and "  faults gpu012: xid:79 gpu3" in up
    reset = opsctl("lab", "reset", env=lab.env).stdout
    assert "cleared gpu012: xid:79 gpu3" in reset and "resumed gpu013 (drain)" in reset, reset
    assert "deleted reservation left-behind (gpu014)" in reset and f"cancelled 1 job(s): {held}" in reset, reset
    assert lab.run("squeue", "-h", "-o", "%i").stdout == ""
    # A slurmd that a busy host kept from answering one ping shows `idle*` until the next one.
    lab.wait_until(lambda: set(lab.sinfo_states().values()) == {"idle"}, 60, "every node idle")
    assert opsctl("lab", "reset", env=lab.env).stdout == "the lab was clean\n"
