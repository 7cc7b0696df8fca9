"""One run of `opsctl health` reads one moment of the data (opsctl/health/evaluate.py): every rule is
asked at the time of the first `up` answer, and `up` is read again at that time after the rules, so a
scrape that fails while the run goes on makes its node unknown, never ok on series that vanished."""

import pytest

from opsctl.actor.state import State
from opsctl.config import parse_config
from opsctl.health.evaluate import evaluate
from tests.unit.fakes import FakeProm, World, gpu_nodes, node

NODES = gpu_nodes(4)


@pytest.fixture
def config(tmp_path):
    return parse_config({"metrics": {"listen_address": None}, "prometheus": {"recording_rules": "off"}}, "t",
                        {"OPSCTL_STATE_DIR": str(tmp_path / "state")})


class ScrapeFailsDuringTheRun(FakeProm):
    """gpu002's dcgm target was up when the run began; its next scrape, begun before that moment, fails
    and lands while the rules are read: Prometheus marks its series stale, so they are gone."""

    def __init__(self, config, nodes):
        super().__init__(config, nodes)
        self.failed = False

    def query(self, expr, at=None):
        answer = super().query(expr, at)
        if expr.startswith("up{") and not self.failed:
            self.failed = True
            self.up[("gpu002", "dcgm")] = 0.0
            self.breaching.pop("xid-79", None)
        return answer


def test_every_rule_and_the_second_up_read_are_asked_at_the_first_up_answers_time(config):
    prom = FakeProm(config, NODES)
    prom.now = 1_750_000_123.5
    report = evaluate(prom, prom.rules, config, NODES)
    pinned = [(expr, at) for expr, at in zip(prom.asked, prom.asked_at, strict=True)
              if any(expr == rule.alert_expr() for rule in prom.rules) or at is not None]
    assert report.query_time == 1_750_000_123.5
    assert len(pinned) == len(prom.rules) + 1 and {at for _, at in pinned} == {1_750_000_123.5}
    assert prom.asked[-1].startswith("up{")  # read again after every rule


def test_a_scrape_that_fails_during_the_run_makes_the_node_unknown_not_ok(config):
    prom = ScrapeFailsDuringTheRun(config, NODES)
    prom.breach("xid-79", "gpu002", "3")
    report = evaluate(prom, prom.rules, config, NODES)
    gpu002 = report.nodes["gpu002"]
    assert gpu002.status == "unknown"
    assert [(c.id, c.evidence) for c in gpu002.checks] == [("data-dcgm", "dcgm exporter down")]
    assert {report.nodes[n].status for n in NODES if n != "gpu002"} == {"ok"}


def test_a_target_gone_from_the_second_up_read_is_down(config):
    prom = FakeProm(config, NODES)
    original = prom.query
    prom.query = lambda expr, at=None: ([s for s in original(expr, at) if s.labels["node"] != "gpu003"]
                                        if expr.startswith("up{") and at is not None else original(expr, at))
    report = evaluate(prom, prom.rules, config, NODES)
    assert report.nodes["gpu003"].status == "unknown"
    assert {c.id for c in report.nodes["gpu003"].checks} == {"data-dcgm", "data-node"}


def test_with_recorded_results_the_second_up_read_reaches_back_past_their_evaluation(tmp_path):
    """Recorded results 20 s old were evaluated while gpu004's last scrape had failed, so they lack its
    series: `up` over 20 s plus a scrape interval (30 s) finds that scrape and makes gpu004 unknown."""
    config = parse_config({"metrics": {"listen_address": None}}, "t", {"OPSCTL_STATE_DIR": str(tmp_path)})
    prom = FakeProm(config, NODES)
    prom.record_all(age=20.0)
    original = prom.query
    down_since = {"gpu004"}

    def query(expr, at=None):
        answer = original(expr, at)
        if expr.startswith("min_over_time(up{"):
            return [s if s.labels["node"] not in down_since else type(s)(s.labels, 0.0, s.at) for s in answer]
        return answer

    prom.query = query
    report = evaluate(prom, prom.rules, config, NODES)
    assert report.rule_results == "precomputed"
    assert [q for q in prom.asked if q.startswith("min_over_time(")] == [
        'min_over_time(up{job=~"dcgm|node"}[50s])']
    assert report.nodes["gpu004"].status == "unknown"
    assert {report.nodes[n].status for n in NODES if n != "gpu004"} == {"ok"}


def test_a_node_opsctl_resumed_after_the_data_was_scraped_is_not_drained_on_it(tmp_path):
    """`opsctl remediate` resumed gpu040 after a GPU reset; recorded results 20 s old still show the fault the
    reset cleared. That run leaves gpu040 alone (skip:resumed-since-data); a run on data a scrape newer than
    the resume drains as before."""
    world = World(tmp_path)  # scrape interval 30 s; the fake Prometheus's clock is world.prom.now
    world.prom.record_all(age=20.0)
    world.prom.breach("row-remap-pending", "gpu040", "2")
    world.prom.breach("row-remap-pending", "gpu041", "5")
    State(world.config.state_dir).resumes.record(["gpu040"], world.prom.now - 40.0)
    code, nodes, _ = world.json("--drain")
    assert (nodes["gpu040"]["action"], nodes["gpu041"]["action"]) == ("skip:resumed-since-data", "drain")
    assert not world.slurm.state["gpu040"].drained and world.slurm.state["gpu041"].drained
    refusal = next(r for r in world.audit() if r["event"] == "refuse" and r["node"] == "gpu040")
    assert refusal["detail"].startswith("resumed-since-data: opsctl resumed it after the data this run read")
    world.prom.now += 60.0  # the data is now a scrape newer than the resume
    code, nodes, _ = world.json("--drain")
    assert nodes["gpu040"]["action"] == "drain" and world.slurm.state["gpu040"].drained


def test_every_resume_opsctl_makes_is_recorded_for_that_check(tmp_path):
    world = World(tmp_path, gpu040=node("gpu040", flags=("DRAIN",), reason="opsctl:manual fan swap"))
    assert world.run("resume", "gpu040") == 0
    assert set(State(world.config.state_dir).resumes.load()) == {"gpu040"}
