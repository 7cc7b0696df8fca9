"""judge(): the pure decision over Prometheus answers, one verdict per node. Answers are built here
as Prometheus returns them (component and lab tiers run the same rules against a real Prometheus
and VictoriaMetrics)."""

import math
import re

import pytest

from opsctl.actor.memory import Handled, HandledMemory
from opsctl.config import parse_config
from opsctl.errors import SourceUnavailable
from opsctl.health.catalog import load_catalog
from opsctl.health.evaluate import judge
from opsctl.health.identity import Identities
from opsctl.prom.client import Sample

CONFIG = parse_config({}, "t", {})
RULES = {rule.id: rule for rule in load_catalog(CONFIG)}
NODES = ["gpu001", "gpu002", "gpu003"]
NOW = 1_800_000_000.0
XID_METRICS = ("DCGM_FI_DEV_XID_ERRORS", "DCGM_EXP_XID_ERRORS_COUNT")


def target(n, job):
    return {"job": job, "node": n, "instance": f"{n}:{9400 if job == 'dcgm' else 9100}"}


def presence(nodes=NODES, up=None, ages=None, reported=None):
    """`up`, scrape ages and identity answers of both jobs for every node; override per (node, job)."""
    up, ages = up or {}, ages or {}
    up_samples = [Sample(target(n, job), up.get((n, job), 1.0)) for n in nodes for job in ("dcgm", "node")]
    age_samples = [Sample(target(n, job), ages.get((n, job), 5.0)) for n in nodes for job in ("dcgm", "node")]
    if reported is None:
        reported = [Sample({**target(n, "dcgm"), "__name__": m, "Hostname": n}, 1.0) for n in nodes
                    for m in XID_METRICS]
    return up_samples, age_samples, reported


def run(answers=None, up=None, ages=None, memory=None, config=CONFIG, slurm=NODES, reported=None, ignore=None):
    up_samples, age_samples, self_samples = presence(up=up, ages=ages, reported=reported)
    identities = Identities(up_samples, self_samples, config)
    rules = list(RULES.values()) if config is CONFIG else load_catalog(config)
    return judge(rules, answers or {}, identities, age_samples, set(slurm), config, memory, NOW, ignore)


def xid79(node="gpu002", gpu="3", count=1.0, window="300000"):
    return {"xid-79": [Sample({**target(node, "dcgm"), "gpu": gpu, "xid": "79", "window_size_in_ms": window},
                              count)]}


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
    assert check.evidence == "gpu3 xid=79 count=1" and check.window_s == 300.0 and check.memory == "window"
    assert verdict.drain_checks() == [check]


def test_a_value_that_does_not_breach_is_ignored():
    # A rule answer may carry series at the threshold (e.g. a user rule without the filter in its expr).
    answers = {"gpu-temp-high": [Sample({**target("gpu001", "dcgm"), "gpu": "0"}, 87.0)]}
    assert run(answers).nodes["gpu001"].status == "ok"
    answers = {"gpu-temp-high": [Sample({**target("gpu001", "dcgm"), "gpu": "0"}, 88.0)]}
    assert run(answers).nodes["gpu001"].status == "warn"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_infinite_values_make_that_check_unknown_and_never_stop_the_run(value):
    answers = {"ib-down": [Sample({**target("gpu003", "node"), "device": "mlx5_2"}, value)],
               **xid79("gpu002")}
    report = run(answers)
    [check] = report.nodes["gpu003"].checks
    assert (check.id, check.status) == ("ib-down", "unknown") and report.nodes["gpu003"].status == "unknown"
    assert report.nodes["gpu003"].drain_checks() == []  # never drained on it
    assert report.nodes["gpu002"].status == "fail"  # the rest of the run goes on


def test_hca_rules_name_the_device():
    answers = {"ib-down": [Sample({**target("gpu003", "node"), "device": "mlx5_2", "port": "1"}, 1.0)]}
    check = run(answers).nodes["gpu003"].checks[0]
    assert (check.id, check.kind, check.device, check.status) == ("ib-down", "hca", "mlx5_2", "fail")


