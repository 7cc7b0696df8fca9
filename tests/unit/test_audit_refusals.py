"""Every kind of refusal, read back from the audit log with `opsctl history --json`: the record names the
node's real Slurm state (base plus flags), carries the reason that was on the node in `reason`, and
says why in `detail` without a doubled prefix."""

import json

import pytest

from tests.unit.fakes import IB_REASON, World, node


def refusals(world: World) -> list[dict]:
    assert world.run("history", "--json") == 0
    return [r for r in map(json.loads, world.stdout.splitlines()) if r["event"] == "refuse"]


def only_refusal(world: World, name: str) -> dict:
    [record] = [r for r in refusals(world) if r["node"] == name]
    assert record["detail"].count(":") >= 1 and "circuit-breaker: circuit breaker" not in record["detail"]
    assert "already idle" not in record["detail"]
    return record


def test_a_node_a_person_drained_is_refused_with_its_state_and_the_persons_reason(tmp_path):
    w = World(tmp_path, gpu040=node("gpu040", "idle", flags=("DRAIN",), reason="ticket-123 bad dimm"))
    w.prom.breach("xid-79", "gpu040", "3")
    assert w.run("health", "--drain") == 1
    record = only_refusal(w, "gpu040")
    assert (record["state"], record["reason"]) == ("IDLE+DRAIN", "ticket-123 bad dimm")
    assert record["detail"] == "not-owned: IDLE+DRAIN with a reason opsctl did not set"
    assert w.run("history") == 0 and "not-owned: IDLE+DRAIN with a reason opsctl did not set; reason: ticket-123 " \
        "bad dimm" in w.stdout


def test_a_node_slurm_holds_is_refused_with_its_state(tmp_path):
    w = World(tmp_path, gpu041=node("gpu041", "idle", flags=("MAINTENANCE", "RESERVED")))
    w.prom.breach("xid-79", "gpu041", "3")
    w.run("health", "--drain")
    record = only_refusal(w, "gpu041")
    assert (record["state"], record["reason"]) == ("IDLE+MAINTENANCE+RESERVED", "")
    assert record["detail"] == "slurm-state: Slurm holds it IDLE+MAINTENANCE+RESERVED"


def test_the_circuit_breaker_names_itself_once(tmp_path):
    world = World(tmp_path)
    for i in range(33, 40):
        world.prom.breach("xid-79", f"gpu{i:03d}", "0")
    assert world.run("health", "--drain") == 4
    record = only_refusal(world, "gpu033")
    assert record["state"] == "IDLE" and record["detail"].startswith("circuit-breaker: 7 nodes newly fail, more than")


@pytest.mark.parametrize("raw,down,why", [
    ({"safety": {"max_drains_per_run": 1}}, 0, "budget: drain budget spent (1 per run"),
    ({}, 12, "out-of-service-limit: 12 of 64 nodes are out of service"),
])
def test_the_drain_limits_are_refused_with_the_state(tmp_path, raw, down, why):
    down_nodes = {f"gpu{i:03d}": node(f"gpu{i:03d}", "down", reason="psu") for i in range(1, down + 1)}
    w = World(tmp_path, raw=raw, **down_nodes)
    w.prom.breach("xid-79", "gpu040", "0")
    w.prom.breach("xid-79", "gpu041", "0")
    assert w.run("health", "--drain") == 4
    record = only_refusal(w, "gpu041")
    assert record["state"] == "IDLE" and record["detail"].startswith(why)


def test_the_resume_budget_is_refused_with_the_state_and_opsctls_reason(tmp_path):
    drained = {f"gpu{i:03d}": node(f"gpu{i:03d}", flags=("DRAIN",), reason=IB_REASON) for i in range(40, 46)}
    w = World(tmp_path, raw={"safety": {"resume_after": "0s"}}, **drained)
    assert w.run("health", "--resume") == 4
    record = only_refusal(w, "gpu045")
    assert (record["state"], record["reason"]) == ("IDLE+DRAIN", IB_REASON)
    assert record["detail"].startswith("budget: resume budget spent")


def test_a_node_changed_under_the_plan_is_refused_with_its_new_state_and_reason(tmp_path):
    world = World(tmp_path)
    world.prom.breach("xid-79", "gpu040", "3")
    original, reads = world.slurm.nodes, []

    def nodes():
        reads.append(1)
        if len(reads) == 2:
            world.slurm.state["gpu040"] = node("gpu040", flags=("DRAIN",), reason="bad dimm")
        return original()

    world.slurm.nodes = nodes
    world.run("health", "--drain")
    record = only_refusal(world, "gpu040")
    assert (record["state"], record["reason"]) == ("IDLE+DRAIN", "bad dimm")
    assert record["detail"] == "changed: Slurm changed since the plan (now IDLE+DRAIN)"


def test_manual_drain_and_resume_refusals_carry_the_other_partys_reason(tmp_path):
    w = World(tmp_path, gpu062=node("gpu062", flags=("DRAIN",), reason="ticket-123 bad dimm"))
    assert w.run("drain", "gpu062", "--reason", "mine now") == 4
    assert w.run("resume", "gpu062") == 4
    drain, resume = [r for r in refusals(w) if r["node"] == "gpu062"]
    assert (drain["state"], drain["reason"], drain["evidence"]) == ("IDLE+DRAIN", "ticket-123 bad dimm", "mine now")
    assert drain["detail"] == "not-owned: IDLE+DRAIN with a reason opsctl did not set"
    assert (resume["state"], resume["reason"]) == ("IDLE+DRAIN", "ticket-123 bad dimm")
    assert resume["detail"].startswith("not-owned: drained by someone else")
