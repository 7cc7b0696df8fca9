"""What the kernel and systemd-modules-load do when a GPU machine boots, and what a module load does
(`opsctl-hw boot` and `opsctl-hw modprobe`, run in the machine; hwadmin).

A boot starts with no module loaded; the NVIDIA driver a lab package installed for the running kernel is
the one loaded (nvidia-smi and DCGM report its version); then the modules of modules-load.d are loaded, as
systemd-modules-load loads them (which does not run in a container), and each one that the kernel would
refuse is named. A machine without an installed driver keeps the emulated one. Loading the driver makes its
device nodes. Which module loads is opsctl_lab.vendor_repos.kmod's: the lab's packages build the modules.

The board boots too (`start_board`). After a reboot (`reboot` in the machine: the machine's supervisor on the
host saw nspawn's exit status 133 and left a marker next to the state file, supervise.py) it is a reboot of the
board: the faults that a reboot ends end and the kernel log starts again (NodeHardware.reboot). After the lab
stopped the machine (`opsctl lab machines down`, then `up`) every fault stays, as on a node powered off and on
whose faults are in its hardware. Either way Fabric Manager has not started yet: the fabric trains once the
machine's nvidia-fabricmanager unit starts (`opsctl-hw fabricmanager`)."""

import os
import shutil
import stat
import sys
from pathlib import Path

from opsctl_lab.hardware import GPUS_PER_NODE, ActiveFault, NodeHardware
from opsctl_lab.vendor_repos import kmod

# systemd-modules-load's directories, first the one whose file wins over a file of the same name after it.
MODULES_LOAD_DIRS = ("etc/modules-load.d", "run/modules-load.d", "usr/lib/modules-load.d", "lib/modules-load.d")


def modules_to_load(root: Path) -> list[str]:
    """The modules of modules-load.d (modules-load.d(5)): the files in name order, a name in an earlier
    directory hiding the same name in a later one; a line each, `#` and `;` start comments."""
    files: dict[str, Path] = {}
    for directory in MODULES_LOAD_DIRS:
        for path in sorted((root / directory).glob("*.conf")):
            files.setdefault(path.name, path)
    names: list[str] = []
    for _name, path in sorted(files.items()):
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith(("#", ";")) and line not in names:
                names.append(line)
    return names


def modprobe(root: Path, module: str, loaded: Path) -> int:
    """`modprobe MODULE` against the running kernel; `loaded` is the emulated /sys/module. Returns
    modprobe's exit status, its error on stderr."""
    try:
        kmod.load(root, module, kmod.kernel(), loaded)
    except kmod.LoadError as err:
        sys.stderr.write(f"{err}\n")
        return 1  # modprobe's own exit status for a module it could not insert
    return 0


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


# The supervisor's word that the machine rebooted, next to the state file (in the machine's layer on the host).
REBOOT_MARKER_NAME = "rebooted"


def reboot_marker(state: Path) -> Path:
    """Where the machine's supervisor says the machine rebooted, given its state file."""
    return Path(state).parent / REBOOT_MARKER_NAME


def start_board(hw: NodeHardware, rebooted: bool, now: float | None = None) -> list[ActiveFault]:
    """The board's part of a boot: after a reboot (the supervisor's marker) a reboot of the board, whose ended
    faults it returns; after the lab stopped the machine, every fault stays. Fabric Manager has not started
    either way. The caller removes the marker only once the state is saved (forget_reboot): a boot that stops
    before then takes the reboot again."""
    ended = hw.reboot(now) if rebooted else []
    hw.stop_fabric_manager()
    return ended


def forget_reboot(marker: Path) -> None:
    marker.unlink(missing_ok=True)


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
