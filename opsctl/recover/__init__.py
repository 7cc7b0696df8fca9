"""Requeue a job that a node's fault ended, without that node (docs/recover.md)."""
