"""Prometheus access: strict instant queries."""

from opsctl.prom.client import PromClientImpl, PromQuery, Sample, answer_warnings, parse_vector, redact

__all__ = ["PromClientImpl", "PromQuery", "Sample", "answer_warnings", "parse_vector", "redact"]
