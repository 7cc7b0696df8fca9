"""Every query of every shipped dashboard is PromQL that Prometheus' own parser accepts: promtool checks
them as recording rules, with Grafana's variables replaced as Grafana would (All, the rate interval)."""

import json
import re
import shutil
import subprocess

import pytest
import yaml

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool (make deps-lab)")
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$node": ".*", "$gpu": ".*", "$hca": ".*"}


def as_promql(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    # $1, $2: label_replace's references to its regex's groups, not Grafana variables
    assert "$" not in re.sub(r"\$\d", "", expr), f"unknown Grafana variable in {expr}"
    return expr


def dashboard_queries() -> list[tuple[str, str]]:
    found = []
    for path in sorted((REPO / "dashboards").glob("*.json")):
        dashboard = json.loads(path.read_text())
        found += [(f"{path.stem}: {p['title']}", as_promql(t["expr"]))
                  for p in dashboard["panels"] for t in p.get("targets", [])]
    return found


def test_every_panel_query_parses(tmp_path):
    queries = dashboard_queries()
    assert len(queries) > 40
    rules = {"groups": [{"name": "dashboards", "rules": [{"record": f"dashboard:query_{i}", "expr": expr}
                                                         for i, (_, expr) in enumerate(queries)]}]}
    (tmp_path / "queries.yml").write_text(yaml.safe_dump(rules))
    proc = subprocess.run(["promtool", "check", "rules", str(tmp_path / "queries.yml")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(queries)} rules found" in proc.stdout


def test_the_commands_write_the_shipped_dashboards(tmp_path):
    from tests.conftest import opsctl

    gpu = opsctl("rules", "export", "--format", "grafana", env={"OPSCTL_CONFIG": ""}).stdout
    assert gpu == (REPO / "dashboards" / "opsctl-gpu.json").read_text()
    opsctl("dashboards", "export", "--out", str(tmp_path / "out"), env={"OPSCTL_CONFIG": ""})
    assert {p.name: p.read_text() for p in (tmp_path / "out").iterdir()} == \
        {p.name: p.read_text() for p in (REPO / "dashboards").glob("*.json")}
