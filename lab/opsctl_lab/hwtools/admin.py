"""`opsctl-hw`: the lab's hand on a machine's emulated hardware (what `opsctl lab machines inject`
runs over SSH). Changes the state file and rewrites the sysfs tree and the storage files at once, so
every tool (and the dcgm-exporter service, which re-reads the file) reports the fault.

    opsctl-hw inject FAULT [--gpu G | --hca H]
    opsctl-hw clear
    opsctl-hw sysfs [--link-host]   # write the sysfs tree and the storage files from the state (boot-time service)
    opsctl-hw show           # the state file
    opsctl-hw modprobe NAME  # load a kernel module that a lab package built (opsctl_lab.vendor_repos.kmod)
    opsctl-hw boot           # what the kernel and systemd-modules-load do at a boot (boot-time service)
    opsctl-hw fabricmanager  # Fabric Manager starts: the fabric trains (nvidia-fabricmanager's ExecStartPre)
    opsctl-hw fabric-training SECONDS   # how long the fabric takes to train

A boot (`boot`, run by the boot-time service before `sysfs`; opsctl_lab.machines.boot) loads the installed
NVIDIA driver and the modules of modules-load.d; each module that the kernel would refuse is named and makes
the exit status 1. A machine without an installed driver keeps the emulated one (`driver VERSION`). A boot
after a reboot (the machine's supervisor left its marker) is a reboot of the board: the faults a reboot ends
end, each named on stdout. Every boot leaves the fabric Not Started until `fabricmanager` runs; it then trains
for the node's training time (Not Started for its first quarter, then In Progress, then Completed).

The kernel log (`kmsg` next to the state file, opsctl_lab.hardware.write_kernel_log) is rewritten from the
state after every command, so an injected xid-kernel fault's XID line is in it.

Storage (opsctl_lab.storage_view): mountinfo and mountstats in the `storage` directory next to the state
file, for `opsctl node check` (storage.mountinfo_path, storage.mountstats_path). The mount points are
under OPSCTL_HW_MOUNT_BASE (default: `mnt` in that directory). In a lab machine it is `/` (the machine's
wrapper sets it): the mount points are the machine's own, and /shared and /lustre are real bind mounts
(`shared.mount`, `lustre.mount`) of `storage/exports/{shared,lustre}`, standing in for the NFS and
Lustre client mounts (opsctl_lab.machines.storage_mounts). `inject mount-missing` stops shared.mount and
moves its source away, so it cannot start again while the fault lasts; `clear` puts the source back and
starts it.
"""

import argparse
import fcntl
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from opsctl_lab.hardware import fault_label, kernel_log_path, write_kernel_log
from opsctl_lab.hwtools.common import fresh_sysfs, load, main_guard, state_path
from opsctl_lab.machines import boot, storage_mounts
from opsctl_lab.machines.fabric_cabling import publish

# The machine's root: where a boot finds the installed driver and modules-load.d, and its device files go.
# OPSCTL_HW_MACHINE_ROOT moves it (a test's directory, so that a boot there never reads this host's files).
MACHINE_BASE = Path(os.environ.get("OPSCTL_HW_MACHINE_ROOT") or "/")


@contextmanager
def _locked() -> Iterator[None]:
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
    sub.add_parser("fabricmanager", help="Fabric Manager starts: every GPU's fabric trains from now")
    training = sub.add_parser("fabric-training", help="how long the fabric takes to train, in seconds")
    training.add_argument("seconds", type=training_seconds)
    args = parser.parse_args(argv)
    if args.cmd == "modprobe":
        return boot.modprobe(MACHINE_BASE, args.module, loaded_modules_dir())
    failures: list[str] = []
    with _locked():
        hw = load()
        units: storage_mounts.Systemctl | None = None
        if args.cmd == "inject":
            fault = hw.inject(args.fault, gpu=args.gpu, hca=args.hca)
            hw.save(state_path())
            where = f" gpu {fault.gpu}" if fault.gpu is not None else f" {fault.hca}" if fault.hca else ""
            sys.stdout.write(f"{hw.node}: injected {args.fault}{where}\n")
            units = storage_mounts.systemctl_mount if fault.fault == "mount-missing" else None
        elif args.cmd == "clear":
            count = len(hw.active)
            hw.clear()
            hw.save(state_path())
            sys.stdout.write(f"{hw.node}: cleared {count} fault(s)\n")
            units = storage_mounts.systemctl_mount
        elif args.cmd == "driver":
            hw.driver_version = args.version
            hw.save(state_path())
            sys.stdout.write(f"{hw.node}: driver {args.version} loaded\n")
        elif args.cmd == "boot":
            marker = boot.reboot_marker(state_path())
            rebooted = marker.exists()
            ended = boot.start_board(hw, rebooted)
            failures = boot.boot(hw, MACHINE_BASE, loaded_modules_dir())
            hw.save(state_path())
            boot.forget_reboot(marker)
            if rebooted:
                sys.stdout.write(f"{hw.node}: rebooted; faults ended: "
                                 f"{', '.join(map(fault_label, ended)) or 'none'}\n")
            if (loaded_modules_dir() / "nvidia").exists():
                boot.make_gpu_devices(hw, MACHINE_BASE / "dev")
            for line in failures:
                sys.stderr.write(f"{line}\n")
        elif args.cmd == "fabricmanager":
            hw.start_fabric_manager()
            hw.save(state_path())
            sys.stdout.write(f"{hw.node}: Fabric Manager started; the fabric trains for {hw.fabric_training_s:g} s\n")
        elif args.cmd == "fabric-training":
            hw.fabric_training_s = args.seconds
            hw.save(state_path())
            sys.stdout.write(f"{hw.node}: the fabric trains for {args.seconds:g} s\n")
        elif args.cmd == "show":
            sys.stdout.write(json.dumps(asdict(hw), indent=1, sort_keys=True) + "\n")
        root = fresh_sysfs(hw)
        write_kernel_log(kernel_log_path(state_path()), hw)
        if fabric_dir().is_dir():  # a lab machine: the fabric's other hosts see its cabling (ibnetdiscover)
            publish(fabric_dir() / "nodes", hw)
        base = mount_base()
        storage_mounts.apply_storage(hw, storage_root(), base, units if base == MACHINE_BASE else None)
        if args.cmd == "sysfs" and args.link_host:
            link_host_sysfs(root)
    return 1 if failures else 0


def training_seconds(text: str) -> float:
    """A training time: a number of seconds, 0 or more (0: the fabric is trained as soon as Fabric Manager starts)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (0 or more)")
    return seconds


def fabric_dir() -> Path:
    """The fabric's directory, next to the state file (HW_FABRIC in a lab machine: machines.fabric_cabling)."""
    return state_path().parent / "fabric"


def loaded_modules_dir() -> Path:
    """The emulated /sys/module: a directory per module `opsctl-hw modprobe` loaded."""
    return state_path().parent / "modules"


def storage_root() -> Path:
    """mountinfo, mountstats and the bind mounts' sources: next to the state file."""
    return state_path().parent / "storage"


def mount_base() -> Path:
    return Path(os.environ.get("OPSCTL_HW_MOUNT_BASE") or storage_root() / "mnt")


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
