"""Safe remediation: drain and resume plans, the lock, the budget and the audit log."""

from opsctl.remediation.audit import AuditLog
from opsctl.remediation.plan import Plan, drain_reason, plan_drains, plan_resumes
from opsctl.remediation.run import RunOptions, RunResult, run_health

__all__ = ["AuditLog", "Plan", "RunOptions", "RunResult", "drain_reason", "plan_drains", "plan_resumes",
           "run_health"]
