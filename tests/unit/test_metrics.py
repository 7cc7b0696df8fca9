"""opsctl's own metrics: what a run's result turns into, the textfile as the counters' memory, the
atomic write, and the refusal to let a metrics problem change a run. Serving them on an address and
scraping them is tested in tests/integration (the lab's Prometheus)."""

import os
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from opsctl.config import parse_config
from opsctl.errors import ExitCode, SafetyStop, SourceUnavailable
from opsctl.health.catalog import load_catalog
from opsctl.health.evaluate import Check, NodeVerdict, Report
from opsctl.health.evidence import Evidence
from opsctl.health.plan import plan_drains, plan_resumes
from opsctl.health.run import RunOptions, RunResult
from opsctl.metrics import FAMILIES, MetricsState, RunRecorder
from opsctl.metrics.observe import run_facts
from opsctl.slurm import SlurmNode

CONFIG = parse_config({}, "t", {})
RULES = load_catalog(CONFIG)
NOW = 1_800_000_000.0


def row_remap(gpu=2):
    return Check(id="row-remap-failure", severity="fail", status="fail", device=f"gpu{gpu}", kind="gpu", value=1,
                 threshold=0, op=">", evidence=f"gpu{gpu} row_remap_failure=1", action="drain")


def result(failing=(), slurm_over=None, n=20, unknown=(), dry_run=False, resume=False):
    names = [f"gpu{i:03d}" for i in range(1, n + 1)]
    nodes = {name: NodeVerdict(name, status="fail" if name in failing else "unknown" if name in unknown else "ok",
                               checks=[row_remap()] if name in failing else []) for name in names}
    slurm = {name: SlurmNode(name, "idle") for name in names} | (slurm_over or {})
    report = Report(nodes=nodes, rules=RULES)
    plan = plan_drains(report, slurm, RULES, CONFIG.safety, 0, dry_run)
    if resume:  # every rule of an opsctl drain reads ok on its node: the positive evidence a resume needs
        evidence = {(n, rule): Evidence("ok", [("mlx5_2", 4.0)]) for n, node in slurm.items()
                    for rule in node.reason_rules()}
        plan = plan_resumes(report, slurm, RULES, evidence, {n: NOW - 3600 for n in slurm}, 600, CONFIG.safety, 0,
                            dry_run, NOW, plan=plan)
    return RunResult(report=report, exit_code=ExitCode.FAILING if failing else ExitCode.OK, plan=plan,
                     options=RunOptions(drain=True, resume=resume, dry_run=dry_run), cluster=slurm,
                     after=slurm if dry_run else carried_out(slurm, plan))


def carried_out(slurm: dict, plan) -> dict:
    """Slurm after the plan's changes, as the actor reads it back after a run."""
    after = dict(slurm)
    for decision in plan.with_action("drain", "escalate"):
        node = after[decision.node]
        after[decision.node] = replace(node, flags=(*dict.fromkeys((*node.flags, "DRAIN")),), reason=decision.reason)
    for decision in plan.with_action("resume"):
        node = after[decision.node]
        after[decision.node] = replace(node, flags=tuple(f for f in node.flags if f != "DRAIN"), reason="")
    return after


def samples(state: MetricsState) -> dict:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(state)
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_drain_shows_in_counters_status_slurm_state_and_needs_person():
    state = MetricsState()
    state.record_completed(run_facts(result(failing={"gpu002"})), NOW)
    got = samples(state)
    assert got[("opsctl_drains_total", (("rule_id", "row-remap-failure"),))] == 1
    assert got[("opsctl_drains_total", (("rule_id", "xid-79"),))] == 0  # every rule that may drain starts at 0
    assert got[("opsctl_nodes", (("status", "fail"),))] == 1 and got[("opsctl_nodes", (("status", "ok"),))] == 19
    assert got[("opsctl_node_status", (("slurm_node", "gpu002"),))] == 2
    # The node as this run left it: drained, by opsctl, for a rule that a person must clear.
    assert got[("opsctl_slurm_nodes", (("state", "drained"),))] == 1
    assert got[("opsctl_node_drained", (("owner", "opsctl"), ("slurm_node", "gpu002")))] == 1
    assert got[("opsctl_node_needs_person", (("rule_id", "row-remap-failure"), ("slurm_node", "gpu002")))] == 1
    assert got[("opsctl_circuit_breaker_tripped", ())] == 0
    assert got[("opsctl_last_success_timestamp_seconds", ())] == NOW


