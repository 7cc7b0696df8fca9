"""Each machine: systemd-nspawn booting the shared image with the machine's own overlay layer, inside
the machine's network namespace. Real systemd is PID 1 in it; SIGTERM to nspawn halts it cleanly. nspawn
runs under a supervisor (supervise.py) that boots the machine again when it reboots."""

import os
import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from opsctl_lab.machines import boot, fabric_cabling, keys
from opsctl_lab.machines import image as img
from opsctl_lab.machines.settings import HW_STATE, PROVISIONING_HOME, PROVISIONING_UID, Settings, is_gpu_machine
from opsctl_lab.processes import cmdline, read_pidfile, stop_pids, write_pidfile
from opsctl_lab.vendor_repos import spec


def upper(settings: Settings, name: str) -> Path:
    return settings.machine_dir(name) / "upper"


def _pid_file(settings: Settings, name: str) -> Path:
    return settings.machine_dir(name) / "nspawn.pid"


def running_pid(settings: Settings, name: str) -> int | None:
    return read_pidfile(_pid_file(settings, name))


def prepare_layer(settings: Settings, name: str, names: list[str], client_pubkey: str,
                  kernel_key: str = "") -> Path:
    """What makes this machine itself: hostname, machine-id, hosts (as provisioning writes them), the
    authorized key of root and of the provisioning account, host key, apt's proxy and the archive of its
    kernel's headers (`kernel_key`: that repository's signing key)."""
    top = upper(settings, name)
    (top / "etc").mkdir(parents=True, exist_ok=True)
    (top / "etc/hostname").write_text(f"{name}\n")
    machine_id = top / "etc/machine-id"
    if not machine_id.exists() or not machine_id.read_text().strip():
        machine_id.write_text(secrets.token_hex(16) + "\n")
    (top / "etc/hosts").write_text(hosts_text(settings, name, names))
    ssh_dir = top / "root/.ssh"
    ssh_dir.mkdir(parents=True, exist_ok=True)
    ssh_dir.chmod(0o700)
    (ssh_dir / "authorized_keys").write_text(client_pubkey + "\n")
    (ssh_dir / "authorized_keys").chmod(0o600)
    _authorize_provisioning_user(top, client_pubkey)
    # Machines have no route off the lab subnet: apt goes through the cache on the bridge, as on a
    # cluster whose nodes use a site proxy.
    proxy = top / "etc/apt/apt.conf.d/01opsctl-proxy"
    proxy.parent.mkdir(parents=True, exist_ok=True)
    # The vendors' repositories are on the bridge itself (opsctl_lab.machines.vendor_server): no proxy there.
    proxy.write_text(f'Acquire::http::Proxy "{settings.apt_proxy}";\n'
                     f'Acquire::http::Proxy::{settings.bridge_addr} "DIRECT";\n')
    if kernel_key:
        _kernel_archive(top, settings, kernel_key)
    keys.ensure_host_key(top, name)
    return top


KERNEL_SOURCES = "etc/apt/sources.list.d/opsctl-lab-kernel.sources"
KERNEL_KEY = "etc/apt/keyrings/opsctl-lab-kernel.asc"
KERNEL_PIN = "etc/apt/preferences.d/opsctl-lab-kernel.pref"


def _kernel_archive(top: Path, settings: Settings, key: str) -> None:
    """The machines run the host's kernel, whose headers no Debian archive carries: the lab's `kernel`
    repository has them under the archive's name (linux-headers-<release>), as the distribution archive
    has a real node's, so that the roles install them as they do there."""
    (top / KERNEL_KEY).parent.mkdir(parents=True, exist_ok=True)
    (top / KERNEL_KEY).write_text(key)
    suite = spec.load("kernel").suite
    (top / KERNEL_SOURCES).parent.mkdir(parents=True, exist_ok=True)
    (top / KERNEL_SOURCES).write_text(
        f"Types: deb\nURIs: {settings.vendor_url}/kernel/\nSuites: {suite}\nComponents: main\n"
        f"Signed-By: /{KERNEL_KEY}\n")
    # Debian's own kernel meta packages (linux-image-amd64, linux-headers-amd64: what Lustre's DKMS package
    # depends on) name Debian's kernel; the machine's are the running kernel's, whatever the versions.
    (top / KERNEL_PIN).parent.mkdir(parents=True, exist_ok=True)
    (top / KERNEL_PIN).write_text(
        "# The machine runs the host's kernel: its packages come from the lab's kernel repository.\n"
        f"Package: linux-image-amd64 linux-headers-amd64\nPin: release n={suite}\nPin-Priority: 1001\n")


# The common role's block (playbooks/roles/common/tasks/main.yml, "Write cluster hosts into /etc/hosts").
HOSTS_MARKER = "# {mark} opsctl cluster hosts"


def hosts_text(settings: Settings, name: str, names: list[str]) -> str:
    """/etc/hosts exactly as the common role leaves it on these machines: the stock lines of a Debian or
    Ubuntu install, `127.0.1.1 <hostname>` among them (so every service that binds or resolves the
    machine's own name is proven against it), then the role's marked block with `address name` for every
    host of the inventory's `cluster` group (all of `names`, sorted as the role sorts them). A restart
    rewrites the file; the next provision then finds nothing to change."""
    lines = ["127.0.0.1\tlocalhost", f"127.0.1.1\t{name}", "::1\tlocalhost ip6-localhost ip6-loopback",
             HOSTS_MARKER.format(mark="BEGIN")]
    lines += [f"{settings.addr(n)} {n}" for n in sorted(names)]
    lines.append(HOSTS_MARKER.format(mark="END"))
    return "\n".join(lines) + "\n"


