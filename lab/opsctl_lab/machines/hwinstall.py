"""What turns a machine into an emulated H200 node: the opsctl hardware code, the tools at the paths
of the real ones, the hardware state file, the dcgm-exporter service, and the node's storage (the
emulated mountinfo and mountstats, and the bind mounts that stand in for its NFS and Lustre client
mounts). Written into the machine's own layer before it boots, from this checkout, so it never depends
on the provisioning roles."""

import shutil
from pathlib import Path

import opsctl
import opsctl_lab
from opsctl_lab.hardware import GPUS_PER_NODE, NodeHardware
from opsctl_lab.installed_tools import (
    ADMIN_TOOL,
    HEAD_TOOLS,
    HW_CODE,
    HW_ROOT,
    HW_STATE,
    HW_SYSFS_ROOT,
    TOOLS,
    tool_wrapper,
)
from opsctl_lab.machines.settings import DCGM_PORT, REVERSED_MINORS_MACHINE
from opsctl_lab.machines.storage_mounts import BIND_MOUNTS, export_dir, mount_unit, place_exports
from opsctl_lab.storage_view import MOUNTS

# The node's storage as `opsctl node check` reads it (storage.mountinfo_path, storage.mountstats_path):
# written by `opsctl-hw` at boot and on every inject and clear. The mount points are the machine's own
# (/home, /shared, /lustre); /shared and /lustre are bind mounts of EXPORTS/<name>.
STORAGE_ROOT = f"{HW_ROOT}/storage"
MOUNTINFO = f"{STORAGE_ROOT}/mountinfo"
MOUNTSTATS = f"{STORAGE_ROOT}/mountstats"
EXPORTS = f"{STORAGE_ROOT}/exports"
MOUNT_UNITS = {point: mount_unit(point) for point in BIND_MOUNTS}  # /shared: shared.mount
DCGM_UNIT = "dcgm-exporter.service"
SYSFS_UNIT = "opsctl-hw-sysfs.service"
# The NVIDIA role checks that fabric manager runs. These machines have no NVSwitch to train: the lab's
# unit of that name only runs, so that the check has something real to look at (nvidia_services). Its start
# is what starts the emulated fabric's training, as the real Fabric Manager's is on an HGX board: after the
# boot-time unit, whose `opsctl-hw boot` leaves the fabric Not Started, records that it starts.
FABRICMANAGER_UNIT = "nvidia-fabricmanager.service"
FABRICMANAGER_UNIT_TEXT = f"""[Unit]
Description=NVIDIA fabric manager (opsctl lab emulation: no NVSwitch to train)
After={SYSFS_UNIT}

[Service]
ExecStartPre={ADMIN_TOOL} fabricmanager
ExecStart=/bin/sleep infinity

[Install]
WantedBy=multi-user.target
"""


def mount_unit_text(point: str) -> str:
    """A bind mount of the export directory onto the mount point, in place of the client mount that
    the lab's kernel cannot make (it has neither an NFS nor a Lustre client). systemd makes a missing
    bind source before it mounts; the assertion comes first, so that a source moved away (mount-missing)
    fails the start, as an unreachable server does."""
    mount = next(m for m in MOUNTS if m.point == point)
    kind = "Lustre" if mount.fstype == "lustre" else "NFS"
    source = export_dir(Path(STORAGE_ROOT), point)
    return f"""[Unit]
Description={point} (opsctl lab: a bind mount standing in for the {kind} client mount of {mount.source})
AssertPathIsDirectory={source}

[Mount]
What={source}
Where={point}
Type=none
Options=bind

[Install]
WantedBy=remote-fs.target
"""


def dcgm_unit(name: str, address: str) -> str:
    return f"""[Unit]
Description=dcgm-exporter (opsctl lab emulator of {name}'s 8 H200 GPUs)
After=network.target

[Service]
Environment=PYTHONPATH={HW_CODE}
ExecStart=/usr/bin/python3 -m opsctl_lab.dcgm_emulator --listen {address}:{DCGM_PORT} --node {name} \
--state {HW_STATE} --sysfs-root {HW_SYSFS_ROOT}
Restart=on-failure
RestartSec=2

[Install]
WantedBy=multi-user.target
"""


