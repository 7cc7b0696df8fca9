"""The Grafana dashboards: generated from the catalog and the config (opsctl/dashboards), shipped in
dashboards/, valid for file provisioning, and with the catalog's thresholds. That every query parses and
returns data is tested against real Prometheus (tests/component, tests/integration/lab/test_dashboard_lab.py)."""

import json
import re

import pytest
import yaml

from opsctl.config import parse_config
from opsctl.dashboards import BUILDERS, render, render_all
from opsctl.health.catalog import load_catalog
from tests.conftest import REPO

DEFAULT = parse_config({}, "t", {})
SHIPPED = {p.name: p.read_text() for p in (REPO / "dashboards").glob("*.json")}
RENDERED = render_all(DEFAULT)
DASHBOARDS = {name: json.loads(text) for name, text in RENDERED.items()}


def panels(dashboard: dict) -> list[dict]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def thresholds(panel: dict) -> list:
    return [(s["value"], s["color"]) for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]]


def by_title(dashboard: dict, prefix: str) -> dict:
    return next(p for p in dashboard["panels"] if p.get("title", "").startswith(prefix))


def test_shipped_dashboards_are_the_generated_ones():
    assert SHIPPED == RENDERED, "regenerate: opsctl dashboards export --out dashboards"


def test_ready_for_file_provisioning():
    uids = [d["uid"] for d in DASHBOARDS.values()]
    assert len(set(uids)) == len(uids) == 5
    for name, dashboard in DASHBOARDS.items():
        assert name == f"{dashboard['uid']}.json" and dashboard["title"].startswith("opsctl: ")
        assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 39
        ids = [p["id"] for p in dashboard["panels"]]
        assert len(set(ids)) == len(ids) and 0 not in ids
        assert "DS_" not in RENDERED[name]


def test_no_datasource_uid_only_the_datasource_variable():
    for name, text in RENDERED.items():
        assert set(re.findall(r'"uid": "([^"]*)"', text)) == {"${datasource}"} | {DASHBOARDS[name]["uid"]}
        for panel in panels(DASHBOARDS[name]):
            if panel["type"] == "text":
                continue
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert all(t["datasource"]["uid"] == "${datasource}" and t["refId"] for t in panel["targets"])


def test_every_dashboard_has_datasource_node_and_gpu_variables():
    for dashboard in DASHBOARDS.values():
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
        for name in ("node", "gpu"):
            assert variables[name]["type"] == "query" and variables[name]["includeAll"]
            assert variables[name]["datasource"]["uid"] == "${datasource}"
    assert "hca" in {v["name"] for v in DASHBOARDS["opsctl-infiniband.json"]["templating"]["list"]}


def test_units_are_set_on_every_data_panel():
    for dashboard in DASHBOARDS.values():
        for panel in panels(dashboard):
            if panel["type"] not in ("text", "table"):
                assert panel["fieldConfig"]["defaults"].get("unit"), panel["title"]


def test_overview_links_to_every_detail_dashboard_and_they_link_back():
    links = {link["url"] for link in DASHBOARDS["opsctl-overview.json"]["links"]}
    assert links == {f"/d/{uid}" for uid in BUILDERS if uid != "opsctl-overview"}
    for name, dashboard in DASHBOARDS.items():
        if name != "opsctl-overview.json":
            assert [link["url"] for link in dashboard["links"]] == ["/d/opsctl-overview"]
        assert all(link["includeVars"] and link["keepTime"] for link in dashboard["links"])


def test_h200_thresholds_power_700w_and_temperature_from_the_catalog():
    gpu, overview = DASHBOARDS["opsctl-gpu.json"], DASHBOARDS["opsctl-overview.json"]
    assert thresholds(by_title(gpu, "GPU power")) == [(None, "green"), (700, "red")]
    assert thresholds(by_title(overview, "Highest GPU power")) == [(None, "green"), (700, "red")]
    assert thresholds(by_title(gpu, "gpu-temp-high")) == [(None, "green"), (87, "orange")]
    assert thresholds(by_title(overview, "Hottest GPU")) == [(None, "green"), (87, "orange")]
    # A rule that fails below its threshold is red below it: InfiniBand rate, from the hardware profile.
    assert thresholds(by_title(DASHBOARDS["opsctl-infiniband.json"], "ib-degraded")) == [(None, "red"),
                                                                                         (5e10, "green")]


def test_a_threshold_in_the_site_config_moves_the_dashboards_with_it():
    site = parse_config({"catalog": {"overrides": {"gpu-temp-high": {"threshold": 83}}},
                         "hardware": {"ib_rate_bytes_per_second": 2.5e10}}, "t", {})
    gpu = json.loads(render(site, "opsctl-gpu"))
    assert thresholds(by_title(gpu, "gpu-temp-high")) == [(None, "green"), (83, "orange")]
    overview = json.loads(render(site, "opsctl-overview"))
    assert thresholds(by_title(overview, "Hottest GPU")) == [(None, "green"), (83, "orange")]
    ib = json.loads(render(site, "opsctl-infiniband"))
    assert thresholds(by_title(ib, "ib-degraded")) == [(None, "red"), (2.5e10, "green")]


