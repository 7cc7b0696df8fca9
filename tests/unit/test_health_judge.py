"""judge(): the pure decision over Prometheus answers, one verdict per node. Answers are built here
as Prometheus returns them (component and lab tiers run the same rules against a real Prometheus)."""

import pytest

from opsctl.config import parse_config
from opsctl.errors import SourceUnavailable
from opsctl.health.catalog import load_catalog
from opsctl.health.evaluate import HandledXid, judge
from opsctl.prom.client import Sample

CONFIG = parse_config({}, "t", {})
RULES = {rule.id: rule for rule in load_catalog(CONFIG)}
NODES = ["gpu001", "gpu002", "gpu003"]
NOW = 1_800_000_000.0


def presence(nodes=NODES, up=None, ages=None):
    """The `up` and scrape-age answers of both jobs for every node; `up`/`ages` override per (node, job)."""
    up, ages = up or {}, ages or {}
    up_samples = [Sample({"job": job, "node": n, "instance": f"{n}:9"}, up.get((n, job), 1.0))
                  for n in nodes for job in ("dcgm", "node")]
    age_samples = [Sample({"job": job, "node": n, "instance": f"{n}:9"}, ages.get((n, job), 5.0))
                   for n in nodes for job in ("dcgm", "node")]
    return up_samples, age_samples


def run(answers=None, up=None, ages=None, handled=(), config=CONFIG, slurm=NODES):
    up_samples, age_samples = presence(up=up, ages=ages)
    return judge(list(RULES.values()), answers or {}, up_samples, age_samples, set(slurm), config, handled, NOW)


def xid79(node="gpu002", gpu="3", count=1.0, window="300000"):
    return {"xid-79": [Sample({"node": node, "gpu": gpu, "xid": "79", "window_size_in_ms": window}, count)]}


def test_no_breaching_series_means_every_node_ok():
    report = run()
    assert {n: v.status for n, v in report.nodes.items()} == dict.fromkeys(NODES, "ok")
    assert all(v.in_slurm and v.checks == [] for v in report.nodes.values())


def test_a_breaching_series_fails_its_node_with_device_and_evidence():
    report = run(xid79())
    verdict = report.nodes["gpu002"]
    assert verdict.status == "fail" and report.nodes["gpu001"].status == "ok"
    [check] = verdict.checks
    assert (check.id, check.device, check.kind, check.value, check.threshold, check.action, check.xid) == (
        "xid-79", "gpu3", "gpu", 1.0, 0.0, "drain", 79)
    assert check.evidence == "gpu3 xid=79 count=1" and check.window_s == 300.0
    assert verdict.drain_checks() == [check]


def test_a_value_that_does_not_breach_is_ignored():
    # A rule answer may carry series at the threshold (e.g. a user rule without the filter in its expr).
    answers = {"gpu-temp-high": [Sample({"node": "gpu001", "gpu": "0"}, 87.0)]}
    assert run(answers).nodes["gpu001"].status == "ok"
    answers = {"gpu-temp-high": [Sample({"node": "gpu001", "gpu": "0"}, 88.0)]}
    assert run(answers).nodes["gpu001"].status == "warn"


def test_hca_rules_name_the_device():
    answers = {"ib-down": [Sample({"node": "gpu003", "device": "mlx5_2", "port": "1"}, 1.0)]}
    check = run(answers).nodes["gpu003"].checks[0]
    assert (check.id, check.kind, check.device, check.status) == ("ib-down", "hca", "mlx5_2", "fail")


def test_node_takes_its_worst_status_and_checks_are_ordered_worst_first():
    answers = {**xid79("gpu001"), "gpu-temp-high": [Sample({"node": "gpu001", "gpu": "5"}, 95.0)]}
    verdict = run(answers).nodes["gpu001"]
    assert verdict.status == "fail"
    assert [c.status for c in verdict.checks] == ["fail", "warn"]


