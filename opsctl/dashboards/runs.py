"""opsctl itself: its runs and their duration, actions, refusals per safety rule, the circuit breaker,
unknown nodes, and how fresh its last successful run is (docs/observability.md lists the metrics)."""

from grafana_foundation_sdk.builders import dashboard as db

from opsctl.config.schema import duration_seconds
from opsctl.dashboards.common import Site, graph, mapping, new_dashboard, query, single, steps

UID = "opsctl-runs"
BREAKER = {0: ("closed", "green"), 1: ("tripped", "red")}


def _increase(metric: str, by: str) -> str:
    return f"sum by ({by}) (increase({metric}[$__rate_interval]))"


def build(site: Site) -> db.Dashboard:
    missing = float(duration_seconds(site.config.alerts.run_missing_after))
    dash = new_dashboard(UID, "What opsctl health did and whether it still runs.", site)
    dash = dash.with_row(db.Row("Now"))
    dash = dash.with_panel(single("Since the last successful run", "Time since a run last read Prometheus and Slurm "
                                  "and judged every node; OpsctlRunsStopped alerts from "
                                  f"{site.config.alerts.run_missing_after}.", "s",
                                  "time() - max(opsctl_last_success_timestamp_seconds)",
                                  steps("green", (missing, "red"))))
    dash = dash.with_panel(single("Circuit breaker", "Tripped: the last run found too many failing or unknown nodes "
                                  "and drained none.", "short", "max(opsctl_circuit_breaker_tripped)",
                                  steps("green", (1, "red")), mapping(BREAKER)))
    dash = dash.with_panel(single("Unknown nodes", "Nodes without fresh data in the last run: never acted on.",
                                  "short", 'max(opsctl_nodes{status="unknown"})', steps("green", (1, "orange"))))
    dash = dash.with_panel(single("Failing nodes", "Nodes whose status was fail in the last run.", "short",
                                  'max(opsctl_nodes{status="fail"})', steps("green", (1, "red"))))
    dash = dash.with_row(db.Row("Runs"))
    dash = dash.with_panel(graph("Runs by result", "ok 0, failing 1, usage 2, source-down 3, safety-stop 4 "
                                 "(the exit codes).", "short", [query(_increase("opsctl_runs_total", "result"),
                                                                      "{{result}}")]))
    dash = dash.with_panel(graph("Run duration", "90th percentile and mean wall time of a run.", "s", [
        query("histogram_quantile(0.9, sum by (le) (rate(opsctl_run_duration_seconds_bucket[$__rate_interval])))",
              "p90"),
        query("sum(rate(opsctl_run_duration_seconds_sum[$__rate_interval])) "
              "/ sum(rate(opsctl_run_duration_seconds_count[$__rate_interval]))", "mean", ref="B"),
    ]))
    dash = dash.with_row(db.Row("Actions and refusals"))
    dash = dash.with_panel(graph("Drains per rule", "Nodes drained, per rule in the reason.", "short",
                                 [query(_increase("opsctl_drains_total", "rule_id"), "{{rule_id}}")], width=8))
    dash = dash.with_panel(graph("Resumes per rule", "Nodes resumed, per rule of the lifted drain.", "short",
                                 [query(_increase("opsctl_resumes_total", "rule_id"), "{{rule_id}}")], width=8))
    dash = dash.with_panel(graph("Refusals per safety rule", "Actions refused: circuit-breaker, budget, not-owned, "
                                 "lock.", "short", [query(_increase("opsctl_refusals_total", "safety_rule"),
                                                          "{{safety_rule}}")], width=8))
    dash = dash.with_row(db.Row("Nodes"))
    dash = dash.with_panel(graph("Nodes per status", "Verdicts of each run.", "short",
                                 [query("max by (status) (opsctl_nodes)", "{{status}}")]))
    dash = dash.with_panel(graph("Slurm nodes per state", "Slurm's node states as opsctl read them.", "short",
                                 [query("max by (state) (opsctl_slurm_nodes)", "{{state}}")]))
    return dash
