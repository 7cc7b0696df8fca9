"""`opsctl why JOB` (which node ended a failed job) and the suspicion score: a job's nodes and time
window from Slurm's accounting, joined with what opsctl knows about them over that window (docs/why.md)."""