def test_dry_run_counts_no_drain():
    state = MetricsState()
    state.record_completed(run_facts(result(failing={"gpu002"}, dry_run=True)), NOW)
    got = samples(state)
    assert got[("opsctl_drains_total", (("rule_id", "row-remap-failure"),))] == 0
    assert ("opsctl_node_drained", (("owner", "opsctl"), ("slurm_node", "gpu002"))) not in got


def test_a_tripped_breaker_and_its_refusals_are_counted():
    state = MetricsState()
    facts = run_facts(result(failing={"gpu001", "gpu002", "gpu003"}))  # 3 > max(2, 10 % of 20)
    assert facts.breaker_tripped
    state.record_completed(facts, NOW)
    got = samples(state)
    assert got[("opsctl_circuit_breaker_tripped", ())] == 1
    assert got[("opsctl_refusals_total", (("safety_rule", "circuit-breaker"),))] == 3
    assert got[("opsctl_refusals_total", (("safety_rule", "budget"),))] == 0


def test_the_unknown_share_breaker_counts_as_tripped():
    facts = run_facts(result(unknown={f"gpu{i:03d}" for i in range(1, 12)}))  # 11 of 20 unknown > 50 %
    assert facts.breaker_tripped and facts.node_status["gpu001"] == "unknown"


def test_resume_is_counted_per_rule_of_the_lifted_drain():
    over = {"gpu005": SlurmNode("gpu005", "idle", ("DRAIN",), "opsctl:ib-down mlx5_2 state_id=1")}
    facts = run_facts(result(slurm_over=over, resume=True))
    assert facts.resumes == ["ib-down"] and "gpu005" not in facts.drained
    assert facts.slurm_states == {"idle": 20}


def test_foreign_and_manual_drains_never_need_a_person_from_opsctl():
    over = {"gpu005": SlurmNode("gpu005", "allocated", ("DRAIN",), "maintenance"),
            "gpu006": SlurmNode("gpu006", "idle", ("DRAIN",), "opsctl:manual bad fan"),
            "gpu007": SlurmNode("gpu007", "idle", ("DRAIN",), "opsctl:gone-rule x")}
    facts = run_facts(result(slurm_over=over))
    assert facts.needs_person == {"gpu007": ["gone-rule"]}  # a rule no longer in the catalog: only a person knows
    assert facts.drained == {"gpu005": "other", "gpu006": "opsctl-manual", "gpu007": "opsctl"}
    assert facts.slurm_states["draining"] == 1 and facts.slurm_states["drained"] == 2


def fake_run(outcome):
    def run():
        if isinstance(outcome, Exception):
            raise outcome
        return outcome
    return run


def test_textfile_counters_survive_from_run_to_run_and_the_write_is_atomic(tmp_path):
    path = tmp_path / "opsctl.prom"
    config = parse_config({"metrics": {"textfile": str(path)}}, "t", {}).metrics
    warnings = []
    clock = iter([NOW, NOW + 60, NOW + 120, NOW + 180])
    for outcome in (result(failing={"gpu002"}), SourceUnavailable("Prometheus down"), SafetyStop("lock held")):
        recorder = RunRecorder(config, serve=False, warn=warnings.append, clock=lambda: next(clock))
        try:
            recorder.wrap(fake_run(outcome))()
        except (SourceUnavailable, SafetyStop):
            pass
    assert warnings == []
    assert [p.name for p in tmp_path.iterdir()] == ["opsctl.prom"]  # no temporary file left behind
    state = MetricsState()
    state.restore(path.read_text())
    got = samples(state)
    assert {r: got[("opsctl_runs_total", (("result", r),))] for r in ("failing", "source-down", "safety-stop", "ok")} \
        == {"failing": 1, "source-down": 1, "safety-stop": 1, "ok": 0}
    assert got[("opsctl_refusals_total", (("safety_rule", "lock"),))] == 1
    assert got[("opsctl_drains_total", (("rule_id", "row-remap-failure"),))] == 1
    assert got[("opsctl_run_duration_seconds_count", ())] == 3
    # A failed run keeps the last completed run's picture and its success time.
    assert got[("opsctl_last_success_timestamp_seconds", ())] == NOW
    assert got[("opsctl_last_run_timestamp_seconds", ())] == NOW + 180
    assert got[("opsctl_node_status", (("slurm_node", "gpu002"),))] == 2


