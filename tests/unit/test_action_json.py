"""Every acting command's --json carries the same fields for what was done (opsctl/actor/result.py,
docs/json.md): `done` and `would` (lists of changes, in the actor's words), `refused` and `skipped` (node ->
why), beside the fields each command had before."""

import json

import pytest

from opsctl.slurm import MANUAL_PREFIX
from tests.unit.fakes import World

FIELDS = {"done": list, "would": list, "refused": dict, "skipped": dict}


def action_fields(doc: dict) -> dict:
    assert {name: type(doc.get(name)) for name in FIELDS} == FIELDS, doc
    return {name: doc[name] for name in FIELDS}


@pytest.fixture
def world(tmp_path):
    return World(tmp_path, n=8)


def test_health_drain_lists_the_drain_as_done(world):
    world.prom.breach("xid-79", "gpu003", "3")
    assert world.run("health", "--drain", "--json") == 1
    fields = action_fields(json.loads(world.stdout))
    assert fields["done"] == ["drain gpu003: opsctl:xid-79 gpu3 xid=79 count=1"]
    assert fields["would"] == [] and fields["refused"] == {}


def test_health_dry_run_lists_the_drain_as_would(world):
    world.prom.breach("xid-79", "gpu003", "3")
    world.run("health", "--dry-run", "--json")
    fields = action_fields(json.loads(world.stdout))
    assert fields["done"] == [] and fields["would"] == ["drain gpu003: opsctl:xid-79 gpu3 xid=79 count=1"]


def test_health_refuses_someone_elses_drain(world):
    world.slurm.drain(["gpu003"], "bad dimm")
    world.prom.breach("xid-79", "gpu003", "3")
    world.run("health", "--drain", "--json")
    fields = action_fields(json.loads(world.stdout))
    assert fields["done"] == [] and list(fields["refused"]) == ["gpu003"]


def test_drain_and_resume_by_hand(world):
    assert world.run("drain", "gpu002", "--reason", "fan", "--json") == 0
    assert action_fields(json.loads(world.stdout))["done"] == [f"drain gpu002: {MANUAL_PREFIX} fan"]
    world.slurm.drain(["gpu005"], "bad dimm")
    assert world.run("resume", "gpu[002,005]", "--json") == 4
    fields = action_fields(json.loads(world.stdout))
    assert fields["done"] == ["resume gpu002"] and list(fields["refused"]) == ["gpu005"]


def test_remediate_has_the_fields(world):
    assert world.run("remediate", "--json") == 0
    assert action_fields(json.loads(world.stdout)) == {"done": [], "would": [], "refused": {}, "skipped": {}}


def test_rollout_drain_keeps_its_skipped_mapping_and_lists_its_drains(world):
    world.slurm.drain(["gpu004"], "bad dimm")
    assert world.run("rollout", "drain", "gpu[003-004]", "--change", "driver 570", "--wait", "0", "--json") == 1
    doc = json.loads(world.stdout)
    fields = action_fields(doc)
    assert [line.split(":")[0] for line in fields["done"]] == ["drain gpu003"]
    assert "gpu004" in fields["skipped"] and "gpu004" in doc["skipped"]
