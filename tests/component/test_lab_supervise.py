"""The lab machines' supervisor (opsctl_lab.machines.supervise) with a stand-in for systemd-nspawn: a shell
script that ends with the status its boot count says (133 is a reboot). The supervisor boots it again on
a reboot only, passes SIGTERM on, and stops a machine that reboots without end."""

import signal
import subprocess
import sys
import time
from pathlib import Path

from opsctl_lab.machines import supervise


def stand_in(tmp_path: Path, statuses: list[int], sleep_last: bool = False) -> list[str]:
    """A "machine" whose n-th boot ends with statuses[n] (the last one for every later boot); with
    `sleep_last` its last boot runs until a signal, which it reports in `signals`."""
    script = tmp_path / "machine.sh"
    script.write_text(f"""
boots=$(cat {tmp_path}/boots 2>/dev/null || echo 0); boots=$((boots + 1)); echo $boots > {tmp_path}/boots
set -- {' '.join(map(str, statuses))}
shift $(( boots < $# ? boots - 1 : $# - 1 ))
if [ "$#" -eq 1 ] && [ {int(sleep_last)} -eq 1 ]; then
    trap 'echo TERM >> {tmp_path}/signals; exit 0' TERM
    echo ready > {tmp_path}/ready
    while :; do sleep 0.1; done
fi
exit $1
""")
    return ["sh", str(script)]


def supervisor(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "opsctl_lab.machines.supervise", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def boots(tmp_path: Path) -> int:
    return int((tmp_path / "boots").read_text())


def test_a_reboot_boots_the_machine_again_and_a_halt_ends_the_supervisor(tmp_path):
    proc = supervisor(stand_in(tmp_path, [133, 133, 0]))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and boots(tmp_path) == 3
    assert err.count("the machine rebooted; booting it again") == 2, err


def test_a_reboot_leaves_the_boards_marker_and_a_halt_none(tmp_path):
    """With --reboot-marker the next boot finds the file (opsctl-hw boot then ends the faults a reboot ends); a
    machine stopped without a reboot gets none, as `lab machines down`/`up` keeps every fault."""
    rebooted, halted = tmp_path / "rebooted", tmp_path / "halted"
    rebooted.mkdir()
    halted.mkdir()
    for where, statuses in ((rebooted, [133, 0]), (halted, [0])):
        proc = supervisor(["--reboot-marker", str(where / "layer/var/lib/opsctl-hw/rebooted"),
                           *stand_in(where, statuses)])
        proc.communicate(timeout=30)
        assert proc.returncode == 0
    assert (rebooted / "layer/var/lib/opsctl-hw/rebooted").exists()
    assert not (halted / "layer/var/lib/opsctl-hw/rebooted").exists()


def test_a_crash_is_not_a_reboot(tmp_path):
    proc = supervisor(stand_in(tmp_path, [1]))
    proc.communicate(timeout=30)
    assert proc.returncode == 1 and boots(tmp_path) == 1


def test_sigterm_reaches_the_machine_after_a_reboot_and_ends_the_supervisor(tmp_path):
    proc = supervisor(stand_in(tmp_path, [133, 0], sleep_last=True))
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 0 and boots(tmp_path) == 2
    assert (tmp_path / "signals").read_text() == "TERM\n"


def test_a_machine_that_reboots_without_end_is_left_down(tmp_path):
    proc = supervisor(stand_in(tmp_path, [133]))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 133 and boots(tmp_path) == supervise.BURST_BOOTS
    assert f"rebooted {supervise.BURST_BOOTS} times" in err, err


def test_no_command_is_a_usage_error():
    proc = supervisor([])
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and err.startswith("usage:")


def test_a_boot_after_a_reboot_starts_its_uptime_at_zero_and_the_first_keeps_the_hosts(tmp_path):
    """slurmd reports its boot time as now minus uptime: a reboot must show as a new boot (supervise.py), one
    that starts a pause after the reboot, so that Slurm's whole seconds put it after the reboot request."""
    record = (f"cut -d' ' -f1 /proc/uptime >> {tmp_path}/uptimes; "
              f"awk '/^btime/ {{print $2}}' /proc/stat >> {tmp_path}/btimes; date +%s.%N >> {tmp_path}/starts")
    script = tmp_path / "machine.sh"
    script.write_text(f"{record}\n[ $(wc -l < {tmp_path}/uptimes) -ge 2 ] && exit 0\n"
                      f"sleep 2; date +%s.%N > {tmp_path}/rebooted; exit 133\n")
    host_uptime = float(Path("/proc/uptime").read_text().split()[0])
    proc = supervisor(["sh", str(script)])
    proc.communicate(timeout=30)
    first, second = (float(line) for line in (tmp_path / "uptimes").read_text().split())
    assert proc.returncode == 0 and abs(first - host_uptime) < 5, (first, host_uptime)
    assert second < 2 < first - 2, (first, second)
    first_btime, second_btime = (int(line) for line in (tmp_path / "btimes").read_text().split())
    assert second_btime - first_btime >= first - 1, (first_btime, second_btime)
    next_boot = float((tmp_path / "starts").read_text().split()[1])
    assert next_boot - float((tmp_path / "rebooted").read_text()) >= supervise.REBOOT_PAUSE_SECONDS


def test_a_kernel_without_time_namespaces_boots_the_machine_again_with_one_line(tmp_path):
    """Where unshare(CLONE_NEWTIME) fails (a kernel before 5.6, or without CONFIG_TIME_NS), the machine still
    boots again after its reboot, and the console log says why its uptime goes on."""
    failing = ("import errno, sys\nfrom opsctl_lab.machines import supervise\n"
               "def fail():\n    raise OSError(errno.EINVAL, 'unshare(CLONE_NEWTIME): Invalid argument')\n"
               "supervise.fresh_boot_clock = fail\nsys.exit(supervise.main(sys.argv[1:]))\n")
    proc = subprocess.Popen([sys.executable, "-c", failing, *stand_in(tmp_path, [133, 0])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and boots(tmp_path) == 2, err
    assert "the machine's uptime goes on across this reboot: [Errno 22] unshare(CLONE_NEWTIME)" in err, err