def test_an_unwritable_textfile_warns_and_the_run_still_returns(tmp_path):
    path = tmp_path / "ro" / "opsctl.prom"
    config = parse_config({"metrics": {"textfile": str(path)}}, "t", {}).metrics
    warnings = []
    done = result()
    assert RunRecorder(config, serve=False, warn=warnings.append).wrap(fake_run(done))() is done
    assert len(warnings) == 1 and "metrics not written" in warnings[0] and str(path) in warnings[0]


def test_a_foreign_textfile_restarts_the_counters_with_a_warning(tmp_path):
    path = tmp_path / "opsctl.prom"
    path.write_text("this is { not the text format\n")
    config = parse_config({"metrics": {"textfile": str(path)}}, "t", {}).metrics
    warnings = []
    RunRecorder(config, serve=False, warn=warnings.append)
    assert len(warnings) == 1 and "counters start again" in warnings[0]


def test_without_a_textfile_a_one_shot_run_is_not_wrapped():
    run = fake_run(result())
    assert RunRecorder(CONFIG.metrics, serve=False, warn=print).wrap(run) is run


def test_every_family_is_exposed_with_help_and_its_labels():
    state = MetricsState()
    state.record_run(0, 1.5, NOW)
    state.record_completed(run_facts(result(failing={"gpu002"})), NOW)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(state)
    text = generate_latest(registry).decode()
    for family in FAMILIES:
        assert f"# HELP {family.name.removesuffix('_total')}" in text
    assert 'opsctl_run_duration_seconds_bucket{le="2.0"} 1.0' in text
    assert 'opsctl_run_duration_seconds_bucket{le="1.0"} 0.0' in text


@pytest.mark.parametrize("raw, error", [
    ({"metrics": {"listen_address": "9479"}}, "metrics.listen_address"),
    ({"metrics": {"listen_address": "127.0.0.1:70000"}}, "metrics.listen_address"),
    ({"metrics": {"textfile": "relative.prom"}}, "metrics.textfile"),
    ({"metrics": {"textfile": "/var/lib/x/opsctl.txt"}}, "metrics.textfile"),
    ({"metrics": {"port": 1}}, "metrics.port"),
    ({"alerts": {"drained_fraction": 0}}, "alerts.drained_fraction"),
    ({"alerts": {"run_missing_after": "5 minutes"}}, "alerts.run_missing_after"),
])
def test_bad_metrics_and_alerts_keys_are_named(raw, error):
    from opsctl.errors import ConfigError

    with pytest.raises(ConfigError, match=error.replace(".", r"\.")):
        parse_config(raw, "t", {})


def test_metrics_defaults_serve_on_loopback_and_null_switches_it_off():
    assert CONFIG.metrics.listen_address == "127.0.0.1:9479" and CONFIG.metrics.textfile is None
    assert parse_config({"metrics": {"listen_address": None}}, "t", {}).metrics.listen_address is None
    assert parse_config({"metrics": {"listen_address": "[::1]:9479"}}, "t", {}).metrics.listen_address == "[::1]:9479"


def test_written_file_is_world_readable_for_node_exporter(tmp_path):
    path = tmp_path / "opsctl.prom"
    config = parse_config({"metrics": {"textfile": str(path)}}, "t", {}).metrics
    old = os.umask(0o077)
    try:
        RunRecorder(config, serve=False, warn=print).wrap(fake_run(result()))()
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644


def test_system_alerts_take_their_thresholds_and_job_names_from_the_config():
    from opsctl.metrics.alerts import system_alerts

    site = parse_config({"alerts": {"run_missing_after": "10m", "drained_fraction": 0.25, "exporter_down_for": "5m"},
                         "prometheus": {"jobs": {"dcgm": "gpu", "node": "host"}}}, "t", {})
    rules = {r["alert"]: r for r in system_alerts(site)["rules"]}
    assert "> 600" in rules["OpsctlRunsStopped"]["expr"]
    assert rules["OpsctlManyNodesDrained"]["expr"].endswith("> 0.25")
    assert rules["OpsctlExporterDown"] == {**rules["OpsctlExporterDown"], "expr": 'up{job=~"gpu|host"} == 0',
                                           "for": "5m"}
