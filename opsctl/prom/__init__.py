"""Prometheus access: strict instant queries."""

from opsctl.errors import redact
from opsctl.prom.client import PromClientImpl, PromQuery, Sample, answer_warnings, parse_vector

__all__ = ["PromClientImpl", "PromQuery", "Sample", "answer_warnings", "parse_vector", "redact"]
