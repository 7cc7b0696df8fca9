"""When `lab machines up` calls a machine ready, and what a boot that outlasts its timeout is said to wait for.

A machine is ready when the provisioning user and root both log in over SSH with the lab's key and
strict host-key checking. Root alone is not enough: until systemd-user-sessions.service has run,
/run/nologin lets root in and refuses everyone else, so provisioning would fail at once. The SSH
runner is a seam (`run`); the real logins, the held boot and the journal are proven by the machines
tier (tests/integration/machines/test_machines.py).
"""

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from opsctl.cli import main
from opsctl_lab.errors import LabError
from opsctl_lab.machines import aptcache, lifecycle, nspawn, readiness
from opsctl_lab.machines import vendor_server as vendor_serve
from opsctl_lab.machines.settings import PROVISIONING_USER, Settings, machine_names

# `systemctl list-jobs --no-legend --no-pager` on a Debian 12 machine (systemd 252) whose boot a
# oneshot unit ordered before systemd-user-sessions.service holds; columns JOB UNIT TYPE STATE.
LIST_JOBS = """\
1  graphical.target                     start waiting
2  multi-user.target                    start waiting
70 systemd-user-sessions.service        start waiting
68 systemd-update-utmp-runlevel.service start waiting
79 opsctl-test-slow-boot.service        start running
"""

# `journalctl -D <layer>/var/log/journal/<machine-id> -b -o cat` of that boot (systemd 252), abridged.
JOURNAL = """\
Journal started
Starting systemd-journal-flush.service - Flush Journal to Persistent Storage...
Finished systemd-tmpfiles-setup-dev.service - Create Static Device Nodes in /dev.
Reached target local-fs.target - Local File Systems.
Finished systemd-journal-flush.service - Flush Journal to Persistent Storage.
Starting systemd-tmpfiles-setup.service - Create System Files and Directories...
Finished systemd-tmpfiles-setup.service - Create System Files and Directories.
Reached target sysinit.target - System Initialization.
Started apt-daily.timer - Daily apt download activities.
Reached target basic.target - Basic System.
Starting dbus.service - D-Bus System Message Bus...
Reached target getty.target - Login Prompts.
Starting opsctl-test-slow-boot.service - holds the boot before user sessions...
Starting ssh.service - OpenBSD Secure Shell server...
Starting systemd-logind.service - User Login Management...
Started dbus.service - D-Bus System Message Bus.
Server listening on 0.0.0.0 port 22.
Started ssh.service - OpenBSD Secure Shell server.
Started systemd-logind.service - User Login Management.
fatal: Access denied for user opsadmin by PAM account configuration [preauth]
Accepted publickey for root from 10.213.1.1 port 40508 ssh2: ED25519 SHA256:SZOLaCxnuyN8L/JB/2vNyUv7V4zNdA21jHSonY7aSAI
"""

REFUSED = "\"System is booting up. Unprivileged users are not permitted to log in yet. Please come back later.\"\n"


@dataclass
class Answer:
    """What the readiness code reads of a finished command (subprocess.CompletedProcess's fields)."""
    returncode: int
    stdout: str
    stderr: str


def done(returncode: int = 0, stdout: str = "", stderr: str = "") -> Answer:
    return Answer(returncode, stdout, stderr)


class FakeMachine:
    """Stands in for subprocess.run against one booting machine: sshd answers root, and the provisioning
    user only once `logins_open`; root's `systemctl list-jobs` shows LIST_JOBS; journalctl prints JOURNAL."""

    def __init__(self, logins_open: bool = False, root_answers: bool = True, jobs: str = LIST_JOBS):
        self.logins_open, self.root_answers, self.jobs = logins_open, root_answers, jobs
        self.calls: list[list[str]] = []

    def __call__(self, argv, **kwargs):
        self.calls.append(argv)
        if argv[0] == "journalctl":
            return done(stdout=JOURNAL)
        user = argv[-2].split("@")[0]
        if user == "root" and not self.root_answers:
            return done(255, stderr="ssh: connect to host 10.213.5.9 port 22: Connection refused\n")
        if user == PROVISIONING_USER and not self.logins_open:
            return done(255, stderr=REFUSED)
        return done(stdout=self.jobs if argv[-1].startswith("systemctl list-jobs") else "")


def lab(tmp_path: Path, names: list[str]) -> Settings:
    """A lab whose machines, apt cache and vendor repositories run (their pid files name this process),
    inventory written."""
    settings = Settings(net=5, state_dir=tmp_path / "machines", inventory_dir=tmp_path / "inventory",
                        apt_cache_dir=tmp_path / "apt")
    for name in names:
        nspawn.upper(settings, name).mkdir(parents=True)
        nspawn._pid_file(settings, name).write_text(f"{os.getpid()}\n")
    aptcache._pid_file(settings).parent.mkdir(parents=True)
    aptcache._pid_file(settings).write_text(f"{os.getpid()}\n")
    vendor_serve._pid_file(settings).write_text(f"{os.getpid()}\n")
    settings.known_hosts.parent.mkdir(parents=True)
    settings.known_hosts.write_text("")
    (settings.inventory_dir / "hosts.yml").write_text("")
    return settings