def test_one_site_threshold_moves_opsctls_verdict_its_alert_rule_and_its_dashboards_alike():
    """The three consumers of the catalog read one merged config: a GPU at 85 C is fine by the shipped
    87 C and a warning by a site's 83 C, in `opsctl health`, in the exported alert and on the dashboards."""
    from opsctl.health.catalog import load_catalog
    from opsctl.health.evaluate import judge
    from opsctl.health.export import render_prometheus_rules
    from opsctl.health.identity import Identities
    from opsctl.prom.client import Sample

    def everywhere(config):
        rules = load_catalog(config)
        targets = [{"job": job, "node": "gpu001", "instance": f"gpu001:{port}"} for job, port in (("dcgm", 9400),
                                                                                                ("node", 9100))]
        presence = [Sample(labels, 1.0) for labels in targets]
        ages = [Sample(labels, 5.0) for labels in targets]
        reported = [Sample({**targets[0], "__name__": "DCGM_FI_DEV_XID_ERRORS", "Hostname": "gpu001"}, 0.0)]
        answers = {"gpu-temp-high": [Sample({**targets[0], "gpu": "0"}, 85.0)]}
        verdict = judge(rules, answers, Identities(presence, reported, config), ages, {"gpu001"}, config, None,
                        1_800_000_000.0).nodes["gpu001"]
        exported = yaml.safe_load(render_prometheus_rules(rules))["groups"][0]["rules"]
        alert = next(r["expr"] for r in exported if r["alert"] == "OpsctlGpuTempHigh")
        dashboard = json.loads(render(config, "opsctl-gpu"))
        # The NaN-safe alert keeps what is not within "<= threshold" (opsctl/health/catalog.py, alert_expr).
        return (verdict.status, re.search(r" <= (\S+) > -Inf", alert).group(1),
                thresholds(by_title(dashboard, "gpu-temp-high"))[1][0])

    site = parse_config({"catalog": {"overrides": {"gpu-temp-high": {"threshold": 83}}}}, "t", {})
    assert everywhere(DEFAULT) == ("ok", "87", 87)
    assert everywhere(site) == ("warn", "83", 83)


def test_health_panels_plot_the_rules_promql_with_the_rate_interval_for_the_hold():
    gpu = DASHBOARDS["opsctl-gpu.json"]
    expr = by_title(gpu, "sbe-storm")["targets"][0]["expr"]
    assert expr.startswith('(rate(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{job="dcgm"}[$__rate_interval]) '
                           'and DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{job="dcgm"} offset $__rate_interval)')
    assert 'gpu=~"$gpu"' in expr and 'node=~"$node"' in expr


def test_rules_that_opsctl_holds_plot_their_value_without_the_hold():
    """gpu-count is held for two scrape intervals in the alert and in `opsctl health`; its panel plots the
    count itself, so a GPU that drops out shows at once."""
    expr = by_title(DASHBOARDS["opsctl-gpu.json"], "gpu-count")["targets"][0]["expr"]
    assert expr.startswith('(count by (node, job, instance) (DCGM_FI_DEV_GPU_TEMP{job="dcgm"})') and "[1m:" not in expr


def test_the_storage_dashboard_shows_how_old_the_node_check_results_are():
    panel = by_title(DASHBOARDS["opsctl-storage.json"], "node-check-stale")
    assert panel["targets"][0]["expr"].startswith(
        '(time() - max by (node, job, instance) (opsctl_node_check_timestamp_seconds{job="node"}))')
    assert panel["fieldConfig"]["defaults"]["thresholds"]["steps"][1] == {"color": "orange", "value": 300}


def test_job_names_and_node_label_come_from_the_config():
    site = parse_config({"prometheus": {"jobs": {"dcgm": "gpu-metrics", "node": "hosts"}},
                         "node_mapping": {"target_label": "instance_name"}}, "t", {})
    overview = json.loads(render(site, "opsctl-overview"))
    exprs = " ".join(t["expr"] for p in panels(overview) for t in p.get("targets", []))
    assert 'job="gpu-metrics"' in exprs and 'job=~"gpu-metrics|hosts"' in exprs and 'job="dcgm"' not in exprs
    assert 'max by (instance_name) (DCGM_FI_DEV_GPU_TEMP' in exprs
    node = next(v for v in overview["templating"]["list"] if v["name"] == "node")
    assert node["query"] == 'label_values(up{job=~"gpu-metrics|hosts"}, instance_name)'


def test_the_marked_row_waits_for_fabric_test_metrics():
    rows = [p["title"] for p in DASHBOARDS["opsctl-infiniband.json"]["panels"] if p["type"] == "row"]
    assert rows[-1] == "Fabric test: last results"


def test_the_storage_row_plots_every_storage_rule_of_the_catalog():
    storage = DASHBOARDS["opsctl-storage.json"]["panels"]
    titles = [p["title"] for p in storage]
    row = titles.index("Mount health and Lustre imports")
    shown = {title.split(":")[0] for title in titles[row + 1:]}
    rules = load_catalog(parse_config({}, "t", {}))
    assert shown == {r.id for r in rules if r.domain == "storage"} | {"node-check-stale"}
    assert all(p["type"] != "text" for p in storage[row + 1:])


def test_without_the_sdk_the_commands_name_the_extra(monkeypatch):
    """Head nodes have no grafana-foundation-sdk: the dashboard commands say which extra to install."""
    import sys

    from opsctl.commands.dashboards import _renderers
    from opsctl.errors import ConfigError

    for name in [m for m in sys.modules if m.startswith(("opsctl.dashboards", "grafana_foundation_sdk"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "grafana_foundation_sdk", None)
    with pytest.raises(ConfigError, match=r"opsctl\[dashboards\]"):
        _renderers()
