"""The emulated hardware of one lab node: 8 H200 GPUs and 8 ConnectX-7 NDR HCAs plus one Ethernet
storage port, and the faults injected into them.

One JSON file per node holds the injected faults (`NodeHardware.load/save`). Every emulated tool
(the dcgm-exporter emulator, the sysfs InfiniBand tree that the real node_exporter reads, and in the
lab machines nvidia-smi, ibstat, ib_write_bw) renders from this one model, so they always agree.

Counters only go up. A fault that makes a counter rise adds `rate * seconds active`; clearing the
fault folds what it added into `accum`, so the counter keeps its value and its rate returns to 0.
"""

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from opsctl_lab.errors import LabError
from opsctl_lab.hca_layout import GPU_BUSES, HcaLayout
from opsctl_lab.hca_layout import layout as hca_layout

GPUS_PER_NODE = 8
GPU_MODEL = "NVIDIA H200"
DRIVER_VERSION = "570.133.20"
# What `driver-drift` shows: the same branch's next release (the lab's repository has both), as a node that a
# rollout upgraded and nothing rolled back would run.
DRIVER_DRIFT_VERSION = "570.172.08"
# nvidia-smi -q on a real H200 (tests/fixtures/gpu/nvidia-smi_q_and_query-gpu_csv_H200_1gpu.txt):
# Total 143771 MiB, Reserved 614 MiB; power limit 700 W.
# VBIOS Version and Inforom Image Version: 96.00.A5.00.03 and G520.0280.02.02. `vbios-drift` flashes a GPU to
# another VBIOS (the H100's 96.00.89.00.01, one a board swapped from another system might carry).
VBIOS_VERSION = "96.00.A5.00.03"
VBIOS_DRIFT_VERSION = "96.00.89.00.01"
INFOROM_IMAGE_VERSION = "G520.0280.02.02"
# Compute modes: DCGM's DCGM_FI_DEV_COMPUTE_MODE (field 65) values (dcgm_structs.h DCGM_CONFIG_COMPUTEMODE_*)
# and nvidia-smi's words for them (-q "Compute Mode", --query-gpu=compute_mode). `compute-exclusive` is what
# `nvidia-smi -c EXCLUSIVE_PROCESS` leaves: one process at a time may hold a CUDA context on the GPU.
COMPUTE_MODES = {0: "Default", 1: "Prohibited", 2: "Exclusive_Process"}
COMPUTE_MODE_EXCLUSIVE_PROCESS = 2
FB_TOTAL_MIB = 143771
FB_RESERVED_MIB = 614
POWER_LIMIT_W = 700.0
# Eight compute rails (ConnectX-7, MT4129, NDR) and one Ethernet storage port (BlueField-3, MT41692),
# as in gpud's sys-class-infiniband-h100 fixture.
COMPUTE_HCAS = [f"mlx5_{i}" for i in range(8)]
STORAGE_HCA = "mlx5_bond_0"
ALL_HCAS = COMPUTE_HCAS + [STORAGE_HCA]
HCA_FW = "28.41.1000"
HCA_FW_MISMATCH = "28.39.1002"
STORAGE_FW = "32.41.1000"
# Where the HCAs sit in the PCIe tree (one rail per GPU's PCIe switch) is opsctl_lab.hca_layout; their link:
PCIE_GEN5 = "32.0 GT/s PCIe"
NDR_RATE = "400 Gb/sec (4X NDR)"
NDR_DEGRADED_RATE = "200 Gb/sec (2X NDR)"
STORAGE_RATE = "200 Gb/sec (4X HDR)"

# DCGM clock event reason bits (dcgm_fields.h DCGM_CLOCKS_EVENT_REASON_*).
CLOCK_EVENT_GPU_IDLE = 0x1
CLOCK_EVENT_SW_POWER_CAP = 0x4
CLOCK_EVENT_HW_SLOWDOWN = 0x8
CLOCK_EVENT_SW_THERMAL = 0x20
CLOCK_EVENT_HW_THERMAL = 0x40
CLOCK_EVENT_HW_POWER_BRAKE = 0x80
# The `clock-slowdown:<reason>` fault's reasons and their bits. A hardware slowdown shows under load: the
# GPU is busy (100 % utilisation) at a lower SM clock while the fault lasts.
CLOCK_SLOWDOWNS = {"hw-slowdown": CLOCK_EVENT_HW_SLOWDOWN,
                   "hw-thermal": CLOCK_EVENT_HW_SLOWDOWN | CLOCK_EVENT_HW_THERMAL,
                   "power-brake": CLOCK_EVENT_HW_SLOWDOWN | CLOCK_EVENT_HW_POWER_BRAKE,
                   "sw-thermal": CLOCK_EVENT_SW_THERMAL}
# The GPU's PCIe link (an HGX H200 holds Gen5 x16, idle or busy: the real nvidia-smi -q capture).
PCIE_GPU_GEN = 5
PCIE_GPU_WIDTH = 16
PCIE_GPU_DOWNTRAINED_WIDTH = 8
SM_CLOCK_MHZ = 1980
SLOWED_SM_CLOCK_MHZ = 1155
# What `slow-gpu` holds the GPU's SM clock at: a power cap (SW_POWER_CAP), a reason the health catalog leaves
# alone (a site may set one), so only the job it slows shows it: its step takes SLOW_GPU_STEP_FACTOR as long.
SLOW_GPU_SM_CLOCK_MHZ = 1200
SLOW_GPU_STEP_FACTOR = 1.6
# NVLink 4 on an HGX H200: 18 links a GPU, each at 26.562 GB/s as `nvidia-smi nvlink -s` prints it; a link that
# trained at half its speed (`nvlink-degraded`) prints 13.281 GB/s.
NVLINKS_PER_GPU = 18
NVLINK_SPEED_GBPS = 26.562
NVLINK_DEGRADED_SPEED_GBPS = 13.281

