"""A GPU machine's storage mounts: /shared and /lustre are real bind mounts (`shared.mount`, `lustre.mount`)
of `storage/exports/{shared,lustre}` next to the hardware state file, standing in for the NFS and Lustre
client mounts that the lab's kernel cannot make. The machines' hardware install (hwinstall) writes their
units and places their sources before a boot; `opsctl-hw` (hwadmin) moves a source away and stops its unit
while `mount-missing` lasts, and puts it back and starts the unit on clear."""

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from opsctl_lab.errors import LabError
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.storage_view import MISSING_MOUNT, write_storage

# The mounts that are real bind mounts in a lab machine; their sources are `exports/<name>`.
BIND_MOUNTS = ("/shared", "/lustre")

Systemctl = Callable[[str, str], None]  # (action, mount point)


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


def systemctl_mount(action: str, point: str) -> None:
    """`systemctl ACTION` on the mount unit of `point`, in the machine."""
    unit = mount_unit(point)
    out = subprocess.run(["systemctl", action, unit], capture_output=True, text=True, timeout=120)
    if out.returncode != 0 and action == "stop":
        # Busy (a process works in it): detach it now, as an NFS mount that went away leaves its users.
        subprocess.run(["umount", "--lazy", point], capture_output=True, timeout=60)
        out = subprocess.run(["systemctl", action, unit], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        raise LabError(f"systemctl {action} {unit}: {lines[-1] if lines else f'exit {out.returncode}'}")
