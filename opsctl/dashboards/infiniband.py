"""InfiniBand fabric: port state, rate, error counters and traffic per node and HCA (node_exporter's
InfiniBand collector), with the catalog's InfiniBand rules and their thresholds."""

from grafana_foundation_sdk.builders import dashboard as db

from opsctl.dashboards.common import Site, graph, mapping, new_dashboard, note, query, rule_graph, steps, timeline

UID = "opsctl-infiniband"
# node_infiniband_state_id / physical_state_id, as sysfs numbers them (ib_verbs port states).
PORT_STATES = {1: ("DOWN", "red"), 2: ("INIT", "orange"), 3: ("ARMED", "orange"), 4: ("ACTIVE", "green"),
               5: ("ACTIVE_DEFER", "orange")}
PHYS_STATES = {1: ("Sleep", "red"), 2: ("Polling", "red"), 3: ("Disabled", "red"), 4: ("PortConfigTraining", "orange"),
               5: ("LinkUp", "green"), 6: ("LinkErrorRecovery", "orange"), 7: ("PhyTest", "orange")}
COUNTERS = (
    ("node_infiniband_link_error_recovery_total", "link error recoveries/s"),
    ("node_infiniband_link_downed_total", "link downs/s"),
    ("node_infiniband_port_errors_received_total", "receive errors/s"),
    ("node_infiniband_port_discards_transmitted_total", "transmit discards/s"),
)


def build(site: Site) -> db.Dashboard:
    hcas = f'{site.node_exporter}, {site.on_node()}, device=~"$hca"'
    per_port = f"{{{{{site.node}}}}} {{{{device}}}}"
    ports = f"node_infiniband_state_id{{{hcas}}}"
    dash = new_dashboard(UID, "Port state, rate, errors and traffic of every HCA, with the catalog's InfiniBand rules. "
                         f"The rules see only the compute rails ({site.config.ib.rails_regex}); storage and "
                         "Ethernet ports show here too.", site, hca=True)
    down = site.rules["ib-down"]
    dash = dash.with_row(db.Row("Ports"))
    dash = dash.with_panel(timeline("Port state", "node_infiniband_state_id per node and HCA; the rule `ib-down` "
                                    f"drains below {down.threshold:g} (ACTIVE).", "short", ports, per_port,
                                    steps("red", (down.threshold, "green")), mapping(PORT_STATES)))
    dash = dash.with_panel(timeline("Physical state", "node_infiniband_physical_state_id: LinkUp (5) is healthy.",
                                    "short", f"node_infiniband_physical_state_id{{{hcas}}}", per_port,
                                    steps("red", (5, "green"), (6, "orange")), mapping(PHYS_STATES)))
    dash = dash.with_panel(rule_graph(site, "ib-down", "port state (4 is ACTIVE)", ports))
    dash = dash.with_panel(rule_graph(site, "ib-degraded", "port rate", ports, unit="Bps"))
    dash = dash.with_row(db.Row("Errors"))
    dash = dash.with_panel(rule_graph(site, "ib-errors", "link errors/s on compute rails", ports, width=24))
    for metric, title in COUNTERS:
        dash = dash.with_panel(graph(title.capitalize(), f"rate({metric}) per node and HCA.", "cps",
                                     [query(f"rate({metric}{{{hcas}}}[$__rate_interval])", per_port)],
                                     steps("green", (site.rules["ib-errors"].threshold, "orange"))))
    dash = dash.with_row(db.Row("Traffic"))
    for direction in ("received", "transmitted"):
        dash = dash.with_panel(graph(
            f"Data {direction}", f"Bytes {direction} per second per node and HCA (port data counters).", "Bps",
            [query(f"rate(node_infiniband_port_data_{direction}_bytes_total{{{hcas}}}[$__rate_interval])", per_port)],
            steps("green", (site.config.hardware.ib_rate_bytes_per_second, "orange"))))
    # The place of the fabric test's results: node_exporter has no such metric; opsctl exports none yet.
    dash = dash.with_row(db.Row("Fabric test: last results"))
    dash = dash.with_panel(note("Fabric test", "The results of the last fabric test (bandwidth per rail and node "
                                "pair, and the nodes it named) belong in this row; opsctl exports no fabric test "
                                "metrics yet, so the row shows only node_exporter's counters above."))
    return dash