# DCGM_FI_DEV_FABRIC_MANAGER_STATUS (field 170), a dcgmFabricManagerStatus_t (NVIDIA/go-dcgm @ 7c92211ba301,
# the release dcgm-exporter 4.1.3 builds with: pkg/dcgm/dcgm_structs.h): the GPU's NVML fabric state, Success
# once Fabric Manager has trained it. With Fabric Manager down a GPU stays "In Progress" (NVIDIA/NVSentinel
# issue 889: "fabric.state stays In Progress indefinitely").
FABRIC_NOT_STARTED = 1
FABRIC_IN_PROGRESS = 2
FABRIC_SUCCESS = 3
# How the fabric state reads, by that status: nvidia-smi -q's Fabric "State" (the real H200 capture,
# tests/fixtures/gpu/nvidia-smi_q_and_query-gpu_csv_H200_1gpu.txt, prints "Completed"/"Success").
FABRIC_STATES = {FABRIC_NOT_STARTED: "Not Started", FABRIC_IN_PROGRESS: "In Progress", FABRIC_SUCCESS: "Completed"}
# DCGM's host engine (the datacenter-gpu-manager package's unit) and the exporter that reads it, as the
# dcgm_exporter role runs them: each an NVML client that holds every GPU of the node while it runs.
MONITORING_SERVICES = ("nvidia-dcgm", "dcgm-exporter")
# How long Fabric Manager takes to train a GPU's fabric after the node boots (a lab machine: after its Fabric
# Manager starts) or the GPU is reset: Not Started for the first quarter (the driver loads, Fabric Manager starts),
# In Progress for the rest. A real HGX board takes about a minute; the simulated lab's node a few seconds, so that
# every ladder test meets the wait without sitting in it. NodeHardware.fabric_training_s holds a node's own (a test
# sets it longer; the lab machines take OPSCTL_LAB_FABRIC_TRAINING_S, a minute unless set).
FABRIC_TRAINING_S = 4.0
# NodeHardware.fabric_manager_since of a node that runs no Fabric Manager of its own (the simulated lab, and a state
# file from before the field): the fabric trains from the boot, as if Fabric Manager started with it.
FABRIC_MANAGER_WITH_BOOT = 0.0

# XID messages as dcgm-exporter puts them in err_msg (NVIDIA XID catalog wording, shortened).
XID_MESSAGES = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double Bit ECC Error",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "NVDEC0 Exception",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    110: "Security Fault Error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
    136: "Link training failed",
    140: "Unrecovered ECC Error",
    154: "GPU recovery action changed",
    155: "NVLink SW defined error",
}
XID_WINDOW_MS = 300000
# The faults that take an XID code (`xid:79`): `xid` shows in DCGM (the lab writes no kernel log line for
# it), `xid-kernel` in the node's kernel log only.
XID_FAULTS = ("xid", "xid-kernel")
# The NVSwitch driver's SXid line each SXid fault writes to the node's kernel log (priority 3, KERN_ERR, as the
# XIDs'): one fatal, one non-fatal, as gpud's SXid tests have them (tests/fixtures/kmsg/gpud_sxid_kmsg_test_lines.txt).
SXID_LINES = {"sxid-fatal": "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up",
              "sxid-nonfatal": "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress "
                               "non-posted PRIV error (First)"}
# The faults that take a rail (`recable-leaf:3`): a cable of the node's rail-3 HCA moved (opsctl_lab.fabric).
RAIL_FAULTS = ("recable-leaf", "recable-rail")
RAILS = 8
# The emulated node's boot, unless `reboot` moved it: the origin of the dcgm-exporter emulator's
# time-driven counters (its COUNTER_EPOCH) and of the kernel log's microseconds since boot.
EMULATED_BOOT = 1_750_000_000.0
# The kernel log (/dev/kmsg records, one a line) lives next to the state file, as the storage files do.
KERNEL_LOG_NAME = "kmsg"
# A leftover (dead job) process on a GPU: its pid and name, as nvidia-smi and the kernel log show them.
LEFTOVER_PID_BASE = 41000
LEFTOVER_PROCESS = "python3"


@dataclass(frozen=True)
class FaultSpec:
    """What a fault does. `target` says what --gpu/--hca addresses; `rates` are per-second rises of
    counters, `steps` one-time rises at injection; keys are `<metric>` names of the emulators."""

    name: str
    # "gpu", "hca" or "node"; "rail": a node's fault on one rail, named by its argument (`recable-leaf:3`);
    # "fabric": a fault of the InfiniBand fabric itself, injected on `fabric` (opsctl_lab.fabric).
    target: str
    summary: str
    rates: dict[str, float] = field(default_factory=dict)
    steps: dict[str, float] = field(default_factory=dict)
    machines_only: bool = False
    simulated_only: bool = False  # the lab machines do not emulate what it changes (yet)
    # Whether the fault outlives a GPU reset (`nvidia-smi -r`, NodeHardware.reset_gpu) and a reboot
    # (NodeHardware.reboot). False: it lives in the GPU's volatile state, which both start again: an XID's
    # aftermath, volatile ECC errors, link and PCIe errors still rising, a row remap waiting for the reset
    # that applies it (the remapped row stays counted). True: it is in the GPU's memory or InfoROM (a failed
    # remap, rows already remapped), or outside the GPU (heat, the HCAs, the node's services).
    survives_reset: bool = True
    # A reboot also ends every process (a leftover one) and a hung GPU's state.
    survives_reboot: bool = True
    # What sees it: catalog rule ids (`xid-<code>`: the rule of the XID's code, or its family), or one of
    # opsctl_lab.fault_matrix.DETECTORS, the checks outside the catalog. docs/health.md's fault matrix.
    seen_by: tuple[str, ...] = ()


class _Survives(TypedDict):
    survives_reset: bool
    survives_reboot: bool