def test_node_takes_its_worst_status_and_checks_are_ordered_worst_first():
    answers = {**xid79("gpu001"), "gpu-temp-high": [Sample({**target("gpu001", "dcgm"), "gpu": "5"}, 95.0)]}
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


def test_nodes_outside_the_judged_partitions_get_no_verdict_at_all():
    report = run(xid79("gpu003"), slurm=["gpu001", "gpu002"], ignore={"gpu003"})
    assert "gpu003" not in report.nodes


def test_two_targets_of_one_job_naming_one_node_are_an_identity_conflict():
    up_samples, age_samples, reported = presence()
    up_samples.append(Sample({"job": "dcgm", "node": "gpu001", "instance": "second:9400"}, 1.0))
    identities = Identities(up_samples, reported, CONFIG)
    report = judge(list(RULES.values()), xid79("gpu001"), identities, age_samples, set(NODES), CONFIG, None, NOW)
    verdict = report.nodes["gpu001"]
    assert verdict.status == "unknown" and verdict.drain_checks() == [verdict.checks[-1]]  # kept, never acted on
    assert [c.id for c in verdict.checks if c.status == "unknown"] == ["identity-conflict"]
    assert "gpu001:9400, second:9400" in verdict.checks[0].evidence


def swapped(hostnames):
    """Identity answers where the dcgm target labelled node=N reports Hostname=hostnames.get(N, N)."""
    return [Sample({**target(n, "dcgm"), "__name__": m, "Hostname": hostnames.get(n, n)}, 1.0) for n in NODES
            for m in XID_METRICS]


def test_two_targets_with_swapped_node_labels_make_both_nodes_unknown_naming_both_names():
    # The target labelled gpu002 is the host gpu001 (its XID is gpu001's) and the other way round.
    report = run(xid79("gpu002"), reported=swapped({"gpu001": "gpu002.cluster.example", "gpu002": "GPU001"}))
    assert {n: v.status for n, v in report.nodes.items()} == {"gpu001": "unknown", "gpu002": "unknown",
                                                               "gpu003": "ok"}
    for name in ("gpu001", "gpu002"):
        [conflict] = [c for c in report.nodes[name].checks if c.status == "unknown"]
        assert conflict.id == "identity-conflict" and {"gpu001", "gpu002"} <= set(
            re.findall(r"gpu00\d", conflict.evidence.lower()))
    assert [c.evidence for c in report.nodes["gpu001"].checks][:1] == [
        "dcgm target gpu001:9400 is labelled node=gpu001 but reports Hostname=gpu002.cluster.example"]
    assert report.nodes["gpu002"].drain_checks() and not report.nodes["gpu001"].drain_checks()  # kept, not acted on


def test_a_label_that_names_another_host_makes_that_host_unknown_too():
    # gpu003's target says it is gpu001: gpu001's own data may be gpu003's, so neither is judged.
    report = run(reported=swapped({"gpu003": "gpu001"}))
    assert {n: v.status for n, v in report.nodes.items()} == {"gpu001": "unknown", "gpu002": "ok", "gpu003": "unknown"}
    assert [c.evidence for c in report.nodes["gpu001"].checks] == [
        "dcgm target gpu003:9400 is labelled node=gpu003 but reports Hostname=gpu001"]


@pytest.mark.parametrize("hostname", ["gpu002", "GPU002", "gpu002.cluster.example", "Gpu002.Other.Domain"])
def test_the_same_short_host_name_in_any_case_or_domain_is_no_conflict(hostname):
    report = run(xid79("gpu002"), reported=swapped({"gpu002": hostname}))
    assert report.nodes["gpu002"].status == "fail" and [c.id for c in report.nodes["gpu002"].checks] == ["xid-79"]


@pytest.mark.parametrize("answers,message", [
    ({"xid-79": [Sample({**target("gpu001", "dcgm"), "xid": "79"}, 1.0)]}, "without the 'gpu' label"),
    ({"xid-79": [Sample({"gpu": "1"}, 1.0)]}, "names no target"),
])
def test_series_that_cannot_be_placed_stop_the_run(answers, message):
    with pytest.raises(SourceUnavailable, match=message):
        run(answers)


