"""Health rules (a YAML catalog), their evaluation against Prometheus, and their export."""

from opsctl.health.catalog import Rule, load_catalog
from opsctl.health.evaluate import Check, Memory, NodeVerdict, Report, evaluate, judge
from opsctl.health.export import render_prometheus_rules

__all__ = ["Check", "Memory", "NodeVerdict", "Report", "Rule", "evaluate", "judge", "load_catalog",
           "render_prometheus_rules"]