_VOLATILE: _Survives = {"survives_reset": False, "survives_reboot": False}
FAULTS = {
    spec.name: spec
    for spec in [
        FaultSpec("xid", "gpu", "xid:<code>: the GPU reports XID <code> (last-XID gauge and windowed count)",
                  **_VOLATILE, seen_by=("xid-<code>",)),
        # NVIDIA/DCGM issue 235: XID 62 reached the kernel log but never DCGM.
        FaultSpec("xid-kernel", "gpu", "xid-kernel:<code>: XID <code> in the node's kernel log only, never in DCGM",
                  **_VOLATILE, seen_by=("xid-<code>",)),
        FaultSpec("dbe", "gpu", "a new volatile double-bit ECC error",
                  rates={"ecc_dbe_vol": 0.05}, steps={"ecc_dbe_vol": 1}, **_VOLATILE, seen_by=("ecc-dbe-new",)),
        FaultSpec("sbe-storm", "gpu", "volatile single-bit ECC errors rising fast", rates={"ecc_sbe_vol": 50.0},
                  **_VOLATILE, seen_by=("sbe-storm",)),
        FaultSpec("row-remap-failure", "gpu", "row remapping failed", steps={"uncorrectable_remapped_rows": 1},
                  seen_by=("row-remap-failure",)),
        FaultSpec("row-remap-pending", "gpu", "a row remap waits for a GPU reset",
                  steps={"uncorrectable_remapped_rows": 1}, **_VOLATILE, seen_by=("row-remap-pending",)),
        FaultSpec("remapped-rows", "gpu", "9 rows remapped for uncorrectable errors (an RMA case)",
                  steps={"uncorrectable_remapped_rows": 9}, seen_by=("remapped-rows-high",)),
        FaultSpec("gpu-missing", "gpu", "the GPU fell off the bus: its series vanish", seen_by=("gpu-count",)),
        FaultSpec("thermal", "gpu", "sustained > 90 C with thermal clock events",
                  seen_by=("gpu-temp-high", "clocks-hw-slowdown")),
        FaultSpec("clock-slowdown", "gpu", "clock-slowdown:<reason>: the busy GPU's clocks are held down, the reason "
                  "hw-slowdown, hw-thermal, power-brake or sw-thermal (DCGM's clock event reasons)",
                  seen_by=("clock-slowdown",)),
        FaultSpec("pcie-downtrain", "gpu", "the GPU's PCIe link trained at x8 of its x16 (after a reseat or a reboot)",
                  seen_by=("pcie-downtrained",)),
        FaultSpec("vbios-drift", "gpu", f"the GPU runs VBIOS {VBIOS_DRIFT_VERSION}, every other one {VBIOS_VERSION} "
                  "(a board swapped in from another system, or flashed apart)", seen_by=("firmware-drift",)),
        FaultSpec("sxid-fatal", "node", "the node's kernel log gets a fatal NVSwitch SXid: "
                  f"`{SXID_LINES['sxid-fatal']}`", survives_reboot=False, seen_by=("nvswitch-fatal",)),
        FaultSpec("sxid-nonfatal", "node", "the node's kernel log gets a non-fatal NVSwitch SXid: "
                  f"`{SXID_LINES['sxid-nonfatal']}`", survives_reboot=False, seen_by=("nvswitch-errors",)),
        FaultSpec("driver-drift", "node", f"the node runs driver {DRIVER_DRIFT_VERSION}, every other one "
                  f"{DRIVER_VERSION} (a rollout stopped half way): DCGM's driver label, nvidia-smi and dcgmi show it",
                  seen_by=("version-drift",)),
        FaultSpec("fabric-stuck", "gpu", "Fabric Manager never finishes training the GPU: its fabric state stays "
                  "In Progress", seen_by=("fabric-not-ready",)),
        FaultSpec("fabricmanager-down", "node", "nvidia-fabricmanager is not running: every GPU's fabric state "
                  "stays In Progress", seen_by=("fabric-manager-down",)),
        FaultSpec("mig-on", "gpu", "MIG mode is enabled on the GPU (nvidia-smi -mig 1 and a reset)",
                  seen_by=("mig-enabled",)),
        FaultSpec("compute-exclusive", "gpu", "the GPU's compute mode is Exclusive_Process (nvidia-smi -c "
                  "EXCLUSIVE_PROCESS): a second process of a job cannot open the GPU", seen_by=("compute-mode",)),
        FaultSpec("ecc-off", "gpu", "ECC is disabled on the GPU (nvidia-smi -e 0 and a reboot)",
                  seen_by=("ecc-disabled",)),
        FaultSpec("nvlink-errors", "gpu", "NVLink CRC and replay errors rising",
                  rates={"nvlink_crc_flit": 20.0, "nvlink_crc_data": 5.0, "nvlink_replay": 5.0}, **_VOLATILE,
                  seen_by=("nvlink-errors-rising",)),
        FaultSpec("nvlink-crc", "gpu", "NVLink CRC errors rising (flow-control flits and data), no replays yet",
                  rates={"nvlink_crc_flit": 20.0, "nvlink_crc_data": 5.0}, **_VOLATILE,
                  seen_by=("nvlink-errors-rising",)),
        FaultSpec("nvlink-down", "gpu", "nvlink-down:<link>: the GPU's NVLink <link> (0-17) is inactive: `nvidia-smi "
                  "nvlink -s` prints <inactive>, and DCGM watches only the links that are up",
                  seen_by=("nvlink-down",)),
        FaultSpec("nvlink-degraded", "gpu", "nvlink-degraded:<link>: the GPU's NVLink <link> runs at half its speed "
                  f"({NVLINK_DEGRADED_SPEED_GBPS} GB/s)", seen_by=("nvlink-degraded",)),
        FaultSpec("pcie-aer", "gpu", "the GPU's PCIe link reports correctable errors (AER RxErr), 5 a second, in "
                  "sysfs aer_dev_correctable", rates={"pcie_aer_correctable": 5.0}, **_VOLATILE,
                  seen_by=("pcie-aer-rising",)),
        FaultSpec("pcie-replays", "gpu", "PCIe replays rising", rates={"pcie_replay": 10.0}, **_VOLATILE,
                  seen_by=("pcie-replays",)),
        # Links that train and count no error, yet carry half: found only by moving data (all_reduce_perf).
        FaultSpec("nvlink-slow", "gpu", "the GPU's NVLinks move half the data: all_reduce_perf's bus bandwidth "
                  "halves, no counter shows it", seen_by=("validate",)),
        FaultSpec("ib-down", "hca", "the port is down (state DOWN, phys Polling)",
                  rates={}, steps={"link_downed": 1}, seen_by=("ib-down", "node-check")),
        FaultSpec("sm-down", "node", "the subnet manager is gone: every InfiniBand port sits in INIT "
                  "(phys LinkUp, no LID)", seen_by=("ib-down", "node-check")),
        FaultSpec("ib-degraded", "hca", "the port trained at 200 Gb/s (2X NDR)", seen_by=("ib-degraded", "node-check")),
        FaultSpec("ib-counters", "hca", "symbol and link errors rising",
                  rates={"symbol_error": 20.0, "link_error_recovery": 0.5, "port_rcv_errors": 5.0},
                  seen_by=("ib-errors", "node-check")),
        FaultSpec("exporter-down", "node", "the node's exporters stop answering", seen_by=("data",)),
        FaultSpec("ib-slow", "hca", "the fabric model halves this rail's bandwidth: ib_write_bw and a "
                  "multi-node all_reduce_perf over it", seen_by=("validate",)),
        FaultSpec("ib-fw-mismatch", "hca", f"the HCA runs firmware {HCA_FW_MISMATCH}",
                  seen_by=("node-check", "version-drift")),
        FaultSpec("pcie-x8", "hca", "the HCA's PCIe link trained at x8 (half its bandwidth)", seen_by=("node-check",)),
        FaultSpec("dgx-naming", "node", "the HCAs are named as on a DGX H100/H200: rails mlx5_0,3,4,5,6,9,10,11, "
                  "in-band/storage ports mlx5_1,2 (InfiniBand, Ethernet) and mlx5_7,8 between them",
                  simulated_only=True, seen_by=("layout",)),
        FaultSpec("gpu-leftover-memory", "gpu", "a dead process still holds GPU memory", machines_only=True,
                  survives_reboot=False, seen_by=("epilog",)),
        FaultSpec("gpu-hang", "gpu", "nvidia-smi hangs on any query that reaches this GPU", machines_only=True,
                  survives_reboot=False, seen_by=("epilog",)),
        # Also what `nvidia-smi -pm 0` leaves (NodeHardware.set_persistence_mode); DCGM reports it (field 66), so
        # the simulated lab shows it too.
        FaultSpec("persistence-off", "gpu", "the GPU runs with persistence mode Disabled (nvidia-smi -pm 0, or a "
                  "persistence daemon started with --no-persistence-mode)",
                  seen_by=("driver-verify", "persistence-off")),
        FaultSpec("lustre-ost-down", "node", "the Lustre client lost lustre-OST0002: its import is DISCONN and "
                  "`lfs check servers` fails it", simulated_only=False, seen_by=("lustre-import-down",)),
        FaultSpec("mount-missing", "node", "/shared is not mounted (gone from mountinfo)", simulated_only=False,
                  seen_by=("storage-mount-missing",)),
        FaultSpec("nfs-hung", "node", "/home stops answering: its probe blocks, as a stat of a hung NFS mount does",
                  simulated_only=False, seen_by=("storage-mount-hung",)),
        FaultSpec("lnet-down", "node", "the node's LNet NI on o2ib (bond0) is down: `lnetctl net show` says so and "
                  "`lctl ping` of the MGS fails", simulated_only=True,
                  seen_by=("lnet-ni-down", "lustre-mgs-unreachable")),
        # The fabric's cabling, as `ibnetdiscover` of each rail shows it (opsctl_lab.fabric).
        FaultSpec("recable-leaf", "rail", "recable-leaf:<rail>: the rail's HCA is cabled to that rail's leaf of the "
                  "other scalable unit (a free down port, else the leaf's last up-link port)", seen_by=("topology",)),
        FaultSpec("recable-rail", "rail", "recable-rail:<rail>: the rail's HCA is cabled to the next rail's leaf "
                  "(rail r to rail (r+1) % 8) of its own scalable unit", seen_by=("topology",)),
        # For the job-health evaluation, not the node health catalog: the rank of a training job on the node
        # (opsctl_lab.hwtools.train) steps slower, or not at all, and its peers wait for it (opsctl_lab.sync_job).
        FaultSpec("slow-gpu", "gpu", f"the GPU's SM clock is held at {SLOW_GPU_SM_CLOCK_MHZ} MHz under a power cap "
                  f"(clock event SW_POWER_CAP 0x4): a training rank on the node computes each step "
                  f"{SLOW_GPU_STEP_FACTOR}x as long and its peers wait for it", seen_by=("job-health",)),
        FaultSpec("hang", "node", "the training rank on the node stops stepping but stays alive, its GPUs idle; "
                  "the job's other ranks wait for it at the all-reduce, for ever", simulated_only=True,
                  seen_by=("job-health",)),
        # What the lab's RebootProgram does with it (opsctl_lab.slurm_reboot): slurmd stops and never starts
        # again, and the hardware keeps every fault; only the BMC's power on (opsctl_lab.bmc) boots the node, and
        # that reboot ends it. No health rule sees it: slurmctld's ResumeTimeout marks the node DOWN.
        FaultSpec("reboot-hang", "node", "a graceful reboot never finishes: only a power cycle brings the node back",
                  survives_reboot=False, simulated_only=True, seen_by=("reboot-timeout",)),
        FaultSpec("uplink-down", "fabric", "uplink-down:<leaf>: the leaf's last up-link (port 64, to spine 2) is "
                  "down; inject it on `fabric` (`opsctl lab inject fabric uplink-down:rail3-su1-leaf`)",
                  seen_by=("topology",)),
    ]
}


