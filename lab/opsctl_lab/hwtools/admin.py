"""`opsctl-hw`: the lab's hand on a machine's emulated hardware (what `opsctl lab machines inject`
runs over SSH). Changes the state file and rewrites the sysfs tree and the storage files at once, so
every tool (and the dcgm-exporter service, which re-reads the file) reports the fault.

    opsctl-hw inject FAULT [--gpu G | --hca H]
    opsctl-hw clear
    opsctl-hw sysfs [--link-host]   # write the sysfs tree and the storage files from the state (boot-time service)
    opsctl-hw show           # the state file
    opsctl-hw modprobe NAME  # load a kernel module that a lab package built (opsctl_lab.vendor_repos.kmod)
    opsctl-hw boot           # what the kernel and systemd-modules-load do at a boot (boot-time service)

A boot (`boot`, run by the boot-time service before `sysfs`) starts with no module loaded; the NVIDIA
driver a lab package installed for the running kernel is the one loaded (nvidia-smi and DCGM report its
version); then the modules of modules-load.d are loaded, as systemd-modules-load loads them (which does not
run in a container), and each one that the kernel would refuse is named and makes the exit status 1. A
machine without an installed driver keeps the emulated one (`driver VERSION`).

The kernel log (`kmsg` next to the state file, opsctl_lab.hardware.write_kernel_log) is rewritten from the
state after every command, so an injected xid-kernel fault's XID line is in it.

Storage (opsctl_lab.storage_view): mountinfo and mountstats in the `storage` directory next to the state
file, for `opsctl node check` (storage.mountinfo_path, storage.mountstats_path). The mount points are
under OPSCTL_HW_MOUNT_BASE (default: `mnt` in that directory). In a lab machine it is `/` (the machine's
wrapper sets it): the mount points are the machine's own, and /shared and /lustre are real bind mounts
(`shared.mount`, `lustre.mount`) of `storage/exports/{shared,lustre}`, standing in for the NFS and
Lustre client mounts. `inject mount-missing` stops shared.mount and moves its source away, so it cannot
start again while the fault lasts; `clear` puts the source back and starts it.
"""

import argparse
import fcntl
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from opsctl_lab.errors import LabError
from opsctl_lab.hardware import GPUS_PER_NODE, NodeHardware, kernel_log_path, write_kernel_log
from opsctl_lab.hwtools.common import fresh_sysfs, load, main_guard, state_path
from opsctl_lab.storage_view import MISSING_MOUNT, write_storage
from opsctl_lab.vendor_repos import kmod

# The mounts that are real bind mounts in a lab machine; their sources are `exports/<name>`.
BIND_MOUNTS = ("/shared", "/lustre")
MACHINE_BASE = Path("/")

Systemctl = Callable[[str, str], None]  # (action, mount point)


