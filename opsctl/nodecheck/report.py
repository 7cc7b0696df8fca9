"""`opsctl node check`: the results of every node-local check (the InfiniBand precheck, storage health and the
kernel log's XIDs), and their text for node_exporter's textfile collector.

Metrics (one file, written atomically; node_exporter reads only *.prom):

    opsctl_node_check{check="ib-port-state",device="mlx5_2"} 1   a failing check, per device
    opsctl_node_check{check="ib-link-rate",device="node"} 0       a check that ran and passed
    opsctl_node_check{check="storage-mount-hung",device="/home"} 1   storage: the device is the mount point,
    opsctl_node_check{check="lustre-import-down",device="lustre-OST0002"} 1   or the Lustre target
    opsctl_node_nfs_rpc_retransmissions_total{mount="/home"} 12   per NFS mount, cumulative since it mounted
    opsctl_node_kernel_log_read_ok 1                              the kernel log was read (opsctl.nodecheck.kernel_log)
    opsctl_node_kernel_log_ignored_records_total{reason="quoted"} 1   the driver's words, not its line: never an XID
    opsctl_node_kernel_xid_total{gpu="0",pci_bus_id="00000000:18:00.0",xid="79"} 1   XIDs it holds, cumulative
    opsctl_node_kernel_xid_last_timestamp_seconds{gpu="0",pci_bus_id="00000000:18:00.0",xid="79"} 1.8e+09
    opsctl_node_kernel_xid_count{gpu="0",pci_bus_id="00000000:18:00.0",xid="79",window_size_in_ms="900000"} 1
    opsctl_node_kernel_sxid_total{nvswitch_pci="00000000:C7:00.0",sxid="12028",fatal="false"} 2
    opsctl_node_kernel_sxid_count{nvswitch_pci="00000000:C7:00.0",sxid="12028",fatal="false",window_size_in_ms=...} 1
    opsctl_node_gpu_recovery_action{gpu="3",pci_bus_id="00000000:8A:00.0",action="reset"} 1   latest XID 154
    opsctl_node_nvlink_inactive{gpu="1",nvlink="gpu1 link3"} 1    per GPU: its inactive NVLinks, named
    opsctl_node_nvlink_speed_ratio{gpu="5",nvlink="gpu5 link7"} 0.5   its slowest active link over full speed
    opsctl_node_pcie_aer_errors_total{pcie="gpu3",severity="correctable"} 12   per GPU or HCA (sysfs AER)
    opsctl_node_ofed_info{distribution="MLNX_OFED_LINUX",version="24.10-1.1.4.0"} 1   ofed_info -s, when it answers
    opsctl_node_check_timestamp_seconds 1.8e+09                   when the checks last ran

A check that could not be made (see `opsctl ib check`, "not checked") has no series: the catalog
rule `node-check` never reads a missing check as a pass, and the timestamp shows a check that stopped.

With --drain-self the node drains itself for them (opsctl.nodecheck.drain_self).
"""

from dataclasses import dataclass
from pathlib import Path

from opsctl.errors import ConfigError
from opsctl.fileio import write_atomic
from opsctl.gpu.kmsg import IGNORED_REASONS
from opsctl.gpu.nvlink import NvlinkReport
from opsctl.ib.check import CHECKS, Report
from opsctl.ib.ofed import OfedVersion
from opsctl.nodecheck.kernel_log import XID_WINDOW_S, KernelLogReport
from opsctl.slurm import OWNED_PREFIX
from opsctl.storage.check import StorageReport

RULE = "node-check"
NODE = "node"
REASON_PREFIX = f"{OWNED_PREFIX}{RULE}"


@dataclass(frozen=True)
class CheckResult:
    check: str  # "ib-port-state"
    device: str  # an HCA, or "node" for the node itself and for a check that passed
    failed: bool


def results(report: Report, family: str = "ib") -> list[CheckResult]:
    # Prometheus drops an empty label, and the catalog rule needs the device: "node" stands for the node.
    out = [CheckResult(f"{family}-{f.check}", f.device or NODE, True) for f in report.findings]
    failed = {f.check for f in report.findings}
    out += [CheckResult(f"{family}-{check}", NODE, False) for check in CHECKS
            if check not in failed and check not in report.skipped]
    return sorted(set(out), key=lambda r: (r.check, r.device))


