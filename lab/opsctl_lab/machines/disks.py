"""The storage machine's disks: sparse image files in its directory, attached as loop devices on this
host and handed to the machine as block devices (systemd-nspawn --bind), where the nfs_server role
prepares them as it would NVMe drives.

    /dev/vdb  512 MiB, blank: the export disk (inventory/lab/group_vars/storage.yml, nfs_server_devices)
    /dev/vdc   32 MiB, an ext4 filesystem with a file on it: a disk that holds data, which the role must
              refuse to touch unless the inventory lists it in nfs_server_wipe_devices

Ganesha's VFS backend opens files by handle (open_by_handle_at), which nspawn's default capability set and
system call filter forbid: the storage machine gets both back, as a real server has them.
"""

import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from opsctl_lab.errors import LabError
from opsctl_lab.machines.settings import STORAGE_MACHINE, Settings

MIB = 1024 * 1024


@dataclass(frozen=True)
class Disk:
    device: str  # the block device's path inside the machine
    size: int
    holds_data: bool = False


DISKS = (Disk("/dev/vdb", 512 * MIB), Disk("/dev/vdc", 32 * MIB, holds_data=True))
DATA_FILE = "results.csv"  # what the data disk holds, so that a wipe would be seen


def _image(settings: Settings, disk: Disk) -> Path:
    return settings.machine_dir(STORAGE_MACHINE) / "disks" / f"{Path(disk.device).name}.img"


def _run(argv: list[str]) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {(result.stderr or result.stdout).strip()}")
    return result.stdout.strip()


def _create(path: Path, disk: Disk) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    with open(partial, "wb") as image:
        image.truncate(disk.size)  # sparse: only what is written takes space
    if disk.holds_data:
        with tempfile.TemporaryDirectory() as content:
            (Path(content) / DATA_FILE).write_text("run,loss\n1,0.25\n")
            _run(["mkfs.ext4", "-q", "-F", "-L", "olddata", "-d", content, str(partial)])
    partial.rename(path)


def _attached(path: Path) -> str | None:
    """The loop device this host has for the image, if any (`losetup -j`)."""
    out = _run(["losetup", "-j", str(path), "-O", "NAME", "-n"])
    return out.splitlines()[0].strip() if out else None


def attach(settings: Settings) -> dict[str, str]:
    """Every disk image made (once) and attached: {device in the machine: loop device on this host}."""
    found = {}
    for disk in DISKS:
        path = _image(settings, disk)
        if not path.exists():
            _create(path, disk)
        found[disk.device] = _attached(path) or _run(["losetup", "--find", "--show", str(path)])
    return found


def nspawn_args(settings: Settings) -> list[str]:
    binds = [f"--bind={loop}:{device}" for device, loop in attach(settings).items()]
    return [*binds, "--capability=CAP_DAC_READ_SEARCH", "--system-call-filter=open_by_handle_at"]


def detach(settings: Settings) -> None:
    """Release the loop devices once the machine is stopped; the images (the disks' contents) stay."""
    for disk in DISKS:
        path = _image(settings, disk)
        loop = _attached(path) if path.exists() else None
        if loop:
            _run(["losetup", "--detach", loop])
