"""The output contract of `opsctl health`: JSON keys, table, exit codes through the real CLI."""

import json

from click.testing import CliRunner

from opsctl.cli import main
from opsctl.commands.render import render_history, render_json, render_table
from opsctl.errors import ExitCode
from opsctl.health.evaluate import Check, NodeVerdict, Report
from opsctl.health.plan import Decision, Plan
from opsctl.health.run import RunOptions, RunResult


def result():
    nodes = {
        "gpu001": NodeVerdict("gpu001"),
        "gpu002": NodeVerdict("gpu002", status="fail", checks=[
            Check(id="xid-79", severity="fail", status="fail", device="gpu3", kind="gpu", value=1.0, threshold=0.0,
                  op=">", evidence="gpu3 xid=79 count=1", action="drain", xid=79)]),
        "gpu003": NodeVerdict("gpu003", status="warn", checks=[
            Check(id="ib-errors", severity="warn", status="warn", device="mlx5_1", kind="hca", value=0.5,
                  threshold=0.1, evidence="mlx5_1 ib_errors_per_s=0.5")]),
        "stray": NodeVerdict("stray", status="unknown", in_slurm=False),
    }
    plan = Plan(decisions={"gpu002": Decision("gpu002", "drain"), "stray": Decision("stray", "skip:not-in-slurm")})
    return RunResult(report=Report(nodes=nodes, rules=[], queries=37, query_seconds=0.2), exit_code=ExitCode.FAILING,
                     plan=plan, seconds=0.3, options=RunOptions(drain=True))


def test_json_contract():
    doc = json.loads(render_json(result()))
    assert set(doc) == {"nodes", "summary", "done", "would", "refused", "skipped"}
    node = {n["node"]: n for n in doc["nodes"]}
    assert set(node["gpu002"]) == {"node", "status", "in_slurm", "checks", "action"}
    assert node["gpu002"]["checks"] == [{"id": "xid-79", "severity": "fail", "status": "fail", "gpu": "gpu3",
                                         "value": 1, "threshold": 0, "evidence": "gpu3 xid=79 count=1"}]
    assert node["gpu003"]["checks"][0]["hca"] == "mlx5_1" and "gpu" not in node["gpu003"]["checks"][0]
    summary = doc["summary"]
    assert (summary["schema"], summary["nodes"], summary["ok"], summary["fail"], summary["warn"]) == (1, 4, 1, 1, 1)
    assert (summary["drained"], summary["queries"], summary["exit_code"], summary["not_in_slurm"]) == (1, 37, 1, 1)


def test_table_lists_only_what_needs_attention():
    text = render_table(result())
    lines = text.splitlines()
    assert lines[0].split() == ["NODE", "STATUS", "ACTION", "EVIDENCE"]
    assert any(line.startswith("gpu002") and "drain" in line and "xid-79 gpu3 xid=79 count=1" in line for line in lines)
    assert not any(line.startswith("gpu001") for line in lines)
    assert "stray (not in Slurm)" in text
    assert lines[-1].startswith("4 nodes: 1 ok, 1 warn, 1 fail, 1 unknown; 37 queries")
    assert any(line.startswith("gpu001") for line in render_table(result(), all_nodes=True).splitlines())


def test_nan_and_infinite_values_stay_valid_json():
    res = result()
    res.report.nodes["gpu003"].checks[0].value = float("nan")
    res.report.nodes["gpu003"].checks[0].threshold = float("-inf")
    check = json.loads(render_json(res))["nodes"][2]["checks"][0]
    assert (check["value"], check["threshold"]) == ("NaN", "-Inf")


def test_warnings_are_shown_in_the_table_and_the_json():
    res = result()
    res.report.warnings = ["'up': partial response (isPartial)"]
    assert json.loads(render_json(res))["summary"]["warnings"] == ["'up': partial response (isPartial)"]
    assert "warning: the source may have answered partially, nothing was changed: 'up'" in render_table(res)


def test_history_table():
    text = render_history([{"time": "t", "user": "ops", "event": "drain", "node": "gpu001", "reason": "opsctl:x y",
                            "dry_run": True}, {"time": "u", "user": "ops", "event": "drain", "node": "gpu002",
                                               "checks": ["xid-79", "ib-down"], "reason": "opsctl:xid-79,ib-down"}])
    assert text.splitlines()[1].split() == ["t", "ops", "drain", "gpu001", "-", "[dry-run]", "opsctl:x", "y"]
    assert text.splitlines()[2].split() == ["u", "ops", "drain", "gpu002", "xid-79,ib-down", "opsctl:xid-79,ib-down"]


def test_usage_errors_exit_2():
    runner = CliRunner()
    res = runner.invoke(main, ["health", "--prometheus", "ftp://x"])
    assert res.exit_code == 2 and "must start with http" in res.output
    res = runner.invoke(main, ["health", "--watch", "0"])
    assert res.exit_code == 2


def test_config_error_is_one_line_and_exit_2(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("slurm:\n  backend: rest\n")
    res = CliRunner().invoke(main, ["health", "--config", str(cfg)])
    assert res.exit_code == 2
    assert res.output == "opsctl: error: config key slurm.backend: must be cli or pyslurm, got 'rest'\n"


def test_rules_export_prints_the_rules_file(tmp_path):
    res = CliRunner().invoke(main, ["rules", "export", "--format", "prometheus", "--config", str(tmp_path / "x.yaml")])
    assert res.exit_code == 2  # the named config file does not exist
    cfg = tmp_path / "c.yaml"
    cfg.write_text("hardware:\n  gpus_per_node: 4\n")
    res = CliRunner().invoke(main, ["rules", "export", "--config", str(cfg)])
    assert res.exit_code == 0 and "alert: OpsctlGpuCount" in res.output and ", 4) != 4" in res.output
