"""Prometheus access: strict instant queries."""

from opsctl.prom.client import PromClientImpl, PromQuery, Sample, parse_vector

__all__ = ["PromClientImpl", "PromQuery", "Sample", "parse_vector"]
