"""`opsctl ib quarantine`: the provisioning precheck's drains and resumes, with the same safety rules as
every opsctl drain (ownership, the breaker), through the CLI with a FakeSlurm."""

import json

from click.testing import CliRunner

from opsctl.cli import main
from opsctl.clients import Clients
from opsctl.config import parse_config
from opsctl.slurm import SlurmNode
from tests.unit.fakes import FakeSlurm, gpu_nodes, node, run_with_results

HCAS = [f"mlx5_{i}" for i in range(8)]


def report(verdict="pass", failed=(), state="ACTIVE"):
    """An `opsctl ib check --json` report: `failed` HCAs fail port-state (DOWN), or every port in `state`."""
    hcas = [{"device": h, "state": "DOWN" if h in failed else state, "failed": ["port-state"] if h in failed else []}
            for h in HCAS]
    found = [{"check": "port-state", "device": h, "detail": "state DOWN, expected ACTIVE"} for h in failed]
    if state != "ACTIVE":
        found = [{"check": "port-state", "device": h, "detail": f"state {state}, expected ACTIVE"} for h in HCAS]
    return {"schema": 1, "verdict": verdict, "hcas": hcas, "findings": found, "skipped": []}


def run(tmp_path, reports, slurm, *args):
    return run_with_results(tmp_path, ["ib", "quarantine"], reports, slurm, *args)


def audit(config):
    return [json.loads(line) for line in config.audit_log.read_text().splitlines()] \
        if config.audit_log.exists() else []


def healthy(n=8):
    return {f"gpu{i:03d}": report() for i in range(1, n + 1)}


