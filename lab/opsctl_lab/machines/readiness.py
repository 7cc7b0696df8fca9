"""Whether a lab machine is ready for provisioning, and when it is not, what its boot still waits for.

`opsctl lab machines up` waits for `ready` on every machine it started, and reports "already up" only
when every machine is `ready` by the same check.
"""

import socket
import subprocess
import time
from collections.abc import Callable

from opsctl_lab.errors import LabError
from opsctl_lab.machines import keys
from opsctl_lab.machines.nspawn import running_pid, upper
from opsctl_lab.machines.settings import PROVISIONING_USER, Settings

# Stands in for subprocess.run, so that a test can answer for the machines.
Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def ready(settings: Settings, name: str, run: Runner = subprocess.run) -> bool:
    """Whether provisioning can start on the machine: it answers SSH as the provisioning user and as root
    (the lab's own commands), with the lab's key and strict host-key checking, each running `true`.

    Root alone proves nothing about the boot: until systemd-user-sessions.service has run, /run/nologin
    exists, and pam_nologin lets root in but refuses every other account ("System is booting up.
    Unprivileged users are not permitted to log in yet"). Testing for that file as root would check one
    cause; logging in as the provisioning user checks what provisioning will do. It goes first: during
    the boot it is the login that fails, and one SSH round trip per poll is enough to find that out."""
    return all(_output(run, keys.ssh_args(settings, name, user) + ["true"]).returncode == 0
               for user in (PROVISIONING_USER, "root"))


def wait_ssh(settings: Settings, names: list[str], timeout: float = 90, run: Runner = subprocess.run) -> None:
    """Until every machine is `ready`. On timeout, the error says for each machine that is not what its
    boot still waits for (`boot_waits`), in one line."""
    pending = set(names)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for name in sorted(pending):
            if running_pid(settings, name) is None:
                raise LabError(f"machine {name} exited while booting; see {settings.machine_dir(name)}/console.log")
            # Cheap first: until sshd listens, an SSH attempt would only wait for its connect timeout.
            if port_open(settings.addr(name), 22) and ready(settings, name, run):
                pending.discard(name)
        if pending:
            time.sleep(0.3)
    if pending:
        waiting = "; ".join(f"{name}: {boot_waits(settings, name, run)}" for name in sorted(pending))
        raise LabError(f"no SSH after {timeout:.0f}s ({waiting}); the boot log: "
                       f"journalctl -D {settings.state_dir}/<machine>/upper/var/log/journal/*")


LIST_JOBS = "systemctl list-jobs --no-legend --no-pager"
SHOWN_UNITS = 5  # per machine: the message stays one line


def boot_waits(settings: Settings, name: str, run: Runner = subprocess.run) -> str:
    """What keeps a machine from being ready, in a few words: the jobs its systemd still runs or waits
    for, asked over root's SSH; when root gets no answer either, what its boot journal (read from the
    host: the current boot only, with the same time limit as an SSH command) shows begun and not ended."""
    jobs = _output(run, keys.ssh_args(settings, name) + [LIST_JOBS])
    if jobs.returncode == 0:
        units = pending_jobs(jobs.stdout)
        if not units:  # e.g. a failed systemd-user-sessions.service, which leaves /run/nologin behind
            return f"no boot job left, but {PROVISIONING_USER} cannot log in (/run/nologin? systemctl --failed)"
        return f"boot not finished, waiting for: {_few(units)}"
    errors = (jobs.stderr or "").strip().splitlines()
    why = f"no SSH as root ({errors[-1]})" if errors else "no SSH as root"
    journal = _boot_journal(settings, name, run)
    if journal is None:
        return f"{why}, no boot journal"
    units = unfinished_starts(journal)[::-1]  # the latest first: nearest to where the boot stands
    return f"{why}, boot waiting for: {_few(units)}" if units else why


def _output(run: Runner, argv: list[str]) -> "subprocess.CompletedProcess[str]":
    try:
        return run(argv, capture_output=True, text=True, timeout=15, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 255, "", "no answer in 15s")


def _boot_journal(settings: Settings, name: str, run: Runner) -> str | None:
    top = upper(settings, name)
    try:
        machine_id = (top / "etc/machine-id").read_text().strip()
    except OSError:
        return None
    journal = top / "var/log/journal" / machine_id
    if not machine_id or not journal.is_dir():
        return None
    out = _output(run, ["journalctl", "-D", str(journal), "-b", "-o", "cat", "--no-pager"])
    return out.stdout if out.returncode == 0 else None


def _few(units: list[str]) -> str:
    shown = ", ".join(units[:SHOWN_UNITS])
    return shown + (f" and {len(units) - SHOWN_UNITS} more" if len(units) > SHOWN_UNITS else "")


def pending_jobs(list_jobs: str) -> list[str]:
    """The units of `systemctl list-jobs --no-legend` (columns JOB UNIT TYPE STATE), running ones first.
    Targets only wait for everything else: they are named only when nothing else is left."""
    jobs = [line.split() for line in list_jobs.splitlines()]
    jobs = [job for job in jobs if len(job) >= 4 and job[0].isdigit()]
    jobs.sort(key=lambda job: job[3] != "running")  # stable: systemd's order within each state
    units = [job[1] for job in jobs]
    return [u for u in units if not u.endswith(".target")] or units


# systemd's status messages in the journal, `-o cat`: "Starting <what>..." until one of these ends it.
# systemd 250 and later write <what> as "<unit> - <description>", earlier ones the description alone.
_BEGUN = ("Starting ", "Mounting ")
_ENDED = ("Started ", "Finished ", "Failed to start ", "Stopped ", "Mounted ", "Failed to mount ")


def unfinished_starts(journal: str) -> list[str]:
    """What a boot journal shows begun and not ended, in the order begun: unit names where the journal
    has them, else descriptions."""
    begun: dict[str, None] = {}  # an ordered set
    for line in journal.splitlines():
        line = line.strip()
        if line.startswith(_BEGUN) and line.endswith(("...", "\u2026")):
            what = line.split(" ", 1)[1].removesuffix("...").removesuffix("\u2026")
            begun.pop(what, None)
            begun[what] = None
        elif line.startswith(_ENDED) and line.endswith("."):
            what = next(line.removeprefix(word) for word in _ENDED if line.startswith(word))
            begun.pop(what.removesuffix("."), None)
    return [what.split(" - ", 1)[0] for what in begun]


def port_open(addr: str, port: int) -> bool:
    """Whether something accepts a TCP connection there within half a second."""
    try:
        with socket.create_connection((addr, port), timeout=0.5):
            return True
    except OSError:
        return False