def window_memory(count=1.0, acted_ago=60, gpu="gpu3"):
    return HandledMemory([Handled("gpu002", "xid-79", gpu, count, NOW - acted_ago, "window", 300.0, True)])


def test_an_xid_acted_on_within_its_window_is_handled_not_failing():
    verdict = run(xid79(), memory=window_memory()).nodes["gpu002"]
    assert verdict.status == "ok" and [c.status for c in verdict.checks] == ["handled"]
    assert verdict.breaching("xid-79") and verdict.drain_checks() == []


@pytest.mark.parametrize("count,acted_ago", [(2.0, 60), (1.0, 301)])
def test_a_higher_count_or_a_count_after_the_window_is_a_new_xid(count, acted_ago):
    assert run(xid79(count=count), memory=window_memory(acted_ago=acted_ago)).nodes["gpu002"].status == "fail"


def test_handled_memory_is_per_node_rule_and_device():
    assert run(xid79(gpu="3"), memory=window_memory(gpu="gpu4")).nodes["gpu002"].status == "fail"


@pytest.mark.parametrize("rule,labels,value,memory", [
    ("remapped-rows-high", {"gpu": "1"}, 9.0, "level"),     # a lifetime counter
    ("row-remap-failure", {"gpu": "1"}, 1.0, "level"),      # a latched gauge
    ("ecc-dbe-new", {"gpu": "1"}, 2.0, "window"),           # a windowed increase
])
def test_sticky_rules_remember_what_was_handled(rule, labels, value, memory):
    answers = {rule: [Sample({**target("gpu002", "dcgm"), **labels}, value)]}
    check = run(answers).nodes["gpu002"].checks[0]
    assert (check.status, check.memory) == ("fail", memory)
    handled = HandledMemory([Handled("gpu002", rule, "gpu1", value, NOW - 60, memory, check.window_s, True)])
    assert run(answers, memory=handled).nodes["gpu002"].status == "ok"
    higher = {rule: [Sample({**target("gpu002", "dcgm"), **labels}, value + 1)]}
    assert run(higher, memory=handled).nodes["gpu002"].status == "fail"  # a new event


def test_with_the_last_xid_gauge_a_handled_xid_never_repeats():
    config = parse_config({"catalog": {"xid_source": "gauge"}}, "t", {})
    answers = {"xid-79": [Sample({**target("gpu002", "dcgm"), "gpu": "3"}, 79.0)]}
    handled = HandledMemory([Handled("gpu002", "xid-79", "gpu3", 79.0, NOW - 30 * 86400, "level", 300.0, True)])
    assert run(answers, memory=handled, config=config).nodes["gpu002"].status == "ok"
    assert run(answers, config=config).nodes["gpu002"].status == "fail"


def test_auto_xid_source_reads_the_gauge_where_the_count_is_missing():
    config = parse_config({}, "t", {})
    assert config.catalog.xid_source == "auto"
    gauge = {"xid-79": [Sample({**target("gpu002", "dcgm"), "gpu": "3", "xid_source": "gauge"}, 79.0)]}
    [check] = run(gauge).nodes["gpu002"].checks
    assert (check.status, check.memory) == ("fail", "level")
    assert check.evidence == "gpu3 xid=79 (last-XID gauge; no windowed count)"


def test_an_exporter_with_neither_xid_metric_is_reported():
    up_samples, age_samples, _ = presence()
    reported = [Sample({**target(n, "dcgm"), "__name__": "DCGM_FI_DEV_GPU_TEMP", "Hostname": n}, 1.0) for n in NODES]
    reported += [Sample({**target(n, "dcgm"), "__name__": m, "Hostname": n}, 1.0) for n in ("gpu001", "gpu002")
                 for m in XID_METRICS]
    identities = Identities(up_samples, reported, CONFIG)
    report = judge(list(RULES.values()), {}, identities, age_samples, set(NODES), CONFIG, None, NOW)
    assert report.nodes["gpu003"].status == "warn" and report.nodes["gpu003"].checks[0].id == "xid-data"
    assert report.nodes["gpu001"].status == "ok"
