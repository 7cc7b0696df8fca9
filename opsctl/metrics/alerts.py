"""Alerts about opsctl itself and the monitoring it stands on, exported beside the health rules.

They read opsctl's own metrics (opsctl/metrics/state.py) and `up`, so they work whether the metrics
come from `--watch` or from the timer's textfile. Two sources may serve the same series (a textfile
and a `--watch` endpoint): every expression aggregates with max, so one node never counts twice.
Per-node alerts get the label `node` (from the metrics' `slurm_node`), the label that the health
rules' alerts carry, so Alertmanager groups and inhibits both alike.
"""

from typing import Any

from opsctl.config.schema import Config, duration_seconds

GROUP = "opsctl-system"
# The inhibition source for "this node is already out": routed to no receiver (alertmanager role).
NODE_DRAINED = "OpsctlNodeDrained"


def _as_node(expr: str) -> str:
    return f'label_replace({expr}, "node", "$1", "slurm_node", "(.+)")'


def _alert(name: str, rule_id: str, severity: str, expr: str, summary: str, remediation: str,
           hold: str = "") -> dict[str, Any]:
    alert: dict[str, Any] = {"alert": name, "expr": expr}
    if hold:
        alert["for"] = hold
    # Without a rule_id of its own, an alert keeps the one of the series it reads.
    alert["labels"] = {"severity": severity, **({"rule_id": rule_id} if rule_id else {})}
    alert["annotations"] = {"summary": summary, "remediation": remediation}
    return alert


def system_alerts(config: Config) -> dict[str, Any]:
    """The `opsctl-system` rule group, with the thresholds of the `alerts:` config section."""
    jobs = "|".join(config.prometheus.jobs.values())  # a site without node_exporter has only dcgm
    missing = duration_seconds(config.alerts.run_missing_after)
    drained = 'max by (state) (opsctl_slurm_nodes{state=~"drained|draining"})'
    rules = [
        _alert("OpsctlRunsStopped", "opsctl-runs-stopped", "fail",
               f"time() - max(opsctl_last_success_timestamp_seconds) > {missing}"
               " or absent(opsctl_last_success_timestamp_seconds)",
               f"No opsctl health run has read its sources and judged every node for "
               f"{config.alerts.run_missing_after}: nothing drains failing nodes.",
               "systemctl status opsctl-health.service; journalctl -u opsctl-health: a config error (exit 2) or "
               "an unreachable Prometheus or Slurm (exit 3) is named there.", hold="1m"),
        _alert("OpsctlCircuitBreakerTripped", "opsctl-circuit-breaker", "fail",
               "max(opsctl_circuit_breaker_tripped) == 1",
               "The circuit breaker stopped opsctl from draining: too many nodes fail, or have no data, at once.",
               "Look for a cause shared by many nodes (fabric, exporters, Prometheus) before draining by hand; "
               "`opsctl history` shows the refusals."),
        _alert("OpsctlExporterDown", "opsctl-exporter-down", "warn",
               f'up{{job=~"{jobs}"}} == 0',
               "An exporter that opsctl judges nodes by does not answer: the node is unknown and never acted on.",
               "systemctl status prometheus-node-exporter or dcgm-exporter on the node.",
               hold=str(config.alerts.exporter_down_for)),
        _alert("OpsctlManyNodesDrained", "opsctl-many-drained", "fail",
               f"sum({drained}) / sum(max by (state) (opsctl_slurm_nodes)) > {config.alerts.drained_fraction:g}",
               f"More than {config.alerts.drained_fraction:.0%} of the Slurm nodes are drained.",
               "`opsctl nodes` lists who drained what; resume what is fixed."),
        # rule_id is the drain's rule, so this alert groups with that rule's own alert for the node.
        _alert("OpsctlNodeNeedsPerson", "", "fail",
               _as_node("max by (slurm_node, rule_id) (opsctl_node_needs_person) == 1"),
               "opsctl drained this node for a rule that never resumes on its own.",
               "Follow the rule's remediation (`opsctl rules list`), then `opsctl resume <node>`."),
        # A running job's node that hangs or slows it (`opsctl job-health --queue`, docs/job-health.md): a reason
        # to look, never a drain. Only while its runs go on: a textfile that a stopped timer left raises nothing.
        _alert("OpsctlJobHealthVerdict", "opsctl-job-health", "warn",
               _as_node("max by (slurm_job, slurm_node, verdict, signal) (opsctl_job_health_verdict) == 1")
               + f" and on() (time() - max(opsctl_job_health_last_run_timestamp_seconds) < {missing})",
               "A running multi-node job hangs or runs slow, and opsctl job-health names the node (or, for a "
               "hung job, none stands out).",
               "`opsctl why <slurm_job>` shows the signals; the node is queued for `opsctl validate`. Tell the "
               "job's owner: requeueing the job without the node may save it."),
        _alert(NODE_DRAINED, "opsctl-node-drained", "info",
               _as_node("max by (slurm_node) (opsctl_node_drained) == 1"),
               "The node is drained in Slurm; its per-GPU and per-HCA alerts are inhibited.",
               "None: this alert only silences the alerts of a node that is already out of service."),
    ]
    return {"name": GROUP, "rules": rules}
