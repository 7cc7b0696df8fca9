"""`opsctl node check`: every node-local check, for a person, node_exporter and Slurm's HealthCheckProgram.

Exit codes: 0 every check passes, 1 a check failed, 2 usage or config error, 3 the hardware could not be read.
The kernel log's XIDs change none of them (the health rules judge them from Prometheus), nor does a kernel
log that cannot be read (`kernel_log.read_ok`, docs/gpu-kernel-log.md).
"""

import json
import socket
import time
from pathlib import Path

import click

from opsctl.clients import Clients
from opsctl.commands.render import JSON_SCHEMA
from opsctl.errors import ExitCode, worst
from opsctl.gpu.kmsg import SXid, Xid
from opsctl.ib.report import check_report, report_dict
from opsctl.nodecheck import drain_self, metrics_text, results, storage_results, write_textfile
from opsctl.nodecheck.kernel_log import CHECK, KernelLogReport, check_kernel_log
from opsctl.ladder.node_step import take_step
from opsctl.actor.result import ActionResult
from opsctl.storage.check import StorageReport, storage_report


def node_check(clients: Clients, as_json: bool, textfile: str | None, drain: bool, node: str | None,
               window: float | None, sysfs_root: str | None, remediate: bool = False) -> ExitCode:
    # Before anything reads it: --drain-self and --remediate-self change the node in Slurm.
    clients.config(acting=drain or remediate)
    report = check_report(clients.config().ib, None, None, window, sysfs_root)
    storage = storage_report(clients.config().storage)
    now = time.time()
    kernel = check_kernel_log(clients.config().gpu, clients.config().state_dir, now)
    found = results(report) + storage_results(storage)
    if textfile:
        write_textfile(Path(textfile), metrics_text(found, now, storage, kernel))
    code = ExitCode.OK if report.passed and storage.passed else ExitCode.FAILING
    outcome = ActionResult()
    if drain:
        # Slurm names a node by its short host name unless slurm.conf says otherwise: --node then.
        outcome = drain_self(clients.config(), clients.slurm(), node or socket.gethostname().split(".")[0], found,
                             report)
        code = worst(code, outcome.exit_code)  # a storage check fails the command, though it drains nothing
    if remediate:
        # After the drain decision: a node this run drained is not reset on top of it. The other checks'
        # failures make a passing diagnostic a failed validation (a reset fixes no InfiniBand port).
        failed = [f"{r.check} {r.device}".strip() for r in found if r.failed]
        step = take_step(clients.config(), clients.slurm(), node or socket.gethostname().split(".")[0],
                         not failed, "other checks failed: " + ", ".join(failed))
        outcome.lines.append(step.line)
    action = "\n".join(outcome.lines)
    if as_json:
        click.echo(json.dumps({"schema": JSON_SCHEMA, **report_dict(report), "checks": [r.__dict__ for r in found],
                               "storage": storage_dict(storage), "kernel_log": kernel_log_dict(kernel),
                               "action": action}, indent=1))
    else:
        details = {(f.check, f.device): f.detail for f in storage.findings}
        for r in found:
            detail = details.get((r.check, r.device), "")
            click.echo(f"{r.check:22} {r.device or '-':14} {'FAIL' if r.failed else 'ok'}  {detail}".rstrip())
        for point, stats in sorted(storage.nfs.items()):
            click.echo(f"nfs {point}: {stats.retransmissions} RPC retransmissions of {stats.ops} ops since mount")
        for line in kernel_log_lines(kernel):
            click.echo(line)
        if action:
            click.echo(action)
    return code


def storage_dict(storage: StorageReport) -> dict:
    return {
        "verdict": "pass" if storage.passed else "fail",
        "findings": [{"check": f.check, "device": f.device, "detail": f.detail} for f in storage.findings],
        "skipped": [{"check": check, "why": why} for check, why in sorted(storage.skipped.items())],
        "nfs": [{"mount": point, "ops": s.ops, "retransmissions": s.retransmissions,
                 "major_timeouts": s.major_timeouts} for point, s in sorted(storage.nfs.items())],
    }


def kernel_log_dict(kernel: KernelLogReport) -> dict:
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
