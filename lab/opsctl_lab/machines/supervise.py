"""A machine's supervisor: `python -m opsctl_lab.machines.supervise [--reboot-marker PATH] systemd-nspawn ARGS...`.

A machine that reboots (`reboot`, `shutdown -r`, Ansible's reboot module) ends its systemd-nspawn with
exit status 133; systemd-nspawn@.service boots it again (RestartForceExitStatus=133), and so does this.
Any other end of nspawn (a halt, a crash) ends the supervisor with nspawn's status. SIGTERM and SIGINT go
on to nspawn, which halts the machine cleanly, and the supervisor ends with it: the lab's pid file names
the supervisor, and stopping it stops the machine as stopping nspawn did.

A container shares the host's clocks, so its uptime (/proc/uptime, sysinfo(2)) would go on across a
reboot, and slurmd, which reports its boot time as now minus uptime, would never tell slurmctld that the
node rebooted: `scontrol reboot` would wait until ResumeTimeout. Each boot after a reboot therefore runs
in a time namespace of its own whose boot clock starts at zero, as a real node's does. The first boot
keeps the host's clock: the lab stopping and starting a machine (`opsctl lab machines down/up`) is a
restart of its processes to Slurm, not an unexpected reboot that would set the node DOWN.

A reboot is also one of the emulated board (a GPU machine's): with --reboot-marker the supervisor leaves that
file (next to the machine's hardware state, in its layer) after each reboot, and the machine's next boot
(`opsctl-hw boot`, opsctl_lab.machines.boot) ends the faults that a reboot ends. The supervisor alone tells a
reboot (status 133) from the lab stopping the machine, whose faults all stay. nspawn has ended by then, so
nothing has the machine's layer mounted while it writes there.
"""

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REBOOT_STATUS = 133  # systemd-nspawn(1): "the container requested a reboot"
# A machine that reboots at once after every boot (a broken unit) would spin: at most this many boots in
# BURST_SECONDS, then the supervisor gives up with nspawn's status.
BURST_BOOTS = 5
BURST_SECONDS = 60.0
# A real node takes minutes from `reboot` to its next boot (firmware, POST); a container takes well under a
# second. Slurm keeps boot times in whole seconds and takes a node whose boot time is not after the reboot
# request for one that has not rebooted yet (REBOOT_ISSUED until ResumeTimeout): the next boot starts
# this long after the reboot, as the simulated lab's reboot program pauses too (opsctl_lab.slurm_reboot).
REBOOT_PAUSE_SECONDS = 2.0
CLONE_NEWTIME = 0x80  # linux/sched.h


def fresh_boot_clock() -> None:
    """The children started from now on see a boot clock (uptime, btime) that starts at zero:
    unshare(CLONE_NEWTIME) makes a new time namespace for them, and its boottime offset is written before
    any of them enters it (time_namespaces(7))."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWTIME) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"unshare(CLONE_NEWTIME): {os.strerror(errno)}")
    with open("/proc/self/timens_offsets", "w") as offsets:
        offsets.write(f"boottime {-int(time.clock_gettime(time.CLOCK_BOOTTIME))} 0\n")


def mark_reboot(marker: Path) -> None:
    """The machine rebooted: its next boot finds this file (its content, the time, is for a person)."""
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"{time.time():.3f}\n")


def split_marker(argv: list[str]) -> tuple[Path | None, list[str]]:
    """([--reboot-marker PATH] COMMAND...) -> (PATH or None, COMMAND...)."""
    if argv[:1] == ["--reboot-marker"] and len(argv) > 1:
        return Path(argv[1]), argv[2:]
    return None, argv


def main(argv: list[str]) -> int:
    marker, argv = split_marker(argv)
    if not argv or argv[0].startswith("-"):
        sys.stderr.write("usage: python -m opsctl_lab.machines.supervise [--reboot-marker PATH] "
                         "systemd-nspawn ARGS...\n")
        return 2
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    boots: list[float] = []
    status = 0
    while not stopping:
        boots = [t for t in boots if time.monotonic() - t < BURST_SECONDS] + [time.monotonic()]
        child = subprocess.Popen(argv)  # stdin, stdout and stderr are the supervisor's (the console log)
        if stopping:  # a signal between the check above and this child
            child.terminate()
        status = child.wait()
        if status == REBOOT_STATUS and marker is not None:
            mark_reboot(marker)  # the board rebooted, even when the lab stops the machine now
        if status != REBOOT_STATUS or stopping:
            return status
        if len(boots) >= BURST_BOOTS:
            sys.stderr.write(f"opsctl lab: the machine rebooted {len(boots)} times in {BURST_SECONDS:.0f} s; "
                             "not booting it again\n")
            return status
        sys.stderr.write("opsctl lab: the machine rebooted; booting it again\n")
        time.sleep(REBOOT_PAUSE_SECONDS)  # a signal meanwhile ends the loop
        try:
            fresh_boot_clock()
        except OSError as err:  # a kernel without time namespaces (before 5.6, or CONFIG_TIME_NS off)
            sys.stderr.write(f"opsctl lab: the machine's uptime goes on across this reboot: {err}\n")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
