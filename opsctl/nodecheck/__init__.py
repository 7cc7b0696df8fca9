"""`opsctl node check`: every node-local check, its result for node_exporter's textfile collector (report),
the XIDs of the kernel log (kernel_log), and, as Slurm's HealthCheckProgram, the node draining itself
(drain_self)."""

from opsctl.nodecheck.drain_self import drain_self, shared_shaped
from opsctl.nodecheck.kernel_log import KernelLogReport, check_kernel_log
from opsctl.nodecheck.report import (
    NODE,
    REASON_PREFIX,
    RULE,
    CheckResult,
    metrics_text,
    results,
    storage_results,
    write_textfile,
)

__all__ = ["NODE", "REASON_PREFIX", "RULE", "CheckResult", "KernelLogReport", "check_kernel_log", "drain_self",
           "metrics_text", "results", "shared_shaped", "storage_results", "write_textfile"]
