"""Every dashboard query runs in a real Prometheus holding the lab's metrics."""

import json

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.lab


def test_every_dashboard_query_is_valid_promql_with_data_where_expected(lab):
    dashboard = json.loads((REPO / "dashboards" / "opsctl-health.json").read_text())
    queries = [t["expr"].replace("$node", ".*") for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(queries) > 20
    for expr in queries:
        lab.query(expr)  # raises on a PromQL error
    node_filter = [t["expr"].replace("$node", "gpu020") for p in dashboard["panels"] if p["type"] == "timeseries"
                   for t in p["targets"] if "DCGM_FI_DEV_GPU_TEMP" in t["expr"]]
    assert node_filter and all(lab.nodes_matching(q) <= {"gpu020"} for q in node_filter)
