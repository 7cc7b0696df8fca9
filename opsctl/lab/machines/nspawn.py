"""Each machine: systemd-nspawn booting the shared image with the machine's own overlay layer, inside
the machine's network namespace. Real systemd is PID 1 in it; SIGTERM to nspawn halts it cleanly."""

import os
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path

from opsctl.errors import LabError
from opsctl.lab.machines import keys
from opsctl.lab.machines.procs import cmdline, pid_alive, stop_pid
from opsctl.lab.machines.settings import Settings, machine_addr, netns_name


def upper(settings: Settings, name: str) -> Path:
    return settings.machine_dir(name) / "upper"


def _pid_file(settings: Settings, name: str) -> Path:
    return settings.machine_dir(name) / "nspawn.pid"


def running_pid(settings: Settings, name: str) -> int | None:
    try:
        pid = int(_pid_file(settings, name).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid, f"-M {name} ") or pid_alive(pid, f"--machine={name}") else None


def prepare_layer(settings: Settings, name: str, names: list[str], client_pubkey: str) -> Path:
    """What makes this machine itself: hostname, machine-id, hosts, root's authorized key, host key."""
    top = upper(settings, name)
    (top / "etc").mkdir(parents=True, exist_ok=True)
    (top / "etc/hostname").write_text(f"{name}\n")
    machine_id = top / "etc/machine-id"
    if not machine_id.exists() or not machine_id.read_text().strip():
        machine_id.write_text(secrets.token_hex(16) + "\n")
    hosts = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    hosts += [f"{machine_addr(n)}\t{n}" for n in names]
    (top / "etc/hosts").write_text("\n".join(hosts) + "\n")
    ssh_dir = top / "root/.ssh"
    ssh_dir.mkdir(parents=True, exist_ok=True)
    ssh_dir.chmod(0o700)
    (ssh_dir / "authorized_keys").write_text(client_pubkey + "\n")
    (ssh_dir / "authorized_keys").chmod(0o600)
    keys.ensure_host_key(top, name)
    return top


def start(settings: Settings, name: str) -> int:
    mdir = settings.machine_dir(name)
    log = open(mdir / "console.log", "ab")  # noqa: SIM115 - handed to nspawn
    image = str(settings.image_dir)
    proc = subprocess.Popen(
        ["systemd-nspawn", "-q", "-b", "-D", image, f"--overlay={image}:{upper(settings, name)}:/",
         f"--network-namespace-path=/run/netns/{netns_name(name)}", "--register=no", "--keep-unit",
         "-M", name, "--console=pipe"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    _pid_file(settings, name).write_text(f"{proc.pid}\n")
    return proc.pid


def stop(settings: Settings, name: str) -> None:
    pid = running_pid(settings, name)
    if pid:
        stop_pid(pid, signal.SIGTERM, grace=30)
    _pid_file(settings, name).unlink(missing_ok=True)


def wait_ssh(settings: Settings, names: list[str], timeout: float = 90) -> None:
    """Until `ssh root@machine true` works for every machine, with strict host-key checking."""
    pending = set(names)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for name in sorted(pending):
            if running_pid(settings, name) is None:
                raise LabError(f"machine {name} exited while booting; see {settings.machine_dir(name)}/console.log")
            if _port_open(machine_addr(name), 22) and subprocess.run(
                    keys.ssh_args(settings, name) + ["true"], capture_output=True, timeout=15).returncode == 0:
                pending.discard(name)
        if pending:
            time.sleep(0.3)
    if pending:
        raise LabError(f"no SSH to {', '.join(sorted(pending))} after {timeout:.0f}s; "
                       f"see {settings.state_dir}/<machine>/console.log")


def _port_open(addr: str, port: int) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=0.5):
            return True
    except OSError:
        return False


def stray_pids(settings: Settings) -> list[int]:
    """nspawn processes that boot this tier's image, whether or not a pid file knows them."""
    image = f"-D {settings.image_dir} "
    found = []
    for entry in Path("/proc").iterdir():
        if (entry.name.isdigit() and int(entry.name) != os.getpid() and pid_alive(int(entry.name), image)
                and cmdline(int(entry.name)).startswith("systemd-nspawn")):
            found.append(int(entry.name))
    return found