@contextmanager
def _locked():
    path = state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="opsctl-hw")
    sub = parser.add_subparsers(dest="cmd", required=True)
    inj = sub.add_parser("inject")
    inj.add_argument("fault")
    inj.add_argument("--gpu", type=int)
    inj.add_argument("--hca")
    sub.add_parser("clear")
    sysfs = sub.add_parser("sysfs")
    sysfs.add_argument("--link-host", action="store_true")
    sub.add_parser("show")
    driver = sub.add_parser("driver", help="install and load an emulated NVIDIA driver of this version")
    driver.add_argument("version")
    modprobe = sub.add_parser("modprobe", help="load a kernel module a lab package built, as the kernel would")
    modprobe.add_argument("module")
    sub.add_parser("boot", help="load the installed driver and the modules of modules-load.d, as at a boot")
    args = parser.parse_args(argv)
    if args.cmd == "modprobe":
        return _modprobe(args.module)
    failures: list[str] = []
    with _locked():
        hw = load()
        units: Systemctl | None = None
        if args.cmd == "inject":
            fault = hw.inject(args.fault, gpu=args.gpu, hca=args.hca)
            hw.save(state_path())
            where = f" gpu {fault.gpu}" if fault.gpu is not None else f" {fault.hca}" if fault.hca else ""
            sys.stdout.write(f"{hw.node}: injected {args.fault}{where}\n")
            units = _systemctl if fault.fault == "mount-missing" else None
        elif args.cmd == "clear":
            count = len(hw.active)
            hw.clear()
            hw.save(state_path())
            sys.stdout.write(f"{hw.node}: cleared {count} fault(s)\n")
            units = _systemctl
        elif args.cmd == "driver":
            hw.driver_version = args.version
            hw.save(state_path())
            sys.stdout.write(f"{hw.node}: driver {args.version} loaded\n")
        elif args.cmd == "boot":
            failures = boot(hw, MACHINE_BASE, loaded_modules_dir())
            hw.save(state_path())
            if (loaded_modules_dir() / "nvidia").exists():
                make_gpu_devices(hw, MACHINE_BASE / "dev")
            for line in failures:
                sys.stderr.write(f"{line}\n")
        elif args.cmd == "show":
            sys.stdout.write(json.dumps(asdict(hw), indent=1, sort_keys=True) + "\n")
        root = fresh_sysfs(hw)
        write_kernel_log(kernel_log_path(state_path()), hw)
        base = mount_base()
        apply_storage(hw, storage_root(), base, units if base == MACHINE_BASE else None)
        if args.cmd == "sysfs" and args.link_host:
            link_host_sysfs(root)
    return 1 if failures else 0


def loaded_modules_dir() -> Path:
    """The emulated /sys/module: a directory per module `opsctl-hw modprobe` loaded."""
    return state_path().parent / "modules"


def _modprobe(module: str) -> int:
    try:
        kmod.load(MACHINE_BASE, module, kmod.kernel(), loaded_modules_dir())
    except kmod.LoadError as err:
        sys.stderr.write(f"{err}\n")
        return 1  # modprobe's own exit status for a module it could not insert
    return 0


# systemd-modules-load's directories, first the one whose file wins over a file of the same name after it.
MODULES_LOAD_DIRS = ("etc/modules-load.d", "run/modules-load.d", "usr/lib/modules-load.d", "lib/modules-load.d")


def modules_to_load(root: Path) -> list[str]:
    """The modules of modules-load.d (modules-load.d(5)): the files in name order, a name in an earlier
    directory hiding the same name in a later one; a line each, `#` and `;` start comments."""
    files: dict[str, Path] = {}
    for directory in MODULES_LOAD_DIRS:
        for path in sorted((root / directory).glob("*.conf")):
            files.setdefault(path.name, path)
    names = []
    for _name, path in sorted(files.items()):
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith(("#", ";")) and line not in names:
                names.append(line)
    return names


def boot(hw: NodeHardware, root: Path, loaded: Path, release: str = "") -> list[str]:
    """The kernel's part of a boot: no module loaded, then the installed NVIDIA driver (its version is
    what nvidia-smi reports from now on), then modules-load.d. Returns a line for each module that did
    not load, as systemd-modules-load logs it."""
    shutil.rmtree(loaded, ignore_errors=True)
    loaded.mkdir(parents=True)
    release = release or kmod.kernel()
    failures = []
    driver = kmod.module_path(root, "nvidia", release)
    if driver.exists():
        try:
            hw.driver_version = kmod.load(root, "nvidia", release, loaded).get("version") or hw.driver_version
        except kmod.LoadError as err:
            failures.append(f"nvidia: {err}")
    for name in modules_to_load(root):
        try:
            kmod.load(root, name, release, loaded)
        except kmod.LoadError as err:
            failures.append(f"Failed to insert module '{name}': {err}")
    return failures


NVIDIA_MAJOR = 195  # the NVIDIA driver's character devices: /dev/nvidia<minor>, /dev/nvidiactl at 255
NVIDIACTL_MINOR = 255


