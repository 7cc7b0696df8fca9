"""Safe remediation: drain and resume plans, handled events, the lock, the budgets and the audit log."""

from opsctl.remediation.audit import AuditLog
from opsctl.remediation.memory import Handled, HandledMemory
from opsctl.remediation.plan import Decision, Plan, drain_reason, plan_drains, plan_resumes
from opsctl.remediation.run import RunAborted, RunOptions, RunResult, run_health

__all__ = ["AuditLog", "Decision", "Handled", "HandledMemory", "Plan", "RunAborted", "RunOptions", "RunResult",
           "drain_reason", "plan_drains", "plan_resumes", "run_health"]