def storage_results(report: StorageReport) -> list[CheckResult]:
    out = [CheckResult(f.check, f.device, True) for f in report.findings]
    failed = {f.check for f in report.findings}
    out += [CheckResult(check, NODE, False) for check in report.checked if check not in failed]
    return sorted(set(out), key=lambda r: (r.check, r.device))


def _label(value: str) -> str:
    """A label value in the text exposition format: backslash, quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics_text(found: list[CheckResult], now: float, storage: StorageReport | None = None,
                 kernel: KernelLogReport | None = None, nvlinks: NvlinkReport | None = None,
                 aer: dict[str, dict[str, int]] | None = None, ofed: OfedVersion | None = None) -> str:
    lines = ["# HELP opsctl_node_check Whether a node-local check failed (1) or passed (0), per check and device.",
             "# TYPE opsctl_node_check gauge"]
    lines += [f'opsctl_node_check{{check="{r.check}",device="{_label(r.device)}"}} {int(r.failed)}' for r in found]
    if storage and storage.nfs:
        lines += ["# HELP opsctl_node_nfs_rpc_retransmissions_total RPC retransmissions of an NFS mount "
                  "(/proc/self/mountstats: transmissions beyond the first of each op).",
                  "# TYPE opsctl_node_nfs_rpc_retransmissions_total counter"]
        lines += [f'opsctl_node_nfs_rpc_retransmissions_total{{mount="{_label(point)}"}} {stats.retransmissions}'
                  for point, stats in sorted(storage.nfs.items())]
    if kernel:
        lines += kernel_log_metrics(kernel)
    if nvlinks and nvlinks.speeds:
        gpus = nvlinks.gpus()
        lines += ["# HELP opsctl_node_nvlink_inactive How many NVLinks of the GPU are inactive (nvidia-smi nvlink -s); "
                  "the nvlink label names them.",
                  "# TYPE opsctl_node_nvlink_inactive gauge"]
        lines += [f'opsctl_node_nvlink_inactive{{gpu="{g.gpu}",nvlink="{g.name(g.inactive)}"}} {len(g.inactive)}'
                  for g in gpus]
        lines += ["# HELP opsctl_node_nvlink_speed_ratio The slowest active NVLink of the GPU over a link's full speed "
                  "(hardware.nvlink_bytes_per_second); the nvlink label names the links below it.",
                  "# TYPE opsctl_node_nvlink_speed_ratio gauge"]
        lines += [f'opsctl_node_nvlink_speed_ratio{{gpu="{g.gpu}",nvlink="{g.name(g.slow)}"}} {g.share:.4g}'
                  for g in gpus]
    if aer:
        lines += ["# HELP opsctl_node_pcie_aer_errors_total PCIe AER errors a GPU or HCA reported, by severity "
                  "(sysfs aer_dev_*: its kernel's count since boot).",
                  "# TYPE opsctl_node_pcie_aer_errors_total counter"]
        lines += [f'opsctl_node_pcie_aer_errors_total{{pcie="{_label(device)}",severity="{severity}"}} {count}'
                  for device, counts in sorted(aer.items()) for severity, count in sorted(counts.items())]
    if ofed and ofed.version:
        lines += ["# HELP opsctl_node_ofed_info The node's MLNX_OFED or DOCA-OFED release (ofed_info -s), always 1.",
                  "# TYPE opsctl_node_ofed_info gauge",
                  f'opsctl_node_ofed_info{{distribution="{_label(ofed.distribution)}",'
                  f'version="{_label(ofed.version)}"}} 1']
    lines += ["# HELP opsctl_node_check_timestamp_seconds When the node checks last ran.",
              "# TYPE opsctl_node_check_timestamp_seconds gauge",
              f"opsctl_node_check_timestamp_seconds {now:.3f}"]
    return "\n".join(lines) + "\n"


def kernel_log_metrics(kernel: KernelLogReport) -> list[str]:
    """The kernel log's counts (the health rules query these names). Counters keep counting across runs
    and reboots; a GPU's index is "" where nvidia-smi could not name it."""
    state = kernel.state
    lines = ["# HELP opsctl_node_kernel_log_read_ok Whether node check read the kernel log (1) or could not (0; "
             "--json says why).",
             "# TYPE opsctl_node_kernel_log_read_ok gauge",
             f"opsctl_node_kernel_log_read_ok {int(kernel.read_ok)}"]
    # Every reason's series from the first run on, 0 until one is seen: increase() then sees the first forgery.
    lines += ["# HELP opsctl_node_kernel_log_ignored_records_total Kernel log records with the NVIDIA driver's XID or "
              "SXid words that are not its lines, never counted as XIDs, by reason: quoted (a kernel message quoting "
              "them: a user's file or process name, an audit text), userspace (a program wrote them to /dev/kmsg).",
              "# TYPE opsctl_node_kernel_log_ignored_records_total counter"]
    lines += [f'opsctl_node_kernel_log_ignored_records_total{{reason="{reason}"}} {state.ignored.get(reason, 0)}'
              for reason in IGNORED_REASONS]
    xids = [(f'gpu="{kernel.gpu(pci)}",pci_bus_id="{_label(pci)}",xid="{xid}"', tally)
            for (pci, xid), tally in sorted(state.xids.items())]
    if xids:
        lines += ["# HELP opsctl_node_kernel_xid_total GPU XIDs the NVIDIA driver wrote to the kernel log, counted "
                  "by node check across its runs.",
                  "# TYPE opsctl_node_kernel_xid_total counter"]
        lines += [f"opsctl_node_kernel_xid_total{{{labels}}} {tally.count}" for labels, tally in xids]
        lines += ["# HELP opsctl_node_kernel_xid_last_timestamp_seconds When the newest of these XIDs was logged "
                  "(/dev/kmsg: the kernel's time; a file: the run that read it).",
                  "# TYPE opsctl_node_kernel_xid_last_timestamp_seconds gauge"]
        lines += [f"opsctl_node_kernel_xid_last_timestamp_seconds{{{labels}}} {tally.last_seen:.3f}"
                  for labels, tally in xids]
        window = f'window_size_in_ms="{XID_WINDOW_S * 1000}"'
        lines += ["# HELP opsctl_node_kernel_xid_count XIDs node check first saw in the kernel log within the window "
                  "(label window_size_in_ms), as dcgm-exporter's DCGM_EXP_XID_ERRORS_COUNT: the XID rules read both.",
                  "# TYPE opsctl_node_kernel_xid_count gauge"]
        lines += [f"opsctl_node_kernel_xid_count{{{labels},{window}}} {len(tally.recent)}" for labels, tally in xids]
    if state.sxids:
        sxids = [(f'nvswitch_pci="{_label(pci)}",sxid="{sxid}",fatal="{str(fatal).lower()}"', tally)
                 for (pci, sxid, fatal), tally in sorted(state.sxids.items())]
        lines += ["# HELP opsctl_node_kernel_sxid_total NVSwitch SXids the driver wrote to the kernel log, counted "
                  "by node check across its runs.",
                  "# TYPE opsctl_node_kernel_sxid_total counter"]
        lines += [f"opsctl_node_kernel_sxid_total{{{labels}}} {tally.count}" for labels, tally in sxids]
        window = f'window_size_in_ms="{XID_WINDOW_S * 1000}"'
        lines += ["# HELP opsctl_node_kernel_sxid_count NVSwitch SXids node check first saw in the kernel log within "
                  "the window (label window_size_in_ms), as opsctl_node_kernel_xid_count counts XIDs.",
                  "# TYPE opsctl_node_kernel_sxid_count gauge"]
        lines += [f"opsctl_node_kernel_sxid_count{{{labels},{window}}} {len(tally.recent)}" for labels, tally in sxids]
    if state.recovery:
        lines += ["# HELP opsctl_node_gpu_recovery_action The recovery action of a GPU's latest XID 154 this boot "
                  "(1 on that action's series only).",
                  "# TYPE opsctl_node_gpu_recovery_action gauge"]
        lines += [f'opsctl_node_gpu_recovery_action{{gpu="{kernel.gpu(pci)}",pci_bus_id="{_label(pci)}",'
                  f'action="{_label(action)}"}} 1'
                  for pci, action in sorted(state.recovery.items())]
    return lines


def write_textfile(path: Path, text: str) -> None:
    """Atomically (opsctl.fileio): node_exporter never reads half a file, and a name planted in the
    directory is never followed."""
    if not (path.is_absolute() and path.name.endswith(".prom")):
        raise ConfigError(f"--textfile {path}: must be an absolute path ending in .prom")
    try:
        write_atomic(path, text, mode=0o644)
    except OSError as err:
        raise ConfigError(f"--textfile {path}: {err.strerror}") from err