@pytest.mark.parametrize("up,ages,evidence", [
    ({("gpu002", "dcgm"): 0.0}, None, "dcgm exporter down"),
    (None, {("gpu002", "node"): 121.0}, "node exporter stale"),  # prometheus.stale_after 2m
])
def test_a_node_whose_exporter_is_down_or_stale_is_unknown_even_with_a_failure(up, ages, evidence):
    report = run(xid79("gpu002"), up=up, ages=ages)
    verdict = report.nodes["gpu002"]
    assert verdict.status == "unknown"
    assert any(c.status == "unknown" and c.evidence == evidence for c in verdict.checks)
    assert report.nodes["gpu001"].status == "ok"


def test_a_slurm_node_without_any_series_is_unknown():
    report = run(slurm=[*NODES, "gpu099"])
    assert report.nodes["gpu099"].status == "unknown" and report.nodes["gpu099"].in_slurm
    assert {c.evidence for c in report.nodes["gpu099"].checks} == {"dcgm exporter missing", "node exporter missing"}


def test_series_of_hosts_slurm_does_not_know_are_marked():
    report = run(xid79("gpu003"), slurm=["gpu001", "gpu002"])
    assert report.nodes["gpu003"].in_slurm is False and report.nodes["gpu003"].status == "fail"


def test_one_down_target_of_two_for_a_node_makes_its_data_incomplete():
    up_samples, age_samples = presence()
    up_samples.append(Sample({"job": "dcgm", "node": "gpu001", "instance": "second:9400"}, 0.0))
    report = judge(list(RULES.values()), {}, up_samples, age_samples, set(NODES), CONFIG, (), NOW)
    assert report.nodes["gpu001"].status == "unknown"


@pytest.mark.parametrize("answers,message", [
    ({"xid-79": [Sample({"node": "gpu001", "xid": "79"}, 1.0)]}, "without the 'gpu' label"),
    ({"xid-79": [Sample({"gpu": "1"}, 1.0)]}, "has no node, Hostname, hostname or instance label"),
])
def test_series_that_cannot_be_placed_stop_the_run(answers, message):
    with pytest.raises(SourceUnavailable, match=message):
        run(answers)


def test_a_presence_series_of_an_unknown_job_stops_the_run():
    up_samples, age_samples = presence()
    up_samples.append(Sample({"job": "other", "node": "gpu001"}, 1.0))
    with pytest.raises(SourceUnavailable, match="without a known job label"):
        judge([], {}, up_samples, age_samples, set(NODES), CONFIG, (), NOW)


def test_an_xid_acted_on_within_its_window_is_handled_not_failing():
    handled = [HandledXid(node="gpu002", gpu="3", xid=79, time=NOW - 60, count=1.0)]
    verdict = run(xid79(), handled=handled).nodes["gpu002"]
    assert verdict.status == "ok" and [c.status for c in verdict.checks] == ["handled"]
    assert verdict.breaching("xid-79") and verdict.drain_checks() == []


@pytest.mark.parametrize("count,acted_ago", [(2.0, 60), (1.0, 301)])
def test_a_higher_count_or_a_count_after_the_window_is_a_new_xid(count, acted_ago):
    handled = [HandledXid(node="gpu002", gpu="3", xid=79, time=NOW - acted_ago, count=1.0)]
    assert run(xid79(count=count), handled=handled).nodes["gpu002"].status == "fail"


def test_handled_memory_is_per_node_gpu_and_xid():
    handled = [HandledXid(node="gpu002", gpu="4", xid=79, time=NOW - 60, count=1.0)]
    assert run(xid79(gpu="3"), handled=handled).nodes["gpu002"].status == "fail"


def test_with_the_last_xid_gauge_a_handled_xid_never_repeats():
    config = parse_config({"catalog": {"xid_source": "gauge"}}, "t", {})
    rules = load_catalog(config)
    answers = {"xid-79": [Sample({"node": "gpu002", "gpu": "3"}, 79.0)]}
    handled = [HandledXid(node="gpu002", gpu="3", xid=79, time=NOW - 30 * 86400, count=79.0)]
    up_samples, age_samples = presence()
    report = judge(rules, answers, up_samples, age_samples, set(NODES), config, handled, NOW)
    assert report.nodes["gpu002"].status == "ok"
    report = judge(rules, answers, up_samples, age_samples, set(NODES), config, (), NOW)
    assert report.nodes["gpu002"].status == "fail"