def _authorize_provisioning_user(top: Path, client_pubkey: str) -> None:
    """The lab's key for the provisioning account (made in the image), owned by it as sshd requires."""
    home = top / PROVISIONING_HOME.lstrip("/")
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(parents=True, exist_ok=True)
    keys_file = ssh_dir / "authorized_keys"
    keys_file.write_text(client_pubkey + "\n")
    for path, mode in ((home, 0o750), (ssh_dir, 0o700), (keys_file, 0o600)):
        os.chown(path, PROVISIONING_UID, PROVISIONING_UID)
        path.chmod(mode)


CGROUP_FS = Path("/sys/fs/cgroup")


def cgroups(settings: Settings, name: str, fs: Path = CGROUP_FS) -> list[Path]:
    """The machine's own cgroup in each hierarchy that systemd uses: the unified one and, on a hybrid host,
    the named `systemd` one. With --keep-unit --register=no nspawn puts its payload under the cgroup it
    was started in; machines started from one process would share it, and each machine's systemd would
    create and remove the others' unit cgroups (`Failed to attach to cgroup ...`, status 219/CGROUP)."""
    if (fs / "cgroup.controllers").exists():
        hierarchies = [fs]
    else:
        hierarchies = [fs / "systemd", fs / "unified"]
    return [h / "opsctl-lab" / settings.netns(name) for h in hierarchies if (h / "cgroup.procs").exists()]


def _enter(groups: list[Path]) -> Callable[[], None]:
    """Runs in the child before nspawn starts: moves it into the machine's cgroups."""
    def enter() -> None:
        for group in groups:
            (group / "cgroup.procs").write_text(f"{os.getpid()}\n")
    return enter


def remove_cgroups(groups: list[Path]) -> None:
    """Deepest first (a bottom-up walk); a cgroup with a process or a child left stays (rmdir refuses),
    which is harmless."""
    for group in groups:
        for dirpath, _dirs, _files in os.walk(group, topdown=False):
            try:
                os.rmdir(dirpath)
            except OSError:
                pass


def reboot_marker(settings: Settings, name: str) -> Path | None:
    """Where the supervisor says that a GPU machine rebooted, for its emulated board's next boot (boot.py); None
    for the other machines, which have no emulated board."""
    if not is_gpu_machine(name):
        return None
    return boot.reboot_marker(upper(settings, name) / HW_STATE.lstrip("/"))


def start(settings: Settings, name: str, extra_args: list[str] | None = None) -> int:
    mdir = settings.machine_dir(name)
    groups = cgroups(settings, name)
    for group in groups:
        group.mkdir(parents=True, exist_ok=True)
    log = open(mdir / "console.log", "ab")  # noqa: SIM115 - handed to nspawn
    fabric = fabric_cabling.nspawn_args(settings, name)
    if fabric:
        settings.fabric_dir.mkdir(parents=True, exist_ok=True)
    image = str(img.path(settings))
    # The supervisor boots the machine again when it reboots (supervise.py), and marks the reboot for a GPU
    # machine's emulated board; its pid is the machine's.
    marker = reboot_marker(settings, name)
    marker_args = ["--reboot-marker", str(marker)] if marker else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "opsctl_lab.machines.supervise", *marker_args,
         "systemd-nspawn", "-q", "-b", "-D", image, f"--overlay={image}:{upper(settings, name)}:/",
         f"--network-namespace-path=/run/netns/{settings.netns(name)}", "--register=no", "--keep-unit",
         "-M", settings.nspawn_name(name), f"--hostname={name}", "--console=pipe",
         # RDMA needs unlimited locked memory, as on a real node (limits.conf / slurmd's LimitMEMLOCK).
         "--rlimit=MEMLOCK=infinity", *fabric, *(extra_args or [])],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        preexec_fn=_enter(groups))  # noqa: PLW1509 - the lab starts machines from one thread
    write_pidfile(_pid_file(settings, name), proc.pid)
    return proc.pid


FUSE_DEVICE = Path("/dev/fuse")


def gpu_machine_args(fuse: Path = FUSE_DEVICE) -> list[str]:
    """What a GPU machine gets besides the common arguments: the host's /dev/fuse, for the `nfs-hung`
    fault's FUSE mount (opsctl_lab.hung_mount). nspawn's /dev has no FUSE device of its own, and a bound
    device node needs no device cgroup rule here: nspawn applies its device policy (DeviceAllow=) only to
    a scope it registers, and the lab runs it with --register=no --keep-unit (--property= is ignored
    then). A host without FUSE starts its machines all the same; only nfs-hung fails there, in one line."""
    return [f"--bind={fuse}"] if fuse.exists() else []


PROPAGATE_DIR = Path("/run/systemd/nspawn/propagate")


def stop(settings: Settings, name: str) -> None:
    pid = running_pid(settings, name)
    if pid:
        stop_pids([pid], grace=30)
    _pid_file(settings, name).unlink(missing_ok=True)
    remove_cgroups(cgroups(settings, name))
    remove_propagate_dir(settings.nspawn_name(name))


def remove_propagate_dir(name: str) -> None:
    """nspawn makes /run/systemd/nspawn/propagate/<machine> and, where /run is not a tmpfs, refuses
    to delete it on exit ("Attempted to remove disk file system"): the lab removes it (it is empty)."""
    try:
        (PROPAGATE_DIR / name).rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        pass  # not empty or still in use: leave it rather than guess


def stray_pids(settings: Settings) -> list[int]:
    """nspawn processes running a layer of this lab's state dir, whether or not a pid file knows them."""
    layers = f":{settings.state_dir}/"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        command = cmdline(int(entry.name))
        if command.startswith("systemd-nspawn") and layers in command:
            found.append(int(entry.name))
    return found
