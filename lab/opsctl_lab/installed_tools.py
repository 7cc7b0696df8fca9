"""The emulated hardware as a lab machine has it: the state file, the sysfs tree and the kernel log under
HW_ROOT, the code the tools run (a copy of opsctl and opsctl_lab), and each emulated tool at the real tool's
path as a wrapper script that runs its module. The machines' hardware install writes every wrapper
(opsctl_lab.machines.hwinstall); a lab package installs the ones its real package ships
(opsctl_lab.vendor_repos.behaviours). The provisioning roles point at these paths (docs/lab-machines.md)."""

from opsctl_lab.hung_mount import STAYS_ENV

HW_ROOT = "/var/lib/opsctl-hw"
HW_STATE = f"{HW_ROOT}/hardware.json"
HW_SYSFS_ROOT = f"{HW_ROOT}/sys"
# The machine's kernel log, /dev/kmsg records one a line (`opsctl node check`'s gpu.kernel_log_path): the NVIDIA
# driver's XID lines of the xid-kernel fault (opsctl_lab.hardware.write_kernel_log), next to the state file.
HW_KERNEL_LOG = f"{HW_ROOT}/kmsg"
HW_CODE = "/opt/opsctl-hw"
# The InfiniBand fabric every machine is cabled to (opsctl_lab.fabric): one host directory bound into the GPU
# machines and the head. The lab writes fabric.json (its nodes and faults); each GPU machine's `opsctl-hw`
# publishes its hardware state to nodes/<name>.json, which the emulated ibnetdiscover reads.
HW_FABRIC = f"{HW_ROOT}/fabric"
HW_FABRIC_STATE = f"{HW_FABRIC}/fabric.json"
HW_FABRIC_NODES = f"{HW_FABRIC}/nodes"

# Real install paths: nvidia-smi from the NVIDIA driver, dcgmi from datacenter-gpu-manager, ibstat and
# ibnetdiscover from infiniband-diags, ibv_devinfo from ibverbs-utils, ib_write_bw from perftest, lctl, lfs and
# lnetctl from the Lustre client, all_reduce_perf where nccl-tests builds it (as Azure's health checks install it).
ADMIN_TOOL = "/usr/local/sbin/opsctl-hw"
# opsctl-hw writes the mount points of the machine itself (storage_view with base /), and the hung /home of
# nfs-hung outlives it (opsctl_lab.hung_mount): it lasts until clear, as the fault does.
ADMIN_ENV = f"OPSCTL_HW_MOUNT_BASE=/ {STAYS_ENV}=1 "
TOOLS = {
    "/usr/bin/nvidia-smi": "opsctl_lab.hwtools.nvidia_smi",
    "/usr/bin/dcgmi": "opsctl_lab.hwtools.dcgmi",
    "/usr/sbin/ibstat": "opsctl_lab.hwtools.ibstat",
    "/usr/sbin/ibnetdiscover": "opsctl_lab.hwtools.ibnetdiscover",
    "/usr/bin/ibv_devinfo": "opsctl_lab.hwtools.ibv_devinfo",
    "/usr/bin/ib_write_bw": "opsctl_lab.hwtools.ib_write_bw",
    "/opt/nccl-tests/build/all_reduce_perf": "opsctl_lab.hwtools.all_reduce_perf",
    "/usr/sbin/lctl": "opsctl_lab.hwtools.lctl",
    "/usr/bin/lfs": "opsctl_lab.hwtools.lfs",
    "/usr/sbin/lnetctl": "opsctl_lab.hwtools.lnetctl",
    ADMIN_TOOL: "opsctl_lab.hwtools.admin",
}
# The head has no emulated GPUs, but an HCA on every rail (opsctl_lab.fabric): the fabric's tool only.
HEAD_TOOLS = ["/usr/sbin/ibnetdiscover"]


def wrapper(module: str, env: str = "") -> str:
    return (f"#!/bin/sh\n# Emulated hardware tool of the opsctl lab (state: {HW_STATE}).\n"
            f"{env}PYTHONPATH={HW_CODE} exec /usr/bin/python3 -m {module} \"$@\"\n")


def tool_wrapper(path: str) -> str:
    """The wrapper script at the real tool's `path`."""
    return wrapper(TOOLS[path], ADMIN_ENV if path == ADMIN_TOOL else "")
