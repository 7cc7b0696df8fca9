"""The Grafana dashboard is generated from the health catalog and shipped in dashboards/."""

import json

from opsctl.config.schema import parse_config
from opsctl.health.catalog import load_catalog
from opsctl.health.dashboard import render_grafana_dashboard
from tests.conftest import REPO


def _rules():
    return load_catalog(parse_config({}, "defaults"))


def test_shipped_dashboard_is_the_catalog_rendered():
    shipped = (REPO / "dashboards" / "opsctl-health.json").read_text()
    assert shipped == render_grafana_dashboard(_rules()), \
        "regenerate: opsctl rules export --format grafana > dashboards/opsctl-health.json"


def test_one_panel_per_rule_with_its_promql_and_threshold():
    rules = _rules()
    panels = [p for p in json.loads(render_grafana_dashboard(rules))["panels"] if p["type"] == "timeseries"]
    assert len(panels) == len(rules)
    by_id = {p["title"].split(" ")[0]: p for p in panels}
    for rule in rules:
        panel = by_id[rule.id]
        assert f"({rule.expr})" in panel["targets"][0]["expr"]
        assert panel["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == rule.threshold
