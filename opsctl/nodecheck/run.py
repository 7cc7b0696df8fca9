"""`opsctl node check`: every node-local check (the InfiniBand precheck, storage, the kernel log's XIDs), the
textfile for node_exporter, and as Slurm's HealthCheckProgram the node draining itself (--drain-self) and its
step of the remediation ladder (--remediate-self), in one result that the command renders.

Also the views of the storage and kernel-log reports that `opsctl node check --json` and its text print:
their types are the checks' own, which the command layer does not import.
"""

import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opsctl.actor.result import ActionResult
from opsctl.clients import Clients
from opsctl.errors import ExitCode, worst
from opsctl.gpu.kmsg import SXid, Xid, canonical_pci
from opsctl.gpu.nvlink import NvlinkReport, read_nvlinks
from opsctl.hw.aer import read_aer
from opsctl.hw.pcie_tree import read_pci_tree
from opsctl.ib.check import Report
from opsctl.ib.ofed import OfedVersion, read_ofed
from opsctl.ib.report import check_report
from opsctl.ladder.node_step import take_step
from opsctl.nodecheck.drain_self import drain_self
from opsctl.nodecheck.gpu import GpuReport, check_gpus
from opsctl.nodecheck.kernel_log import CHECK, KernelLogReport, check_kernel_log
from opsctl.nodecheck.report import CheckResult, metrics_text, results, storage_results, write_textfile
from opsctl.storage.check import StorageReport, storage_report


@dataclass
class NodeCheck:
    report: Report  # the InfiniBand precheck
    storage: StorageReport
    kernel: KernelLogReport  # what is new in the kernel log
    found: list[CheckResult]  # every check's result, InfiniBand then storage
    nvlinks: NvlinkReport = field(default_factory=NvlinkReport)  # each NVLink's speed (the health rules judge them)
    aer: dict[str, dict[str, int]] = field(default_factory=dict)  # GPU or HCA -> AER severity -> errors so far
    ofed: OfedVersion = field(default_factory=OfedVersion)  # the RDMA stack's version (version-drift compares it)
    action: ActionResult = field(default_factory=ActionResult)  # what --drain-self and --remediate-self did
    # gpu-count and gpu-fabric (opsctl/nodecheck/gpu.py): for --drain-self and the exit code, not the textfile
    gpus: GpuReport = field(default_factory=GpuReport)
    exit_code: ExitCode = ExitCode.OK


def node_check(clients: Clients, textfile: str | None, drain: bool, node: str | None, window: float | None,
               sysfs_root: str | None, remediate: bool = False) -> NodeCheck:
    """Run the checks; write the textfile when asked; with `drain` drain or resume this node (`node`, else
    the short host name) for them; with `remediate` take its remediation step."""
    # Before anything reads it: --drain-self and --remediate-self change the node in Slurm.
    clients.config(acting=drain or remediate)
    report = check_report(clients.config().ib, None, None, window, sysfs_root)
    storage = storage_report(clients.config().storage)
    now = time.time()
    kernel = check_kernel_log(clients.config().gpu, clients.config().state_dir, now)
    nvlinks = read_nvlinks(clients.config().gpu.nvidia_smi, clients.config().hardware.nvlink_bytes_per_second,
                           clients.tools())
    aer = aer_counts(sysfs_root or clients.config().ib.sysfs_root, kernel)
    ofed = read_ofed(clients.config().ib.ofed_info, clients.tools())
    config = clients.config()
    gpus = check_gpus(config.gpu.nvidia_smi, clients.tools(), config.hardware.gpus_per_node)
    found = results(report) + storage_results(storage)
    if textfile:
        write_textfile(Path(textfile), metrics_text(found, now, storage, kernel, nvlinks, aer, ofed))
    passed = report.passed and storage.passed and not any(r.failed for r in gpus.found)
    result = NodeCheck(report=report, storage=storage, kernel=kernel, found=found, nvlinks=nvlinks, aer=aer,
                       ofed=ofed, gpus=gpus, exit_code=ExitCode.OK if passed else ExitCode.FAILING)
    # Slurm names a node by its short host name unless slurm.conf says otherwise: --node then.
    name = node or socket.gethostname().split(".")[0]
    if drain:
        drain_self(config, clients.slurm(), name, found, report, result=result.action, gpus=gpus)
        # a storage check fails the command, though it drains nothing
        result.exit_code = worst(result.exit_code, result.action.exit_code)
    if remediate:
        # After the drain decision: a node this run drained is not reset on top of it. The other checks'
        # failures make a passing diagnostic a failed validation (a reset fixes no InfiniBand port); the GPU
        # checks are not among them: the step's own wait for readiness and diag judge the GPUs.
        failed = [f"{r.check} {r.device}".strip() for r in found if r.failed]
        step = take_step(clients.config(), clients.slurm(), name, not failed,
                         "other checks failed: " + ", ".join(failed), result=result.action)
        result.action.lines.append(step.line)
    return result


def aer_counts(sysfs_root: str, kernel: KernelLogReport) -> dict[str, dict[str, int]]:
    """The PCIe AER counts of the node's GPUs, named gpu<index> by the index nvidia-smi gave them this boot (else
    by their PCI address), and of its HCAs, by name."""
    tree = read_pci_tree(sysfs_root)
    gpus = {}
    for bdf in tree.gpus:
        index = kernel.index(canonical_pci(bdf) or bdf)
        gpus[bdf if index is None else f"gpu{index}"] = bdf
    return read_aer(sysfs_root, {**gpus, **tree.hcas})


