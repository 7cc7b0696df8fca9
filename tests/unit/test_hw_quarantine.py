"""`opsctl hw quarantine`: nodes whose hardware differs from their group's profile are drained
`opsctl:hw-mismatch <why>` and resumed once they fit again, with the safety rules of every opsctl drain
(ownership, the breaker), through the CLI with a FakeSlurm. The node lines it acts on are rendered by the
real role templates and parsed by slurmd in tests/component/test_slurm_render.py; every provision run of
the lab machines runs the role's decision (all nodes fitting, nothing to change)."""

import json

from tests.unit.fakes import FakeSlurm, gpu_nodes, node, run_with_results

MISSING = "gpus 7 (profile 8)"


def run(tmp_path, mismatches, slurm, *args):
    return run_with_results(tmp_path, ["hw", "quarantine"], mismatches, slurm, *args)


def fitting(n=8):
    return {f"gpu{i:03d}": "" for i in range(1, n + 1)}


def test_nodes_that_fit_change_nothing(tmp_path):
    slurm = FakeSlurm(gpu_nodes(8))
    result, _ = run(tmp_path, fitting(), slurm, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert (data["mismatch"], data["drained"], data["resumed"], data["stop"]) == ({}, [], [], "")
    assert slurm.calls == []


def test_a_node_that_lost_a_gpu_is_drained_once_with_what_differs(tmp_path):
    slurm = FakeSlurm(gpu_nodes(8))
    mismatches = {**fitting(), "gpu003": MISSING}
    result, config = run(tmp_path, mismatches, slurm, "--json")
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    assert (data["mismatch"], data["drained"]) == ({"gpu003": MISSING}, ["gpu003"])
    assert slurm.nodes()["gpu003"].reason == f"opsctl:hw-mismatch {MISSING}"
    assert [c[:2] for c in slurm.calls] == [("drain", ("gpu003",))]
    audit = [json.loads(line) for line in config.audit_log.read_text().splitlines()]
    assert [(r["event"], r["node"], r["checks"]) for r in audit] == [("drain", "gpu003", ["hw-mismatch"])]
    again, _ = run(tmp_path, mismatches, slurm, "--json")  # the next provisioning run: already ours
    assert again.exit_code == 1 and json.loads(again.output)["drained"] == [] and len(slurm.calls) == 1


def test_a_node_that_fits_again_is_resumed_from_this_drain_only(tmp_path):
    drained = {"gpu002": f"opsctl:hw-mismatch {MISSING}", "gpu003": "opsctl:ib-precheck port-state mlx5_2",
               "gpu004": "ticket-123 bad dimm"}
    slurm = FakeSlurm(gpu_nodes(8, **{n: node(n, flags=("DRAIN",), reason=r) for n, r in drained.items()}))
    result, _ = run(tmp_path, fitting(), slurm)
    assert result.exit_code == 0, result.output
    assert "resumed gpu002: the hardware fits its group's profile again" in result.output
    assert slurm.calls == [("resume", ("gpu002",))]
    assert {n: slurm.nodes()[n].reason for n in ("gpu003", "gpu004")} == {
        "gpu003": drained["gpu003"], "gpu004": drained["gpu004"]}


def test_a_persons_drain_is_never_touched(tmp_path):
    slurm = FakeSlurm(gpu_nodes(8, gpu003=node("gpu003", flags=("DRAIN",), reason="ticket-9")))
    result, _ = run(tmp_path, {**fitting(), "gpu003": MISSING}, slurm)
    assert result.exit_code == 1 and "refused gpu003: not-owned" in result.output
    assert slurm.calls == [] and slurm.nodes()["gpu003"].reason == "ticket-9"


def test_dry_run_changes_nothing(tmp_path):
    slurm = FakeSlurm(gpu_nodes(8))
    result, _ = run(tmp_path, {**fitting(), "gpu003": MISSING}, slurm, "--dry-run")
    assert result.exit_code == 1 and "would drain gpu003: opsctl:hw-mismatch gpus 7" in result.output
    assert slurm.calls == []
    data = json.loads(run(tmp_path, {**fitting(), "gpu003": MISSING}, slurm, "--dry-run", "--json")[0].output)
    assert (data["done"], data["would"], data["refused"], data["skipped"]) == (
        [], [f"drain gpu003: opsctl:hw-mismatch {MISSING}"], {}, {})


def test_most_nodes_differing_is_a_profile_or_a_shared_cause_and_drains_none(tmp_path):
    """A driver rollout that hid a GPU everywhere, or a declared profile that fits no node: not the nodes."""
    slurm = FakeSlurm(gpu_nodes(8, gpu001=node("gpu001", flags=("DRAIN",), reason=f"opsctl:hw-mismatch {MISSING}")))
    result, _ = run(tmp_path, {n: MISSING for n in fitting()} | {"gpu008": ""}, slurm, "--json")
    assert result.exit_code == 4, result.output
    data = json.loads(result.output)
    assert data["stop"].startswith("circuit breaker: 7 of 8 tested nodes fail their group's hardware profile")
    assert "the fault is in the profile or in what all of them share" in data["stop"]
    assert data["drained"] == [] and data["resumed"] == [] and slurm.calls == []


def test_findings_that_are_not_an_object_of_strings_exit_3(tmp_path):
    slurm = FakeSlurm(gpu_nodes(2))
    for bad in ({"gpu001": {"gpus": 7}}, ["gpu001"], {}):
        result, _ = run(tmp_path, bad, slurm)
        assert result.exit_code == 3, result.output
        assert "node -> why it differs" in result.output
    assert slurm.calls == []
