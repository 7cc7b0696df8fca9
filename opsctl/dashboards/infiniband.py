"""InfiniBand fabric: port state, rate, error counters and traffic per node and HCA (node_exporter's
InfiniBand collector), with the catalog's InfiniBand rules and their thresholds, and the last fabric test's
Gb/s per node and rail with its culprits (opsctl/fabrictest/textfile.py)."""

from grafana_foundation_sdk.builders import dashboard as db

from opsctl.dashboards.common import (
    Site,
    graph,
    listing,
    mapping,
    new_dashboard,
    query,
    rule_graph,
    single,
    steps,
    timeline,
)
from opsctl.fabrictest.pairing import Thresholds

UID = "opsctl-infiniband"
DEAD_GBPS = Thresholds().dead_gbps  # the fabric test's "dead": no traffic
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
    return _fabric_test(site, dash)


def _fabric_test(site: Site, dash: db.Dashboard) -> db.Dashboard:
    """The last `opsctl ib fabric-test` run's figures (opsctl/fabrictest/textfile.py, from node_exporter's textfile
    collector on the host that ran it): the same rails x nodes grid as its --html picture."""
    ib = site.config.ib
    rails = 'slurm_node=~"$node", device=~"$hca"'
    per_rail = "{{slurm_node}} {{device}}"
    dash = dash.with_row(db.Row("Fabric test: last results"))
    dash = dash.with_panel(timeline(
        "Fabric test: Gb/s per node and rail", "What the last `opsctl ib fabric-test` measured on each node's rail "
        f"(ib_write_bw, Gb/s): below {ib.slow_gbps:g} (ib.slow_gbps) is slow, below {DEAD_GBPS:g} dead. A culprit "
        "shows its worst measurement, any other rail its last against a partner not named on that rail. Each run "
        "replaces the figures; a rail the run did not test has none.", "Gbits",
        f"max by (slurm_node, device) (opsctl_fabric_test_rail_gbps{{{rails}}})", per_rail,
        steps("red", (DEAD_GBPS, "orange"), (ib.slow_gbps, "green")), height=16))
    dash = dash.with_panel(listing(
        "Fabric test: culprits", "The nodes' rails the last fabric test named slow or dead (`opsctl ib fabric-test "
        "--drain` drains them as opsctl:ib-fabric).",
        f"max by (slurm_node, device, rail) (opsctl_fabric_test_culprit{{{rails}}}) == 1", width=16))
    return dash.with_panel(single(
        "Fabric test: age of the results", "Time since the last fabric test ended: the row shows that run.", "s",
        "time() - max(opsctl_fabric_test_timestamp_seconds)", steps("green", (7 * 86400, "orange")), width=8,
        height=8))
