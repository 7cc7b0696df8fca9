"""`opsctl job-health`: the node that hangs or slows a running multi-node job (docs/job-health.md)."""
