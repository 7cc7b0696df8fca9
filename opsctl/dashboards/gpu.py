"""GPU health: every GPU rule of the catalog, per node and GPU, with the catalog's thresholds."""

from grafana_foundation_sdk.builders import dashboard as db

from opsctl.dashboards.common import (
    H200_POWER_LIMIT_WATTS,
    Site,
    graph,
    listing,
    new_dashboard,
    query,
    rule_graph,
    rule_thresholds,
    steps,
)

UID = "opsctl-gpu"


def _xid_panels(site: Site) -> list:
    drain = sorted(r.xid for r in site.rules.values() if r.xid is not None and r.action == "drain")
    report = sorted(r.xid for r in site.rules.values() if r.xid is not None and r.action == "report")
    legend = f"{{{{{site.node}}}}} gpu{{{{gpu}}}} xid {{{{xid}}}}"
    if site.config.catalog.xid_source == "window":
        expr = f"max by ({site.node}, gpu, xid) (DCGM_EXP_XID_ERRORS_COUNT{{{site.dcgm}, {site.on_gpu()}}})"
        what = "dcgm-exporter's windowed XID count (DCGM_EXP_XID_ERRORS_COUNT)"
    else:
        expr = f"DCGM_FI_DEV_XID_ERRORS{{{site.dcgm}, {site.on_gpu()}}} > 0"
        what = "the last XID of each GPU (DCGM_FI_DEV_XID_ERRORS)"
    some = next(r for r in site.rules.values() if r.xid is not None)
    description = (f"{what}. XIDs that drain: {', '.join(map(str, drain))}; reported only: "
                   f"{', '.join(map(str, report))} (catalog rules xid-N).")
    return [
        graph("XIDs per GPU", description, "short", [query(expr, legend)], rule_thresholds(some)),
        listing("Last XID per GPU", "DCGM_FI_DEV_XID_ERRORS keeps a GPU's last XID until the driver reloads.",
                f"DCGM_FI_DEV_XID_ERRORS{{{site.dcgm}, {site.on_gpu()}}} > 0"),
    ]


def build(site: Site) -> db.Dashboard:
    gpus = f"DCGM_FI_DEV_GPU_TEMP{{{site.dcgm}, {site.on_gpu()}}}"
    nodes = f"up{{{site.dcgm}, {site.on_node()}}}"
    dash = new_dashboard(UID, "What opsctl health judges GPUs by: the catalog's GPU rules, each with its threshold "
                         "(site overrides included).", site)
    dash = dash.with_row(db.Row("XIDs"))
    for panel in _xid_panels(site):
        dash = dash.with_panel(panel)
    dash = dash.with_row(db.Row("Memory: ECC and row remapping"))
    for rule_id, title in (("ecc-dbe-new", "new double-bit ECC errors"), ("sbe-storm", "single-bit ECC errors/s"),
                           ("row-remap-failure", "row remap failed"), ("row-remap-pending", "row remap pending"),
                           ("remapped-rows-high", "uncorrectable remapped rows")):
        dash = dash.with_panel(rule_graph(site, rule_id, title, gpus))
    dash = dash.with_row(db.Row("NVSwitch fabric"))
    dash = dash.with_panel(rule_graph(site, "fabric-not-ready", "GPU fabric status held short of Success", gpus))
    dash = dash.with_panel(rule_graph(site, "fabric-manager-down", "GPUs whose fabric nothing trains", nodes))
    dash = dash.with_panel(rule_graph(site, "nvswitch-fatal", "Fatal NVSwitch SXids in their window", nodes,
                                      by_device=False))
    dash = dash.with_panel(rule_graph(site, "nvswitch-errors", "Non-fatal NVSwitch SXids in their window", nodes,
                                      by_device=False))
    dash = dash.with_row(db.Row("Settings: ECC, MIG, compute and persistence modes, firmware"))
    for rule_id, title in (("ecc-disabled", "ECC mode (1 enabled)"), ("mig-enabled", "MIG mode (1 enabled)"),
                           ("compute-mode", "compute mode (0 Default, 1 Prohibited, 2 Exclusive_Process)"),
                           ("persistence-off", "persistence mode (1 enabled)")):
        dash = dash.with_panel(rule_graph(site, rule_id, title, gpus, width=6))
    dash = dash.with_panel(rule_graph(site, "firmware-drift", "GPU firmware against the fleet's or the pinned "
                                      "version (1 differs)", nodes, width=12, by_device=False))
    dash = dash.with_panel(rule_graph(site, "version-drift", "HCA firmware, driver and OFED against the "
                                      "fleet's (1 differs)", nodes, width=12, by_device=False))
    dash = dash.with_row(db.Row("NVLink and PCIe"))
    dash = dash.with_panel(rule_graph(site, "nvlink-down", "NVLinks inactive (1)", nodes, by_device=False))
    dash = dash.with_panel(rule_graph(site, "nvlink-degraded", "NVLink speed, share of its full speed",
                                      nodes, unit="percentunit", by_device=False))
    dash = dash.with_panel(rule_graph(site, "nvlink-errors-rising", "NVLink errors/s", gpus))
    dash = dash.with_panel(rule_graph(site, "pcie-replays", "PCIe replays/s", gpus))
    dash = dash.with_panel(rule_graph(site, "pcie-aer-rising", "PCIe AER errors/min per GPU and HCA", nodes,
                                      by_device=False))
    dash = dash.with_panel(rule_graph(site, "pcie-downtrained", "PCIe link's share of its maximum width and speed",
                                      gpus))
    dash = dash.with_row(db.Row("Clocks, thermals and power"))
    dash = dash.with_panel(rule_graph(site, "clock-slowdown", "Busy GPU's clocks held down (slowdown reason mask)",
                                      gpus))
    dash = dash.with_panel(rule_graph(site, "clocks-hw-slowdown", "HW slowdown or HW thermal clock events", gpus))
    dash = dash.with_panel(rule_graph(site, "gpu-temp-high", "GPU temperature", gpus, unit="celsius"))
    dash = dash.with_panel(graph(
        "GPU power", f"Board power per GPU; an H200 SXM is limited to {H200_POWER_LIMIT_WATTS:g} W.", "watt",
        [query(f"DCGM_FI_DEV_POWER_USAGE{{{site.dcgm}, {site.on_gpu()}}}", f"{{{{{site.node}}}}} gpu{{{{gpu}}}}")],
        steps("green", (H200_POWER_LIMIT_WATTS, "red"))))
    dash = dash.with_panel(rule_graph(site, "gpu-count", "GPUs visible per node", nodes))
    return dash
