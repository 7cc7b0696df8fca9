"""Storage: filesystems (free space, read-only, device errors), NVMe traffic and NFS client calls, from
node_exporter; mount health, Lustre imports, LNet and NFS retransmissions from `opsctl node check` (its
textfile, read by node_exporter), with the catalog's storage rules and their thresholds (docs/storage.md)."""

from grafana_foundation_sdk.builders import dashboard as db

from opsctl.dashboards.common import Site, graph, listing, new_dashboard, query, rule_graph, steps

UID = "opsctl-storage"
# Shared and local data filesystems of a GPU node; tmpfs and overlay are left out.
FSTYPES = "nfs|nfs4|lustre|xfs|ext4"


def build(site: Site) -> db.Dashboard:
    fs = f'{site.node_exporter}, {site.on_node()}, fstype=~"{FSTYPES}"'
    per_mount = f"{{{{{site.node}}}}} {{{{mountpoint}}}}"
    nvme = f'{site.node_exporter}, {site.on_node()}, device=~"nvme.+"'
    dash = new_dashboard(UID, "Filesystems, NVMe and NFS client activity of every node (node_exporter).", site)
    dash = dash.with_row(db.Row("Filesystems"))
    dash = dash.with_panel(graph(
        "Free space", "Available share of each data filesystem.", "percentunit",
        [query(f"node_filesystem_avail_bytes{{{fs}}} / node_filesystem_size_bytes{{{fs}}}", per_mount)],
        steps("red", (0.05, "orange"), (0.15, "green"))))
    dash = dash.with_panel(listing("Read-only or failing filesystems",
                                   "Mounts that went read-only, or whose device node_exporter cannot stat.",
                                   f"node_filesystem_readonly{{{fs}}} == 1 "
                                   f"or node_filesystem_device_error{{{fs}}} == 1"))
    dash = dash.with_row(db.Row("NVMe"))
    for direction in ("read", "written"):
        dash = dash.with_panel(graph(
            f"NVMe bytes {direction}", f"Bytes {direction} per second per NVMe device.", "Bps",
            [query(f"rate(node_disk_{direction}_bytes_total{{{nvme}}}[$__rate_interval])",
                   f"{{{{{site.node}}}}} {{{{device}}}}")]))
    dash = dash.with_row(db.Row("NFS client"))
    dash = dash.with_panel(graph(
        "NFS requests", "NFS client calls per second, by procedure.", "reqps",
        [query(f"sum by ({site.node}, method) (rate(node_nfs_requests_total{{{site.node_exporter}, {site.on_node()}}}"
               "[$__rate_interval]))", f"{{{{{site.node}}}}} {{{{method}}}}")], width=24))
    # The storage rules read `opsctl node check`'s results: each panel keeps the picked nodes' series.
    dash = dash.with_row(db.Row("Mount health and Lustre imports"))
    checks = f"opsctl_node_check{{{site.node_exporter}, {site.on_node()}}}"
    for rule_id, title, label in (("storage-mount-missing", "mount missing (1)", "mount"),
                                  ("storage-mount-hung", "mount hung (1)", "mount"),
                                  ("storage-probe-failed", "probe failed (1)", "mount"),
                                  ("lustre-import-down", "Lustre import down (1)", "target"),
                                  ("lnet-ni-down", "LNet NI down (1)", "nid"),
                                  ("lustre-mgs-unreachable", "Lustre MGS unreachable (1)", "nid")):
        picked = f'label_replace({checks}, "{label}", "$1", "device", "(.*)")'
        dash = dash.with_panel(rule_graph(site, rule_id, title, picked))
    # node-check and the storage rules judge the last results the node check wrote: how old they are.
    stamps = f"opsctl_node_check_timestamp_seconds{{{site.node_exporter}, {site.on_node()}}}"
    dash = dash.with_panel(rule_graph(site, "node-check-stale", "age of the node check results", stamps, unit="s",
                                      width=24))
    retransmissions = f"opsctl_node_nfs_rpc_retransmissions_total{{{site.node_exporter}, {site.on_node()}}}"
    dash = dash.with_panel(rule_graph(site, "nfs-retransmissions", "NFS retransmissions/s", retransmissions,
                                      width=24))
    return dash