# How `opsctl lab inject` addresses a fault's device, by its target.
TARGET_OPTIONS = {"gpu": "--gpu G", "hca": "--hca H"}


def describe_faults() -> str:
    lines = []
    for spec in FAULTS.values():
        where = TARGET_OPTIONS.get(spec.target, "")
        name = spec.name + FAULT_ARGUMENTS.get(spec.name, "")
        tier = " (lab machines only)" if spec.machines_only else " (simulated lab only)" if spec.simulated_only else ""
        lines.append(f"{name:22} {where:8} {spec.summary}{tier}")
    return "\n".join(lines)


def parse_fault(text: str) -> tuple[FaultSpec, int | str | None]:
    """'xid:79' -> (xid spec, 79); 'xid-kernel:62' -> (xid-kernel spec, 62); 'recable-rail:3' -> (its spec, 3);
    'clock-slowdown:power-brake' -> (its spec, 'power-brake'); 'nvlink-down:3' -> (its spec, '3');
    'dbe' -> (dbe spec, None); 'uplink-down:rail3-su1-leaf' -> (its spec, None): the fabric's own faults name a
    switch, which opsctl_lab.fabric checks. Raises LabError on anything else."""
    name, _, arg = text.partition(":")
    spec = FAULTS.get(name)
    if spec is None or (name in FAULT_ARGUMENTS) != bool(arg):
        raise LabError(f"unknown fault {text!r}; `opsctl lab faults` lists them")
    if name in XID_FAULTS:
        if not arg.isdigit() or not 0 < int(arg) < 1000:
            raise LabError(f"bad XID code in {text!r}: expected {name}:<1-999>")
        return spec, int(arg)
    if name in RAIL_FAULTS:
        if not arg.isdigit() or not 0 <= int(arg) < RAILS:
            raise LabError(f"bad rail in {text!r}: expected {name}:<0-{RAILS - 1}>")
        return spec, int(arg)
    if name in NVLINK_FAULTS:
        if not arg.isdigit() or not 0 <= int(arg) < NVLINKS_PER_GPU:
            raise LabError(f"bad link in {text!r}: expected {name}:<0-{NVLINKS_PER_GPU - 1}>")
        return spec, str(int(arg))
    if name in VARIANT_FAULTS:
        if arg not in VARIANT_FAULTS[name]:
            raise LabError(f"bad reason in {text!r}: expected {name}:<{' | '.join(VARIANT_FAULTS[name])}>")
        return spec, arg
    return spec, None