def test_all_pass_changes_nothing(tmp_path):
    slurm = FakeSlurm(gpu_nodes(8))
    result, _ = run(tmp_path, healthy(), slurm, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert (data["quarantine"], data["drained"], data["resumed"], data["stop"]) == ([], [], [], "")
    assert slurm.calls == []


def test_a_failing_node_is_drained_with_the_precheck_reason_and_audited(tmp_path):
    slurm = FakeSlurm(gpu_nodes(8))
    reports = {**healthy(), "gpu003": report("fail", failed=["mlx5_2"])}
    result, config = run(tmp_path, reports, slurm, "--json")
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    assert (data["quarantine"], data["drained"]) == (["gpu003"], ["gpu003"])
    reason = slurm.nodes()["gpu003"].reason
    assert reason.startswith("opsctl:ib-precheck port-state mlx5_2 state DOWN"), reason
    assert [c[:2] for c in slurm.calls] == [("drain", ("gpu003",))]
    assert [(r["event"], r["node"], r["checks"]) for r in audit(config)] == [("drain", "gpu003", ["ib-precheck"])]
    assert (data["done"], data["would"], data["refused"], data["skipped"]) == ([f"drain gpu003: {reason}"], [], {}, {})
    # A second run with nothing changed changes nothing (already drained, ours).
    again, _ = run(tmp_path, reports, slurm, "--json")
    assert again.exit_code == 1 and json.loads(again.output)["drained"] == [] and len(slurm.calls) == 1


def test_dry_run_changes_nothing(tmp_path):
    slurm = FakeSlurm(gpu_nodes(8))
    result, _ = run(tmp_path, {**healthy(), "gpu003": report("fail", failed=["mlx5_2"])}, slurm, "--dry-run")
    assert result.exit_code == 1 and "would drain gpu003: opsctl:ib-precheck" in result.output
    assert slurm.calls == []


def test_a_persons_drain_is_never_touched(tmp_path):
    person = node("gpu003", flags=("DRAIN",), reason="ticket-123 bad dimm")
    slurm = FakeSlurm(gpu_nodes(8, gpu003=person, gpu004=node("gpu004", flags=("DRAIN",), reason="ticket-9")))
    reports = {**healthy(), "gpu003": report("fail", failed=["mlx5_2"])}  # gpu004 passes: still not resumed
    result, _ = run(tmp_path, reports, slurm)
    assert result.exit_code == 1, result.output
    assert "refused gpu003: not-owned" in result.output
    assert slurm.calls == []
    data = json.loads(run(tmp_path, reports, slurm, "--json")[0].output)
    assert (data["done"], data["would"], list(data["refused"]), data["skipped"]) == ([], [], ["gpu003"], {})
    assert data["refused"]["gpu003"].startswith("not-owned")
    assert slurm.nodes()["gpu003"].reason == "ticket-123 bad dimm"
    assert slurm.nodes()["gpu004"].reason == "ticket-9"


def test_a_passing_node_is_resumed_only_from_the_precheck_drain(tmp_path):
    drained = {"gpu002": "opsctl:ib-precheck port-state mlx5_2", "gpu003": "opsctl:ib-down mlx5_2",
               "gpu004": "opsctl:manual rma"}
    slurm = FakeSlurm(gpu_nodes(8, **{n: node(n, flags=("DRAIN",), reason=r) for n, r in drained.items()}))
    result, config = run(tmp_path, healthy(), slurm, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["resumed"] == ["gpu002"]
    assert slurm.calls == [("resume", ("gpu002",))]
    assert not slurm.nodes()["gpu002"].drained
    assert {n: slurm.nodes()[n].reason for n in ("gpu003", "gpu004")} == {
        "gpu003": "opsctl:ib-down mlx5_2", "gpu004": "opsctl:manual rma"}
    assert [(r["event"], r["node"]) for r in audit(config)] == [("resume", "gpu002")]


def test_every_port_init_everywhere_trips_the_breaker_drains_none_and_says_why(tmp_path):
    slurm = FakeSlurm(gpu_nodes(3, gpu001=node("gpu001", flags=("DRAIN",), reason="opsctl:ib-precheck x")))
    reports = {f"gpu{i:03d}": report("fail", state="INIT") for i in range(1, 4)}
    result, config = run(tmp_path, reports, slurm)
    assert result.exit_code == 4, result.output
    assert "every InfiniBand port of the 3 tested node(s) is in INIT: the subnet manager is down" in result.output
    assert "draining none" in result.output
    assert slurm.calls == []  # nothing drained, and nothing resumed either
    assert {r["event"] for r in audit(config)} == {"refuse"}


def test_too_many_failing_nodes_trip_the_shared_cause_breaker(tmp_path):
    slurm = FakeSlurm(gpu_nodes(4))
    reports = {**healthy(4), "gpu001": report("fail", failed=["mlx5_0"]), "gpu002": report("fail", failed=["mlx5_1"])}
    result, _ = run(tmp_path, reports, slurm, "--json")
    assert result.exit_code == 4
    data = json.loads(result.output)
    assert data["stop"].startswith("circuit breaker: 2 of 4 tested nodes fail the InfiniBand precheck")
    assert data["quarantine"] == ["gpu001", "gpu002"] and data["drained"] == [] and slurm.calls == []


def test_unreadable_reports_exit_3(tmp_path):
    slurm = FakeSlurm(gpu_nodes(2))
    result, _ = run(tmp_path, {"gpu001": {"error": "x"}}, slurm)
    assert result.exit_code == 3 and "no verdict" in result.output + (result.stderr or "")
    assert slurm.calls == []


def test_reports_on_stdin(tmp_path):
    config = parse_config({}, "t", env={"OPSCTL_STATE_DIR": str(tmp_path / "state"),
                                        "OPSCTL_AUDIT_LOG": str(tmp_path / "audit.jsonl")})
    slurm = FakeSlurm({"gpu001": SlurmNode("gpu001", "idle", partitions=("gpu",), gres="gpu:h200:8")})
    result = CliRunner().invoke(main, ["ib", "quarantine", "--results", "-"], input=json.dumps(healthy(1)),
                                obj=Clients(config=config, slurm=slurm))
    assert result.exit_code == 0 and "1 node(s) tested: 1 pass, 0 fail" in result.output