SYSFS_UNIT_TEXT = f"""[Unit]
Description=opsctl lab: write the emulated InfiniBand sysfs tree under {HW_SYSFS_ROOT} and the storage files under \
{STORAGE_ROOT}
Before=dcgm-exporter.service

[Service]
Type=oneshot
RemainAfterExit=yes
# The kernel's part of the boot first (`-`: a module that does not load fails the boot's module loading,
# as in systemd-modules-load, not the machine's hardware files).
ExecStartPre=-/usr/local/sbin/opsctl-hw boot
ExecStart=/usr/local/sbin/opsctl-hw sysfs --link-host

[Install]
WantedBy=multi-user.target
"""


def _install_tools(upper: Path, paths: list[str]) -> None:
    code = upper / HW_CODE.lstrip("/")
    shutil.rmtree(code, ignore_errors=True)
    # The emulated tools are opsctl_lab modules; they need opsctl for its error types only.
    for package in (opsctl, opsctl_lab):
        source = Path(package.__path__[0])
        shutil.copytree(source, code / source.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "templates"))
    for path in paths:
        target = upper / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(tool_wrapper(path))
        target.chmod(0o755)


def install_head(upper: Path) -> None:
    """The head's tools: ibnetdiscover of the fabric its HCAs are cabled to (opsctl_lab.fabric)."""
    _install_tools(upper, HEAD_TOOLS)


def set_fabric_training(state: Path, name: str, seconds: float) -> NodeHardware:
    """How long the machine's fabric trains after Fabric Manager starts (the lab's setting,
    Settings.fabric_training_s), into its state before it boots: the setting of each `up` that starts the machine
    wins over an earlier `opsctl-hw fabric-training`. Returns the state."""
    hw = NodeHardware.load(state, name)
    if not state.exists() or hw.fabric_training_s != seconds:
        hw.fabric_training_s = seconds
        hw.save(state)
    return hw


def install(upper: Path, name: str, address: str) -> None:
    _install_tools(upper, list(TOOLS))
    state = upper / HW_STATE.lstrip("/")
    # Keep injected faults across a restart, as hardware would; the minor numbers are the machine's own.
    hw = NodeHardware.load(state, name)
    minors = list(reversed(range(GPUS_PER_NODE))) if name == REVERSED_MINORS_MACHINE else None
    if not state.exists() or hw.minors != minors:
        hw.minors = minors
        hw.save(state)
    # The bind mounts' sources as the state says: under mount-missing, shared.mount cannot mount at boot.
    place_exports(upper / STORAGE_ROOT.lstrip("/"), hw)
    units = upper / "etc/systemd/system"
    wants = units / "multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    mine = [SYSFS_UNIT]
    (units / SYSFS_UNIT).write_text(SYSFS_UNIT_TEXT)
    (units / FABRICMANAGER_UNIT).write_text(FABRICMANAGER_UNIT_TEXT)  # enabled by provisioning, as a package's
    # Once provisioning has written its own dcgm-exporter unit, keep it: restarting a machine must not
    # undo what the playbooks did (their next run would report a change).
    if not (units / DCGM_UNIT).exists():
        (units / DCGM_UNIT).write_text(dcgm_unit(name, address))
        mine.append(DCGM_UNIT)
    links = [(wants, unit) for unit in mine]
    remote_wants = units / "remote-fs.target.wants"
    remote_wants.mkdir(parents=True, exist_ok=True)
    for point, unit in MOUNT_UNITS.items():
        (units / unit).write_text(mount_unit_text(point))
        links.append((remote_wants, unit))
    for directory, unit in links:
        link = directory / unit
        link.unlink(missing_ok=True)
        link.symlink_to(f"/etc/systemd/system/{unit}")