# The faults that take a link of the GPU (`nvlink-down:3`), kept as its variant.
NVLINK_FAULTS = ("nvlink-down", "nvlink-degraded")
# The faults that take one of a set of words (`clock-slowdown:power-brake`): fault -> its words.
VARIANT_FAULTS = {"clock-slowdown": tuple(CLOCK_SLOWDOWNS)}


# What a fault's argument is, for those that take one (`xid:79`, `recable-leaf:3`, `uplink-down:rail3-su1-leaf`).
FAULT_ARGUMENTS = {**dict.fromkeys(XID_FAULTS, ":<code>"), **dict.fromkeys(RAIL_FAULTS, ":<rail>"),
                   "uplink-down": ":<leaf>", "clock-slowdown": ":<reason>", **dict.fromkeys(NVLINK_FAULTS, ":<link>")}


def hca_name(hca: str | int | None, names: HcaLayout | None = None) -> str:
    """Rail index 0-7 -> the rail's name (mlx5_<i> on HGX); 8 and up -> the storage ports; a device name
    of the layout passes through."""
    names = names or hca_layout()
    rails, everything = names.rails, names.rails + names.storage
    if hca is None:
        return rails[0]
    text = str(hca)
    if text.isdigit():
        if int(text) < len(everything):
            return everything[int(text)]
    elif text in everything:
        return text
    raise LabError(f"unknown HCA {hca!r}: use a rail 0-{len(rails) - 1}, {len(rails)}-{len(everything) - 1} for the "
                   f"storage ports, or one of {', '.join(everything)}")


def stable_int(*parts: object, modulo: int) -> int:
    """A value that is the same for the same node and device on every run."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest, "big") % modulo


def leftover_pid(gpu: int) -> int:
    return LEFTOVER_PID_BASE + 97 * gpu


def _seconds_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def kernel_log_path(state: Path) -> Path:
    """Where a node's kernel log is, given its state file (`opsctl node check`'s gpu.kernel_log_path)."""
    return Path(state).parent / KERNEL_LOG_NAME


def write_kernel_log(path: Path, hw: "NodeHardware") -> None:
    """The node's kernel log as a file of /dev/kmsg records, one a line
    (`<prio>,<seq>,<usec since boot>,-;<message>`, Documentation/ABI/testing/dev-kmsg); replaced whole, so a
    reader never sees half a record."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text("".join(f"{r['prio']},{r['seq']},{r['usec']},-;{r['message']}\n" for r in hw.kernel_log))
    os.replace(tmp, path)


@dataclass
class ActiveFault:
    fault: str
    gpu: int | None = None
    hca: str | None = None
    since: float = 0.0
    xid: int | None = None
    rail: int | None = None  # the rail of a rail fault (recable-leaf:3)
    variant: str | None = None  # the word of a variant fault (clock-slowdown:power-brake)

    def key(self, counter: str) -> str:
        return f"{self.gpu if self.hca is None else self.hca}:{counter}"


