"""Rule results that Prometheus recorded (opsctl.health.precomputed): `opsctl health` reads them when they
are there, fresh and its own, else queries the rules directly and says so in one line; both paths decide
the same. The component tier proves the same against a real Prometheus that evaluates the exported rules."""

import random

import pytest
import yaml

from opsctl.health import precomputed
from tests.unit.fakes import World


def decisions(world, *args):
    code, nodes, summary = world.json(*args)
    return code, {n: (v["status"], v["action"], v["checks"]) for n, v in nodes.items()}, summary


def faulty_world(tmp_path, seed: int) -> World:
    world = World(tmp_path)
    chosen = random.Random(seed)
    for rule in chosen.sample(world.prom.rules, 6):
        for node in chosen.sample(sorted(world.slurm.state), 2):
            world.prom.breach(rule.id, node)
    return world


@pytest.mark.parametrize("seed", range(5))
def test_recorded_and_direct_results_decide_the_same(tmp_path, seed):
    recorded = faulty_world(tmp_path / "recorded", seed)
    direct = faulty_world(tmp_path / "direct", seed)
    direct.prom.recorded = {}
    code, nodes, summary = decisions(recorded, "--drain", "--dry-run")
    code_d, nodes_d, summary_d = decisions(direct, "--drain", "--dry-run")
    assert (code, nodes) == (code_d, nodes_d)
    assert any(v[0] == "fail" for v in nodes.values())  # the case has failing nodes to decide on
    assert (summary["rule_results"], summary_d["rule_results"]) == ("precomputed", "direct")
    assert summary["queries"] == 5 and summary_d["queries"] == 5 + len(direct.prom.rules)
    assert not any(q == rule.alert_expr() for q in recorded.prom.asked for rule in recorded.prom.rules)


def test_without_recording_rules_every_rule_is_queried_directly_and_the_run_says_so_in_one_line(tmp_path):
    world = World(tmp_path)
    world.prom.recorded = {}
    world.prom.breach("xid-79", "gpu040", "3")
    assert world.run("health") == 1
    assert "note:" not in world.stdout  # the table keeps its shape
    notes = world.stderr.splitlines()
    assert notes == ["note: recorded rule results not used for every rule, queried directly (not recorded "
                     "(opsctl rules export installs the recording rules): " + ", ".join(
                         r.id for r in world.prom.rules[:3]) + f" and {len(world.prom.rules) - 3} more)"]
    assert "gpu040" in world.stdout
    _, _, summary = world.json()
    assert summary["rule_results"] == "direct" and summary["rule_results_note"] == notes[0][len("note: "):]


def test_a_stale_heartbeat_sends_that_rule_to_the_direct_path_only(tmp_path):
    world = World(tmp_path)  # scrape interval 30s: results are fresh for 60s
    world.prom.recorded["xid-79"] = 61.0
    world.prom.breach("xid-79", "gpu040", "3")
    code, nodes, summary = decisions(world)
    assert code == 1 and nodes["gpu040"][0] == "fail"
    assert summary["rule_results"] == "mixed" and summary["queries"] == 6
    assert summary["rule_results_note"] == (f"recorded rule results not used for 1 of {len(world.prom.rules)} "
                                            "rules, queried directly (older than 60s (2 x "
                                            "prometheus.recording_interval): xid-79)")
    world.prom.recorded["xid-79"] = 59.0
    assert decisions(world)[2]["rule_results"] == "precomputed"


def test_the_recording_interval_sets_how_old_results_may_be(tmp_path):
    world = World(tmp_path, raw={"prometheus": {"recording_interval": "2m"}})
    world.prom.record_all(age=239.0)
    assert decisions(world)[2]["rule_results"] == "precomputed"
    world.prom.record_all(age=241.0)
    assert decisions(world)[2]["rule_results"] == "direct"


def test_results_recorded_from_another_expression_are_never_used(tmp_path):
    """A config changed since the export (a threshold, a hold), or another cluster's catalog on the same
    Prometheus: the recorded series carry another hash, and the rule is queried directly."""
    world = World(tmp_path)
    world.prom.recorded["gpu-temp-high"] = "other"
    code, nodes, summary = decisions(world)
    assert summary["rule_results"] == "mixed"
    assert "recorded from another expression (export the rules again): gpu-temp-high" in summary["rule_results_note"]


def test_recording_rules_off_never_reads_them_and_says_nothing(tmp_path):
    world = World(tmp_path, raw={"prometheus": {"recording_rules": "off"}})
    code, _, summary = decisions(world)
    assert precomputed.QUERY not in world.prom.asked
    assert summary["rule_results"] == "direct" and summary["rule_results_note"] is None
    assert summary["queries"] == 4 + len(world.prom.rules)


def test_the_export_records_each_rule_in_a_group_of_its_own_with_its_heartbeat(tmp_path):
    world = World(tmp_path, raw={"prometheus": {"scrape_interval": "15s"}})
    assert world.run("rules", "export", "--format", "prometheus") == 0
    groups = {g["name"]: g for g in yaml.safe_load(world.stdout)["groups"]}
    for rule in world.prom.rules:
        group = groups[precomputed.GROUP_PREFIX + rule.id]
        assert group["interval"] == "15s" and len(group["rules"]) == 1
        recording = group["rules"][0]
        assert recording["record"] == precomputed.RECORD
        assert recording["labels"] == {precomputed.RULE_LABEL: rule.id,
                                       precomputed.EXPR_LABEL: precomputed.expr_hash(rule)}
        # The heartbeat is part of the rule's own expression: no heartbeat without its results.
        assert recording["expr"].startswith(f"({rule.alert_expr()}) or label_replace(vector(time())")
    alerts = [r for g in groups.values() for r in g["rules"] if "alert" in r]
    assert len(alerts) >= len(world.prom.rules)  # the alerts are still there