def make_gpu_devices(hw: NodeHardware, dev: Path) -> None:
    """The device files the loaded driver makes (nvidia-modprobe, at its load): one per GPU at its minor
    number, and the control device. An emulated node gets them from the nvidia role instead (tmpfiles.d)."""
    for minor in [hw.minor(gpu) for gpu in range(GPUS_PER_NODE)] + [NVIDIACTL_MINOR]:
        path = dev / ("nvidiactl" if minor == NVIDIACTL_MINOR else f"nvidia{minor}")
        if not path.exists():
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, minor))
            os.chmod(path, 0o666)  # mknod applies the umask


def storage_root() -> Path:
    """mountinfo, mountstats and the bind mounts' sources: next to the state file."""
    return state_path().parent / "storage"


def mount_base() -> Path:
    return Path(os.environ.get("OPSCTL_HW_MOUNT_BASE") or storage_root() / "mnt")


def export_dir(root: Path, point: str, hidden: bool = False) -> Path:
    """The source of a bind mount; `hidden`: where it is while its mount is missing."""
    name = point.strip("/")
    return root / "exports" / (f".{name}.mount-missing" if hidden else name)


def mount_unit(point: str) -> str:
    """The unit name of a mount point, as `systemd-escape -p --suffix=mount` makes it."""
    path = point.strip("/")
    out = []
    for index, char in enumerate(path):
        if char == "/":
            out.append("-")
        elif char.isascii() and (char.isalnum() or char in ":_" or (char == "." and index > 0)):
            out.append(char)
        else:
            out += [f"\\x{byte:02x}" for byte in char.encode()]
    return ("".join(out) or "-") + ".mount"


def place_exports(root: Path, hw: NodeHardware) -> None:
    """Each bind mount's source where its unit looks for it; while `mount-missing` lasts, the missing
    mount's source is moved to a hidden name, so its unit cannot mount it."""
    for point in BIND_MOUNTS:
        source, hidden = export_dir(root, point), export_dir(root, point, hidden=True)
        if point == MISSING_MOUNT and hw.node_fault("mount-missing"):
            if source.exists():
                if hidden.exists():
                    shutil.rmtree(hidden)
                source.rename(hidden)
            hidden.mkdir(parents=True, exist_ok=True)
        else:
            if hidden.exists() and not source.exists():
                hidden.rename(source)
            source.mkdir(parents=True, exist_ok=True)


def apply_storage(hw: NodeHardware, root: Path, base: Path, systemctl: Systemctl | None = None) -> None:
    """The storage files, the mount points and the bind mounts' sources as the state says. With
    `systemctl` (in a machine, on inject mount-missing and on clear) the missing mount's unit is stopped
    before its source goes, or started once it is back."""
    missing = hw.node_fault("mount-missing")
    if systemctl and missing:
        systemctl("stop", MISSING_MOUNT)
    place_exports(root, hw)
    write_storage(root, base, hw)
    if systemctl and not missing:
        systemctl("start", MISSING_MOUNT)


def _systemctl(action: str, point: str) -> None:
    unit = mount_unit(point)
    out = subprocess.run(["systemctl", action, unit], capture_output=True, text=True, timeout=120)
    if out.returncode != 0 and action == "stop":
        # Busy (a process works in it): detach it now, as an NFS mount that went away leaves its users.
        subprocess.run(["umount", "--lazy", point], capture_output=True, timeout=60)
        out = subprocess.run(["systemctl", action, unit], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        raise LabError(f"systemctl {action} {unit}: {lines[-1] if lines else f'exit {out.returncode}'}")


def link_host_sysfs(root: Path, host: Path = Path("/sys")) -> None:
    """Make the emulated tree a whole sysfs for node_exporter --path.sysfs: everything but
    class/infiniband links to the machine's real /sys, so the other collectors still see it."""
    for entry in host.iterdir():
        if entry.name != "class":
            _link(root / entry.name, entry)
    for entry in (host / "class").iterdir():
        if entry.name != "infiniband":
            _link(root / "class" / entry.name, entry)


def _link(path: Path, target: Path) -> None:
    if not path.is_symlink() and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)


if __name__ == "__main__":
    sys.exit(main_guard(main))