def fault_label(fault: ActiveFault) -> str:
    """How the lab's reports name a fault: `xid:79 gpu3`, `ib-down mlx5_2`, `recable-rail:3`, `exporter-down`."""
    name = f"{fault.fault}:{fault.xid}" if fault.fault in XID_FAULTS else \
        f"{fault.fault}:{fault.rail}" if fault.fault in RAIL_FAULTS else \
        f"{fault.fault}:{fault.variant}" if fault.variant else fault.fault
    where = f" gpu{fault.gpu}" if fault.gpu is not None else f" {fault.hca}" if fault.hca else ""
    return name + where


@dataclass
class NodeHardware:
    node: str
    active: list[ActiveFault] = field(default_factory=list)
    accum: dict[str, float] = field(default_factory=dict)  # "<gpu|hca>:<counter>" -> value added by past faults
    last_xid: dict[str, int] = field(default_factory=dict)  # str(gpu) -> last XID code; survives clear, as in DCGM
    # Device minor number (the N of /dev/nvidiaN) of each GPU index. The driver does not promise it equals
    # the index; None: it does, as on most boards.
    minors: list[int] | None = None
    # The driver the node runs: `opsctl-hw driver VERSION` stands in for installing a new one and loading
    # it (the nvidia role does so on an emulated node), so that a rollout has a version to change.
    driver_version: str = DRIVER_VERSION
    booted: float = EMULATED_BOOT  # unix seconds of the node's last (emulated) boot
    # The records the NVIDIA driver wrote to the kernel log this boot, oldest first:
    # {"prio", "seq", "usec", "message"} (write_kernel_log renders them as /dev/kmsg records).
    kernel_log: list[dict[str, Any]] = field(default_factory=list)
    # The XIDs whose fault a GPU reset ended ({"gpu", "xid", "since"}): dcgm-exporter's windowed count
    # still holds them (its window lives in the exporter, which a GPU reset does not restart), so a repeat
    # counts 2 (expcollector.go). A reboot starts DCGM and the exporter again; `clear` forgets them too.
    xid_seen: list[dict[str, Any]] = field(default_factory=list)
    # When each GPU (str(gpu)) was last reset, unix seconds: its fabric trains again from then (this boot only).
    gpu_reset_at: dict[str, float] = field(default_factory=dict)
    fabric_training_s: float = FABRIC_TRAINING_S
    # When Fabric Manager started this boot, unix seconds: the fabric trains from then (or from a GPU's later reset).
    # None: it has not started this boot, and every fabric stays Not Started (a lab machine's boot says so, its
    # nvidia-fabricmanager unit records the start: `opsctl-hw boot`, `opsctl-hw fabricmanager`).
    # FABRIC_MANAGER_WITH_BOOT: the node runs none of its own; the fabric trains from the boot.
    fabric_manager_since: float | None = FABRIC_MANAGER_WITH_BOOT
    # The node's GPU monitoring services (MONITORING_SERVICES) and whether each runs: DCGM's host engine and
    # dcgm-exporter hold every GPU while they run, so nvidia-smi refuses a reset (nvidia_smi_reset.in_use). The
    # emulated systemctl (hwtools/systemctl.py) stops and starts them. Empty: not emulated (the lab machines run
    # the real units, which their emulated nvidia-smi does not see yet).
    monitoring: dict[str, bool] = field(default_factory=dict)

    # ---- persistence -------------------------------------------------------------------------
    @classmethod
    def load(cls, path: Path, node: str) -> "NodeHardware":
        try:
            raw = json.loads(Path(path).read_text())
        except FileNotFoundError:
            return cls(node=node)
        except (OSError, ValueError) as err:
            raise LabError(f"cannot read lab hardware state {path}: {err}") from err
        return cls(
            node=raw.get("node", node),
            active=[ActiveFault(**fault) for fault in raw.get("active", [])],
            accum=dict(raw.get("accum", {})),
            last_xid=dict(raw.get("last_xid", {})),
            minors=raw.get("minors"),
            driver_version=raw.get("driver_version", DRIVER_VERSION),
            booted=float(raw.get("booted", EMULATED_BOOT)),
            kernel_log=list(raw.get("kernel_log", [])),
            xid_seen=list(raw.get("xid_seen", [])),
            gpu_reset_at={str(k): float(v) for k, v in raw.get("gpu_reset_at", {}).items()},
            fabric_training_s=float(raw.get("fabric_training_s", FABRIC_TRAINING_S)),
            fabric_manager_since=_seconds_or_none(raw.get("fabric_manager_since", FABRIC_MANAGER_WITH_BOOT)),
            monitoring={str(k): bool(v) for k, v in raw.get("monitoring", {}).items()},
        )

    def save(self, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(asdict(self), indent=1, sort_keys=True))
        os.replace(tmp, path)  # readers never see half a file

    # ---- faults ------------------------------------------------------------------------------
    def inject(self, text: str, gpu: int | None = None, hca: str | int | None = None,
               now: float | None = None) -> ActiveFault:
        spec, arg = parse_fault(text)
        if spec.target == "fabric":
            raise LabError(f"{spec.name} is a fault of the fabric, not of a node: inject it on `fabric` "
                           f"(`opsctl lab inject fabric {text}`)")
        now = time.time() if now is None else now
        xid = arg if spec.name in XID_FAULTS and isinstance(arg, int) else None
        fault = ActiveFault(fault=spec.name, since=now, xid=xid,
                            rail=arg if spec.target == "rail" and isinstance(arg, int) else None,
                            variant=arg if isinstance(arg, str) else None)
        if spec.target == "gpu":
            fault.gpu = 0 if gpu is None else int(gpu)
            if not 0 <= fault.gpu < GPUS_PER_NODE:
                raise LabError(f"--gpu must be 0-{GPUS_PER_NODE - 1}")
        elif spec.target == "hca":
            fault.hca = hca_name(hca, self.hca_layout())
        for counter, amount in spec.steps.items():
            self.accum[fault.key(counter)] = self.accum.get(fault.key(counter), 0.0) + amount
        if spec.name == "xid":
            assert xid is not None  # parse_fault requires an XID fault's code
            self.last_xid[str(fault.gpu)] = xid
        elif spec.name == "xid-kernel":
            assert fault.gpu is not None and xid is not None  # a GPU fault, and parse_fault requires its code
            self._log_xid(fault.gpu, xid, now)
        elif spec.name in SXID_LINES:
            self.log_kernel(3, SXID_LINES[spec.name], now)
        same = (fault.fault, fault.gpu, fault.hca, fault.xid, fault.rail, fault.variant)
        self.active = [f for f in self.active if (f.fault, f.gpu, f.hca, f.xid, f.rail, f.variant) != same]
        self.active.append(fault)
        return fault

    def clear(self, now: float | None = None) -> None:
        """Every fault ends; counters keep what they reached (their rate returns to 0); the monitoring services
        that were stopped run again (a step that stopped them and never came back leaves no lasting fault)."""
        self._end(list(self.active), time.time() if now is None else now)
        self.xid_seen = []
        self.monitoring = dict.fromkeys(self.monitoring, True)

    def _end(self, faults: list[ActiveFault], now: float) -> list[ActiveFault]:
        """End these faults: what their rates added stays in the counters."""
        for fault in faults:
            for counter, rate in FAULTS[fault.fault].rates.items():
                self.accum[fault.key(counter)] = self.accum.get(fault.key(counter), 0.0) + rate * (now - fault.since)
        self.active = [f for f in self.active if not any(f is ended for ended in faults)]
        return faults

    def reset_gpu(self, gpu: int, now: float | None = None) -> list[ActiveFault]:
        """What a successful `nvidia-smi -r -i GPU` does: the GPU's faults that do not survive a reset
        (FaultSpec.survives_reset) end; returns them. The caller decides whether the reset may run."""
        now = time.time() if now is None else now
        ended = [f for f in self.active if f.gpu == gpu and not FAULTS[f.fault].survives_reset]
        self.xid_seen += [{"gpu": f.gpu, "xid": f.xid, "since": f.since} for f in ended if f.fault == "xid"]
        self.gpu_reset_at[str(gpu)] = now
        return self._end(ended, now)

    def reboot(self, now: float | None = None) -> list[ActiveFault]:
        """What a reboot does to the hardware: the faults that do not survive it end (FaultSpec.survives_reboot),
        the node boots at `now`: the kernel log starts again (its sequence numbers too), and DCGM, started
        again, has seen no XID yet. Returns the faults that ended."""
        now = time.time() if now is None else now
        ended = self._end([f for f in self.active if not FAULTS[f.fault].survives_reboot], now)
        self.booted, self.kernel_log, self.last_xid, self.xid_seen = now, [], {}, []
        self.gpu_reset_at = {}
        return ended

    def stop_fabric_manager(self) -> None:
        """The node boots and its Fabric Manager, a service of its own (a lab machine's), has not started yet:
        nothing trains the fabric until it does (start_fabric_manager)."""
        self.fabric_manager_since = None

    def start_fabric_manager(self, now: float | None = None) -> None:
        """Fabric Manager starts: every GPU's fabric trains from now, for fabric_training_s."""
        self.fabric_manager_since = time.time() if now is None else now

    def _log_xid(self, gpu: int, code: int, now: float) -> None:
        """The driver's XID line as the kernel log gets it (kernel_rc.c of NVIDIA/open-gpu-kernel-modules:
        `NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, %s`; real lines: tests/fixtures/kmsg/). The
        process is the GPU's leftover one, else the driver's own `pid='<unknown>', name=<unknown>`. Priority 3
        (KERN_ERR), as in tests/fixtures/kmsg/kmsg_h200_node.txt."""
        pid, name = (leftover_pid(gpu), LEFTOVER_PROCESS) if self.has("gpu-leftover-memory", gpu=gpu) else \
            ("'<unknown>'", "<unknown>")
        text = XID_MESSAGES.get(code, "Unknown Error")
        self.log_kernel(3, f"NVRM: Xid (PCI:0000:{GPU_BUSES[gpu]}:00): {code}, pid={pid}, name={name}, {text}", now)

    def log_kernel(self, level: int, message: str, now: float) -> None:
        """A record of the kernel's own (facility 0, so the priority is the level: KERN_ERR 3, KERN_WARNING 4)
        appended to this boot's kernel log, numbered after the last one."""
        seq = self.kernel_log[-1]["seq"] + 1 if self.kernel_log else 0
        self.kernel_log.append({"prio": level, "seq": seq, "usec": max(0, int((now - self.booted) * 1e6)),
                                "message": message})

    # ---- what the tools read -----------------------------------------------------------------
    def faults_on(self, name: str, gpu: int | None = None, hca: str | None = None) -> list[ActiveFault]:
        return [f for f in self.active if f.fault == name and f.gpu == gpu and f.hca == hca]

    def has(self, name: str, gpu: int | None = None, hca: str | None = None) -> bool:
        return bool(self.faults_on(name, gpu, hca))

    def loaded_driver(self) -> str:
        """The driver version the emulated tools show: the installed one, unless `driver-drift` says otherwise."""
        return DRIVER_DRIFT_VERSION if self.node_fault("driver-drift") else self.driver_version

    def node_fault(self, name: str) -> bool:
        return any(f.fault == name for f in self.active)

    def recabled(self, name: str) -> set[int]:
        """The rails under this rail fault (`recable-leaf`, `recable-rail`)."""
        return {f.rail for f in self.active if f.fault == name and f.rail is not None}

    def counter(self, device: int | str, counter: str, base: float, now: float | None = None) -> float:
        """base + what past faults added + what active faults add now."""
        now = time.time() if now is None else now
        value = base + self.accum.get(f"{device}:{counter}", 0.0)
        for fault in self.active:
            if (fault.hca if isinstance(device, str) else fault.gpu) == device:
                value += FAULTS[fault.fault].rates.get(counter, 0.0) * max(0.0, now - fault.since)
        return value

    def xid_window(self, gpu: int, now: float | None = None, window_ms: int = XID_WINDOW_MS) -> dict[int, int]:
        """XID code -> count within the window, as DCGM_EXP_XID_ERRORS_COUNT reports it."""
        now = time.time() if now is None else now
        counts: dict[int, int] = {}
        seen = [(f.xid, f.since) for f in self.faults_on("xid", gpu=gpu) if f.xid is not None]  # every xid has one
        seen += [(x["xid"], x["since"]) for x in self.xid_seen if x["gpu"] == gpu]
        for code, since in seen:
            if now - since <= window_ms / 1000.0:
                counts[code] = counts.get(code, 0) + 1
        return counts

    def minor(self, gpu: int) -> int:
        return int(self.minors[gpu]) if self.minors else gpu

    def gpu_present(self, gpu: int) -> bool:
        return not self.has("gpu-missing", gpu=gpu)

    def monitoring_holders(self) -> list[str]:
        """The monitoring services that run, and so hold every GPU."""
        return [name for name, running in self.monitoring.items() if running]

    def unit_active(self, unit: str) -> bool | None:
        """Whether a service of the node runs, as `systemctl is-active` would say: its monitoring services as
        kept, Fabric Manager unless `fabricmanager-down`, the persistence daemon always; None: no such unit."""
        if unit in self.monitoring:
            return self.monitoring[unit]
        return {"nvidia-fabricmanager": not self.node_fault("fabricmanager-down"),
                "nvidia-persistenced": True}.get(unit)

    def exporter_serves(self) -> bool:
        """dcgm-exporter answers: it runs and so does the host engine it reads (when the node emulates them)."""
        return not self.monitoring or all(self.monitoring.values())

    def fabric_status(self, gpu: int, now: float) -> int:
        """The GPU's fabric state (FABRIC_*): trained fabric_training_s after its training began
        (fabric_training_since); Not Started while Fabric Manager has not started this boot; never trained while
        Fabric Manager is down or the GPU's training is stuck (NVIDIA/NVSentinel issue 889: the state then stays
        In Progress)."""
        if self.has("fabric-stuck", gpu=gpu) or self.node_fault("fabricmanager-down"):
            return FABRIC_IN_PROGRESS
        since = self.fabric_training_since(gpu)
        if since is None:
            return FABRIC_NOT_STARTED
        # A moment before the node's recorded boot (a caller's clock of its own, in tests) finds it trained.
        if now - since >= self.fabric_training_s or now < since:
            return FABRIC_SUCCESS
        return FABRIC_NOT_STARTED if now - since < self.fabric_training_s / 4 else FABRIC_IN_PROGRESS

    def fabric_training_since(self, gpu: int) -> float | None:
        """When the GPU's fabric began training this boot: the latest of the boot, Fabric Manager's start and the
        GPU's last reset; None while Fabric Manager has not started this boot."""
        if self.fabric_manager_since is None:
            return None
        return max(self.booted, self.fabric_manager_since, self.gpu_reset_at.get(str(gpu), self.booted))

    def persistence_mode(self, gpu: int) -> bool:
        """Enabled unless the GPU has the persistence-off fault, as on a node whose daemon enables it."""
        return not self.has("persistence-off", gpu=gpu)

    def set_persistence_mode(self, gpu: int, enabled: bool, now: float | None = None) -> None:
        """`nvidia-smi -pm 0|1`: the state keeps it as the persistence-off fault, so `clear` turns it back on."""
        if enabled:
            self.active = [f for f in self.active if not (f.fault == "persistence-off" and f.gpu == gpu)]
        elif self.persistence_mode(gpu):
            self.inject("persistence-off", gpu=gpu, now=now)

    def hca_layout(self) -> HcaLayout:
        """The HCAs' names and places in the PCIe tree: HGX naming, or DGX under `dgx-naming`."""
        return hca_layout(dgx=self.node_fault("dgx-naming"))

    def hca_port(self, hca: str) -> dict[str, str]:
        """state, phys_state, rate and firmware of a port, in sysfs wording."""
        names = self.hca_layout()
        compute = hca in names.rails
        port = {
            "state": "4: ACTIVE",
            "phys_state": "5: LinkUp",
            "rate": NDR_RATE if compute else STORAGE_RATE,
            "fw_ver": STORAGE_FW if hca == STORAGE_HCA else HCA_FW,  # a DGX's storage ports are ConnectX-7s
            "link_layer": names.link_layer(hca),
        }
        if compute and self.node_fault("sm-down"):
            # The link trained but no subnet manager configured it: INIT, as on every port of the subnet.
            port["state"] = "2: INIT"
        if self.has("ib-down", hca=hca):
            port.update(state="1: DOWN", phys_state="2: Polling")
        if self.has("ib-degraded", hca=hca):
            port["rate"] = NDR_DEGRADED_RATE if compute else "100 Gb/sec (2X HDR)"
        if self.has("ib-fw-mismatch", hca=hca):
            port["fw_ver"] = HCA_FW_MISMATCH
        return port

    def hca_pcie(self, hca: str) -> dict[str, str]:
        """The sysfs link files of the HCA's PCI device: Gen5 x16, or x8 under `pcie-x8`."""
        width = "8" if self.has("pcie-x8", hca=hca) else "16"
        return {"current_link_speed": PCIE_GEN5, "current_link_width": width, "max_link_speed": PCIE_GEN5,
                "max_link_width": "16"}