def aer_lines(aer: dict[str, dict[str, int]]) -> list[str]:
    """A line per device whose kernel counted AER errors, else one that says none did."""
    lines = [f"pcie aer {device}: " + ", ".join(f"{severity} {count}" for severity, count in sorted(counts.items())
                                                if count)
             for device, counts in sorted(aer.items()) if any(counts.values())]
    return lines or [f"pcie aer: no errors on {len(aer)} devices"]


def gpus_dict(gpus: GpuReport) -> dict[str, Any]:
    return {"answering": gpus.answering, "checks": [r.__dict__ for r in gpus.found], "skipped": gpus.skipped or None}


def ofed_dict(ofed: OfedVersion) -> dict[str, Any]:
    return {"distribution": ofed.distribution or None, "version": ofed.version or None, "note": ofed.note or None}


def ofed_lines(ofed: OfedVersion) -> list[str]:
    return [f"ofed: {ofed.distribution} {ofed.version}" if ofed.version else f"ofed not read: {ofed.note}"]


def storage_dict(storage: StorageReport) -> dict[str, Any]:
    return {
        "verdict": "pass" if storage.passed else "fail",
        "findings": [{"check": f.check, "device": f.device, "detail": f.detail} for f in storage.findings],
        "skipped": [{"check": check, "why": why} for check, why in sorted(storage.skipped.items())],
        "nfs": [{"mount": point, "ops": s.ops, "retransmissions": s.retransmissions,
                 "major_timeouts": s.major_timeouts} for point, s in sorted(storage.nfs.items())],
    }


def check_lines(result: NodeCheck) -> list[str]:
    """A line per check result (with the storage finding's detail), then one per NFS mount."""
    details = {(f.check, f.device): f.detail for f in result.storage.findings}
    lines = []
    for r in result.found + [r for r in result.gpus.found if r.failed]:
        detail = details.get((r.check, r.device), "")
        lines.append(f"{r.check:22} {r.device or '-':14} {'FAIL' if r.failed else 'ok'}  {detail}".rstrip())
    for point, stats in sorted(result.storage.nfs.items()):
        lines.append(f"nfs {point}: {stats.retransmissions} RPC retransmissions of {stats.ops} ops since mount")
    return lines + (list(result.gpus.lines) or [f"gpus not checked: {result.gpus.skipped}"])


def nvlink_dict(nvlinks: NvlinkReport) -> dict[str, Any]:
    return {"links": [{"gpu": gpu, "link": link, "bytes_per_second": speed}
                      for gpu, links in sorted(nvlinks.speeds.items()) for link, speed in sorted(links.items())],
            "note": nvlinks.note or None}


def nvlink_lines(nvlinks: NvlinkReport) -> list[str]:
    """One line for the links at full speed (nvlinks.full, as the textfile's series judge them), one per link
    below it or inactive."""
    links = [(gpu, link, speed) for gpu, per in sorted(nvlinks.speeds.items()) for link, speed in sorted(per.items())]
    if not links:
        return [f"nvlink not read: {nvlinks.note}" if nvlinks.note else "nvlink: no GPU lists a link"]
    slower = [f"nvlink gpu{gpu} link{link}: {f'{speed / 1e9:.3f} GB/s' if speed else 'inactive'}"
              for gpu, link, speed in links if speed < nvlinks.full]
    return [f"nvlink: {len(links) - len(slower)} of {len(links)} links at {nvlinks.full / 1e9:.3f} GB/s"] + slower


def kernel_log_dict(kernel: KernelLogReport) -> dict[str, Any]:
    """What this run found new in the kernel log; the counts so far are in the textfile."""
    events = [(seen, seen.event) for seen in kernel.seen]
    return {
        "source": kernel.source,
        "read_ok": kernel.read_ok,
        "skipped": [] if kernel.read_ok else [{"check": CHECK, "why": kernel.why}],
        "xids": [{"seq": seen.seq, "time": seen.time, "gpu": kernel.index(xid.pci), "pci_bus_id": xid.pci,
                  "xid": xid.code, "pid": xid.pid, "process": xid.process, "text": xid.text,
                  "recovery_action": xid.recovery_action} for seen, xid in events if isinstance(xid, Xid)],
        "sxids": [{"seq": seen.seq, "time": seen.time, "nvswitch_pci": sxid.pci, "sxid": sxid.code,
                   "fatal": sxid.fatal, "text": sxid.text} for seen, sxid in events if isinstance(sxid, SXid)],
        "recovery_actions": [{"gpu": kernel.index(pci), "pci_bus_id": pci, "action": action}
                             for pci, action in sorted(kernel.state.recovery.items())],
        "gpu_index_note": kernel.gpu_note or None,
    }


def kernel_log_lines(kernel: KernelLogReport) -> list[str]:
    if not kernel.read_ok:
        return [f"kernel log not checked: {kernel.why}"]
    lines = []
    for seen in kernel.seen:
        event = seen.event
        if isinstance(event, Xid):
            lines.append(f"kernel log: gpu {kernel.gpu(event.pci) or '?'} ({event.pci}) xid {event.code}: {event.text}")
        else:
            lines.append(f"kernel log: nvswitch {event.pci} sxid {event.code} "
                         f"{'fatal' if event.fatal else 'non-fatal'}: {event.text}")
    return lines or [f"kernel log {kernel.source}: no new XID or SXid"]
