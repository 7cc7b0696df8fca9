"""promtool (Prometheus' own checker) accepts what opsctl exports."""

import shutil
import subprocess

import pytest

from opsctl.config import parse_config
from opsctl.health.catalog import load_catalog
from opsctl.health.export import render_prometheus_rules


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool")
def test_promtool_accepts_the_export(tmp_path):
    path = tmp_path / "opsctl.rules.yml"
    path.write_text(render_prometheus_rules(load_catalog(parse_config({}, "t", {}))))
    proc = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(load_catalog(parse_config({}, 't', {})))} rules found" in proc.stdout
