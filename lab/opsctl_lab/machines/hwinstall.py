"""What turns a machine into an emulated H200 node: the opsctl hardware code, the tools at the paths
of the real ones, the hardware state file, and the dcgm-exporter service. Written into the machine's
own layer before it boots, from this checkout, so it never depends on the provisioning roles."""

import shutil
from pathlib import Path

import opsctl
import opsctl_lab
from opsctl_lab.hardware import GPUS_PER_NODE, NodeHardware
from opsctl_lab.machines.settings import DCGM_PORT, HW_CODE, HW_STATE, HW_SYSFS_ROOT, REVERSED_MINORS_MACHINE

# Real install paths: nvidia-smi from the NVIDIA driver, ibstat from infiniband-diags, ibv_devinfo
# from ibverbs-utils, ib_write_bw from perftest.
TOOLS = {
    "/usr/bin/nvidia-smi": "opsctl_lab.hwtools.nvidia_smi",
    "/usr/sbin/ibstat": "opsctl_lab.hwtools.ibstat",
    "/usr/bin/ibv_devinfo": "opsctl_lab.hwtools.ibv_devinfo",
    "/usr/bin/ib_write_bw": "opsctl_lab.hwtools.ib_write_bw",
    "/usr/local/sbin/opsctl-hw": "opsctl_lab.hwtools.admin",
}
DCGM_UNIT = "dcgm-exporter.service"
SYSFS_UNIT = "opsctl-hw-sysfs.service"
# The NVIDIA role checks that fabric manager runs. These machines have no NVSwitch to train: the lab's
# unit of that name only runs, so that the check has something real to look at (nvidia_services).
FABRICMANAGER_UNIT = "nvidia-fabricmanager.service"
FABRICMANAGER_UNIT_TEXT = """[Unit]
Description=NVIDIA fabric manager (opsctl lab emulation: no NVSwitch to train)

[Service]
ExecStart=/bin/sleep infinity

[Install]
WantedBy=multi-user.target
"""


def wrapper(module: str) -> str:
    return (f"#!/bin/sh\n# Emulated hardware tool of the opsctl lab (state: {HW_STATE}).\n"
            f"PYTHONPATH={HW_CODE} exec /usr/bin/python3 -m {module} \"$@\"\n")


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
Description=opsctl lab: write the emulated InfiniBand sysfs tree under {HW_SYSFS_ROOT}
Before=dcgm-exporter.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/opsctl-hw sysfs --link-host

[Install]
WantedBy=multi-user.target
"""


def install(upper: Path, name: str, address: str) -> None:
    code = upper / HW_CODE.lstrip("/")
    shutil.rmtree(code, ignore_errors=True)
    # The emulated tools are opsctl_lab modules; they need opsctl for its error types only.
    for package in (opsctl, opsctl_lab):
        source = Path(package.__file__).parent
        shutil.copytree(source, code / source.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "templates"))
    for path, module in TOOLS.items():
        target = upper / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(wrapper(module))
        target.chmod(0o755)
    state = upper / HW_STATE.lstrip("/")
    # Keep injected faults across a restart, as hardware would; the minor numbers are the machine's own.
    hw = NodeHardware.load(state, name)
    minors = list(reversed(range(GPUS_PER_NODE))) if name == REVERSED_MINORS_MACHINE else None
    if not state.exists() or hw.minors != minors:
        hw.minors = minors
        hw.save(state)
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
    for unit in mine:
        link = wants / unit
        link.unlink(missing_ok=True)
        link.symlink_to(f"/etc/systemd/system/{unit}")
