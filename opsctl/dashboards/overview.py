"""The cluster at a glance: nodes by opsctl status and Slurm state, drains and resumes, the GPUs'
utilisation, power and temperature across the cluster, and the nodes that need a person. Links lead
to the detail dashboards."""

from grafana_foundation_sdk.builders import dashboard as db

from opsctl.dashboards.common import (
    H200_POWER_LIMIT_WATTS,
    Site,
    graph,
    heat,
    listing,
    mapping,
    new_dashboard,
    query,
    rule_thresholds,
    single,
    steps,
    timeline,
)

UID = "opsctl-overview"
STATUS = {0: ("ok", "green"), 1: ("warn", "orange"), 2: ("fail", "red"), 3: ("unknown", "purple")}
DRAINED_SHARE = ('sum(max by (state) (opsctl_slurm_nodes{state=~"drained|draining"})) '
                 "/ sum(max by (state) (opsctl_slurm_nodes))")


def build(site: Site) -> db.Dashboard:
    gpus = f"{site.dcgm}, {site.on_gpu()}"
    per_node = f"{{{{{site.node}}}}}"
    fraction = site.config.alerts.drained_fraction
    dash = new_dashboard(UID, "Nodes by opsctl status and Slurm state, what opsctl did, the GPUs across the cluster, "
                         "and the nodes that need a person. The links lead to the detail dashboards.", site)
    dash = dash.with_row(db.Row("Nodes"))
    dash = dash.with_panel(graph("Nodes by opsctl status", "opsctl_nodes: the verdicts of the last health run.",
                                 "short", [query("max by (status) (opsctl_nodes)", "{{status}}")], width=8, height=7))
    dash = dash.with_panel(graph("Slurm nodes by state", "opsctl_slurm_nodes: Slurm's states as opsctl last read them "
                                 "(drained and draining apart).", "short",
                                 [query("max by (state) (opsctl_slurm_nodes)", "{{state}}")], width=8, height=7))
    dash = dash.with_panel(single("Drained share", f"Share of Slurm nodes drained; OpsctlManyNodesDrained alerts "
                                  f"above {fraction:.0%}.", "percentunit", DRAINED_SHARE,
                                  steps("green", (fraction, "red")), width=4, height=7))
    dash = dash.with_panel(single("Exporter targets down", "dcgm-exporter and node_exporter targets that do not "
                                  "answer: their nodes are unknown to opsctl.", "short",
                                  f"count(up{{{site.exporters}}} == 0) or vector(0)", steps("green", (1, "red")),
                                  width=4, height=7))
    dash = dash.with_panel(listing("Nodes that need a person", "Drained by opsctl for a rule that never resumes on "
                                   "its own: follow the rule's remediation, then `opsctl resume`.",
                                   'max by (slurm_node, rule_id) (opsctl_node_needs_person{slurm_node=~"$node"})'
                                   " == 1", width=12))
    dash = dash.with_panel(graph("Drains and resumes", "What opsctl health did, per rule.", "short", [
        query("sum by (rule_id) (increase(opsctl_drains_total[$__rate_interval]))", "drain {{rule_id}}"),
        query("sum by (rule_id) (increase(opsctl_resumes_total[$__rate_interval]))", "resume {{rule_id}}", ref="B"),
    ], width=12))
    dash = dash.with_panel(timeline("opsctl status per node", "opsctl_node_status of every node over time.", "short",
                                    'max by (slurm_node) (opsctl_node_status{slurm_node=~"$node"})', "{{slurm_node}}",
                                    steps("green", (1, "orange"), (2, "red"), (3, "purple")), mapping(STATUS)))
    dash = dash.with_row(db.Row("GPUs across the cluster"))
    dash = dash.with_panel(heat("GPU utilisation", "How the utilisation of every picked GPU is spread over time.",
                                "percent", f"DCGM_FI_DEV_GPU_UTIL{{{gpus}}}"))
    dash = dash.with_panel(heat("GPU power", "How the board power of every picked GPU is spread over time.", "watt",
                                f"DCGM_FI_DEV_POWER_USAGE{{{gpus}}}"))
    dash = dash.with_panel(timeline("Highest GPU power per node", f"The node's GPU that draws most; red from the H200 "
                                    f"limit of {H200_POWER_LIMIT_WATTS:g} W.", "watt",
                                    f"max by ({site.node}) (DCGM_FI_DEV_POWER_USAGE{{{gpus}}})", per_node,
                                    steps("green", (H200_POWER_LIMIT_WATTS, "red")), width=12))
    dash = dash.with_panel(timeline("Hottest GPU per node", "The node's hottest GPU; coloured by the threshold of the "
                                    "rule `gpu-temp-high`.", "celsius",
                                    f"max by ({site.node}) (DCGM_FI_DEV_GPU_TEMP{{{gpus}}})", per_node,
                                    rule_thresholds(site.rules["gpu-temp-high"]), width=12))
    return dash