def test_list_jobs_names_the_running_units_first_and_targets_only_when_nothing_else_is_left():
    assert readiness.pending_jobs(LIST_JOBS) == [
        "opsctl-test-slow-boot.service", "systemd-user-sessions.service", "systemd-update-utmp-runlevel.service"]
    only_targets = "".join(line + "\n" for line in LIST_JOBS.splitlines()[:2])
    assert readiness.pending_jobs(only_targets) == ["graphical.target", "multi-user.target"]
    assert readiness.pending_jobs("") == []
    # With a legend (a systemctl that ignores --no-legend): header and footer are no jobs.
    legend = "JOB UNIT TYPE STATE\n" + LIST_JOBS + "\n5 jobs listed.\n"
    assert readiness.pending_jobs(legend) == readiness.pending_jobs(LIST_JOBS)


def test_journal_names_what_the_boot_started_and_never_finished():
    assert readiness.unfinished_starts(JOURNAL) == ["opsctl-test-slow-boot.service"]
    failed = JOURNAL + "Failed to start opsctl-test-slow-boot.service - holds the boot before user sessions.\n"
    assert readiness.unfinished_starts(failed) == []
    stopped = JOURNAL + "Stopped opsctl-test-slow-boot.service - holds the boot before user sessions.\n"
    assert readiness.unfinished_starts(stopped) == []
    mounting = "Mounting shared.mount - /shared...\nStarting a.service - A...\n"
    assert readiness.unfinished_starts(mounting) == ["shared.mount", "a.service"]
    # systemd before 250 writes the description alone, and so it is named.
    old = ("Starting OpenBSD Secure Shell server...\nStarting Permit User Sessions...\n"
           "Started OpenBSD Secure Shell server.\n")
    assert readiness.unfinished_starts(old) == ["Permit User Sessions"]


def test_up_does_not_call_machines_up_while_the_provisioning_user_is_refused(tmp_path):
    names = machine_names(1)
    settings = lab(tmp_path, names)
    booting = FakeMachine(logins_open=False)
    assert not lifecycle._all_ready(settings, names, run=booting)  # root logs in, provisioning would fail
    booted = FakeMachine(logins_open=True)
    assert lifecycle._all_ready(settings, names, run=booted)
    logins = [argv[-2] for argv in booted.calls]
    assert logins == [f"{user}@{settings.addr(name)}" for name in names for user in (PROVISIONING_USER, "root")]
    for argv in booted.calls:  # as the inventory logs in: the lab's key and known_hosts, strict checking
        assert argv[-1] == "true"
        assert {"StrictHostKeyChecking=yes", f"UserKnownHostsFile={settings.known_hosts}"} <= set(argv)
        assert argv[argv.index("-i") + 1] == str(settings.ssh_key)


def test_a_machine_that_refuses_logins_is_not_ready_and_costs_one_login_per_poll(tmp_path):
    settings = lab(tmp_path, ["stor1"])
    booting = FakeMachine(logins_open=False)
    assert not readiness.ready(settings, "stor1", run=booting)
    assert len(booting.calls) == 1


def test_the_timeout_names_the_units_the_boot_waits_for(tmp_path):
    settings = lab(tmp_path, ["head", "stor1"])
    booting = FakeMachine(logins_open=False)
    with pytest.raises(LabError) as error:
        readiness.wait_ssh(settings, ["head", "stor1"], timeout=0, run=booting)
    message = str(error.value)
    assert message.startswith(
        "no SSH after 0s (head: boot not finished, waiting for: opsctl-test-slow-boot.service, "
        "systemd-user-sessions.service, systemd-update-utmp-runlevel.service; stor1: boot not finished, ")
    assert "\n" not in message


def test_a_boot_with_no_job_left_that_still_refuses_logins_is_told_apart(tmp_path):
    # A failed systemd-user-sessions.service leaves /run/nologin behind, and nothing is waiting any more.
    settings = lab(tmp_path, ["stor1"])
    assert readiness.boot_waits(settings, "stor1", run=FakeMachine(jobs="")) == (
        "no boot job left, but opsadmin cannot log in (/run/nologin? systemctl --failed)")


def test_without_root_ssh_the_boot_journal_read_from_the_host_names_them(tmp_path):
    settings = lab(tmp_path, ["stor1"])
    top = nspawn.upper(settings, "stor1")
    (top / "etc").mkdir()
    (top / "etc/machine-id").write_text("60f3eaeb147e8aa18c73d46734c669d0\n")
    no_sshd = FakeMachine(root_answers=False)
    assert readiness.boot_waits(settings, "stor1", run=no_sshd) == (
        "no SSH as root (ssh: connect to host 10.213.5.9 port 22: Connection refused), no boot journal")
    journal = top / "var/log/journal/60f3eaeb147e8aa18c73d46734c669d0"
    journal.mkdir(parents=True)
    assert readiness.boot_waits(settings, "stor1", run=no_sshd) == (
        "no SSH as root (ssh: connect to host 10.213.5.9 port 22: Connection refused), "
        "boot waiting for: opsctl-test-slow-boot.service")
    assert no_sshd.calls[-1][:5] == ["journalctl", "-D", str(journal), "-b", "-o"]


def test_boot_timeout_is_an_option_of_up(monkeypatch):
    seen = {}
    monkeypatch.setattr(lifecycle, "up", lambda **kwargs: seen.update(kwargs) or 0)
    result = CliRunner().invoke(main, ["lab", "machines", "up", "--boot-timeout", "20"])
    assert result.exit_code == 0, result.output
    assert seen["boot_timeout"] == 20
