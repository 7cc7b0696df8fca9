"""`opsctl job-health` and `opsctl why` of a running job (opsctl/jobhealth, opsctl/commands/job_health.py) over
fakes of opsctl's own Protocols: the robust score and its floors, each verdict from made-up per-node values,
no data, the cost in queries, squeue's lines, the config, and the command's JSON, queue, audit and metrics.
The lab tier runs it on real Slurm and Prometheus (tests/integration/lab/test_lab_job_health.py)."""

import json
import subprocess

import pytest
import yaml
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from opsctl.actor.audit import AuditLog
from opsctl.actor.state import State
from opsctl.cli import main
from opsctl.clients import Clients
from opsctl.config import parse_config
from opsctl.errors import SourceUnavailable
from opsctl.jobhealth import score
from opsctl.jobhealth.run import evaluate
from opsctl.jobhealth.signals import in_use
from opsctl.jobhealth.verdict import HUNG, NO_DATA, OK, SLOW, STARTING, judge
from opsctl.prom.client import Sample
from opsctl.slurm.accounting import FinishedJob
from opsctl.slurm.base import RunningJob
from opsctl.slurm.cli import SlurmCliImpl, parse_running
from tests.unit.fakes import FakeProm

NOW = 1_750_000_000.0
NODES = tuple(f"gpu{i:03d}" for i in range(41, 49))  # eight nodes
GBPS = 25e9  # a busy node's InfiniBand bytes per second


def healthy(**changes) -> dict[str, float]:
    """One node of a synchronous job that computes: its GPUs busy at full clock, traffic on both fabrics."""
    return {"gpu-util": 100.0, "gpu-util-min": 100.0, "sm-clock": 1980.0, "power": 650.0, "activity": 0.9,
            "nvlink": 4e11, "ib": GBPS, **changes}


def job(nodes=NODES, start=NOW - 600, job_id="4242") -> RunningJob:
    return RunningJob(job_id, "llama", "alice", tuple(nodes), start)


def cfg(tmp_path=None, **job_health):
    env = {"OPSCTL_STATE_DIR": str(tmp_path / "state")} if tmp_path else {}
    return parse_config({"prometheus": {"scrape_interval": "15s"}, "job_health": job_health}, "t", env)


def values(**odd) -> dict[str, dict[str, float]]:
    """Every node healthy but those given: node=dict of its changed signals."""
    return {node: healthy(**odd.get(node, {})) for node in NODES}


# ---- the score -----------------------------------------------------------------------------------------------
def test_the_score_is_the_deviation_from_the_median_in_robust_standard_deviations():
    got = score.scores({"a": 10.0, "b": 12.0, "c": 14.0, "d": 100.0}, mad_floor=0.0)
    # median 13, MAD median(3, 1, 1, 87) = 2: d is (100 - 13) / (1.4826 * 2) away
    assert got["d"].median == 13.0 and got["d"].score == pytest.approx(87 / (1.4826 * 2))
    assert got["d"].deviation == pytest.approx(87 / 13)


def test_identical_nodes_score_against_the_mad_floor_not_zero():
    same = {f"n{i}": 1980.0 for i in range(7)} | {"odd": 1950.0}
    # MAD 0; floored at 2 % of the median: 30 MHz is 30 / (1.4826 * 39.6) = 0.5, nowhere near 3.5
    assert score.scores(same, mad_floor=0.02)["odd"].score == pytest.approx(30 / (1.4826 * 39.6))
    assert score.outliers(same, "low", 0.02, 3.5, 0.10) == {}


def test_a_high_score_below_the_minimum_deviation_names_no_one():
    close = {f"n{i}": 1980.0 for i in range(7)} | {"odd": 1880.0}  # 5 % low: score 3.4 at a 1 % floor ...
    assert score.scores(close, mad_floor=0.01)["odd"].score > 3.35
    assert score.outliers(close, "low", 0.001, 3.5, 0.10) == {}  # ... and 34 at 0.1 %, but only 5 % away
    assert set(score.outliers(close, "low", 0.001, 3.5, 0.04)) == {"odd"}


def test_only_the_bad_side_counts_and_two_nodes_have_no_median_to_stand_out_from():
    fast = {f"n{i}": 1980.0 for i in range(7)} | {"odd": 2400.0}
    assert score.outliers(fast, "low", 0.02, 3.5, 0.1) == {}
    assert set(score.outliers(fast, "high", 0.02, 3.5, 0.1)) == {"odd"}
    assert score.scores({"a": 1980.0, "b": 1200.0}, 0.02) == {}
    assert score.scores({"a": 0.0, "b": 0.0, "c": 5.0}, 0.02) == {}  # a median of 0: no share to compare


# ---- verdicts ----------------------------------------------------------------------------------------------
def test_a_slow_gpu_names_its_node_by_sm_clock_and_by_power_with_values():
    slow_node = {"sm-clock": 1200.0, "power": 660.0}
    waiting = {"power": 200.0}  # the peers wait for it at low power
    health = judge(job(), {n: healthy(**(slow_node if n == "gpu044" else waiting)) for n in NODES}, NOW,
                   cfg().job_health)
    assert (health.verdict, health.named()) == (SLOW, ["gpu044"])
    by_signal = {f.signal: f for f in health.findings}
    assert set(by_signal) == {"sm-clock", "power"}
    assert by_signal["sm-clock"].words.startswith("gpu044: sm clock 1200 MHz, job median 1980 MHz (low, score ")
    assert by_signal["power"].words.startswith("gpu044: gpu power 660 W, job median 200 W (high, score ")
    assert all(f.node == "gpu044" and f.verdict == SLOW for f in health.findings)


@pytest.mark.parametrize("signal,low", [("activity", 0.55), ("ib", 0.4 * GBPS)])
def test_low_activity_or_low_infiniband_throughput_is_slow(signal, low):
    health = judge(job(), values(gpu046={signal: low}), NOW, cfg().job_health)
    assert (health.verdict, [(f.node, f.signal) for f in health.findings]) == (SLOW, [("gpu046", signal)])


def test_healthy_jitter_gives_no_verdict():
    jitter = {node: healthy(**{"sm-clock": 1980.0 - 15 * (i % 2), "power": 620.0 + 9 * i, "activity": 0.88 + 0.005 * i,
                               "ib": GBPS * (1 - 0.01 * i), "gpu-util-min": 97.0 + i % 3})
              for i, node in enumerate(NODES)}
    health = judge(job(), jitter, NOW, cfg().job_health)
    assert (health.verdict, health.findings) == (OK, ())


def test_a_signal_left_out_of_job_health_signals_names_no_one():
    odd = values(gpu046={"activity": 0.3})
    assert judge(job(), odd, NOW, cfg(signals=["sm-clock", "power"]).job_health).verdict == OK


def test_clock_event_reasons_that_few_nodes_have_name_them_and_those_all_have_do_not():
    config = cfg().job_health
    capped = values(gpu047={"clock-events": 0x4})
    health = judge(job(), capped, NOW, config)
    assert [(f.node, f.signal, f.words) for f in health.findings] == [
        ("gpu047", "clock-events", "gpu047: clock event reasons SW_POWER_CAP (0x4), on 1 of the job's 8 nodes")]
    everyone = {n: healthy(**{"clock-events": 0x4}) for n in NODES}  # the site's own power cap
    assert judge(job(), everyone, NOW, config).verdict == OK


def test_a_hung_job_names_the_node_whose_gpus_idle_while_its_peers_spin():
    quiet = {"nvlink": 0.0, "ib": 120.0}  # a few management packets
    idle = {**quiet, "gpu-util": 0.0, "gpu-util-min": 0.0, "power": 90.0}
    health = judge(job(), {n: healthy(**(idle if n == "gpu045" else quiet)) for n in NODES}, NOW,
                   cfg().job_health)
    assert (health.verdict, health.named()) == (HUNG, ["gpu045"])
    (finding,) = health.findings
    assert finding.signal == "gpu-util-min" and finding.median == 100.0
    assert "no traffic on any node of the job" in finding.words


def test_a_hung_job_whose_nodes_all_wait_alike_names_no_node():
    health = judge(job(), {n: healthy(nvlink=0.0, ib=0.0) for n in NODES}, NOW, cfg().job_health)
    assert (health.verdict, health.named()) == (HUNG, [])
    (finding,) = health.findings
    assert (finding.node, finding.signal) == ("", "traffic")
    assert finding.words.startswith("no NVLink or InfiniBand traffic on any of the job's 8 nodes over the last 1m")


def test_an_idle_node_among_busy_peers_is_named_hung_even_with_some_traffic():
    health = judge(job(), values(gpu048={"gpu-util": 40.0, "gpu-util-min": 0.0}), NOW, cfg().job_health)
    assert (health.verdict, health.named()) == (HUNG, ["gpu048"])
    assert "the job still moves some traffic" in health.findings[0].words


def test_a_job_mostly_idle_is_not_hung_on_one_node():
    idle = {"gpu-util": 0.0, "gpu-util-min": 0.0}
    mostly = {n: healthy(**idle) if i < 5 else healthy() for i, n in enumerate(NODES)}
    assert judge(job(), mostly, NOW, cfg().job_health).verdict == OK


def test_a_job_younger_than_the_window_gets_no_verdict():
    quiet = {n: healthy(nvlink=0.0, ib=0.0) for n in NODES}
    assert judge(job(start=NOW - 30), quiet, NOW, cfg().job_health).verdict == STARTING
    assert judge(job(start=NOW - 61), quiet, NOW, cfg().job_health).verdict == HUNG


def test_a_node_without_data_is_said_and_never_named():
    odd = values(gpu044={"sm-clock": 1200.0})
    del odd["gpu044"]  # Prometheus holds no series of it
    health = judge(job(), odd, NOW, cfg().job_health)
    assert (health.verdict, health.no_data, health.named()) == (OK, ("gpu044",), [])
    assert judge(job(), {}, NOW, cfg().job_health).verdict == NO_DATA
    # A node without traffic series cannot tell that nothing moved: no hang on the others' silence alone.
    quiet = {n: healthy(nvlink=0.0, ib=0.0) for n in NODES}
    quiet["gpu041"] = {k: v for k, v in quiet["gpu041"].items() if k not in ("nvlink", "ib")}
    assert judge(job(), quiet, NOW, cfg().job_health).verdict == OK


# ---- Prometheus: one query per signal -----------------------------------------------------------------------
class SignalProm(FakeProm):
    """FakeProm (targets labelled node=<name>, `up`, identities) answering the signals' queries from
    node -> signal -> value; a node with a value of None for a signal has no series for it."""

    def __init__(self, config, per_node):
        super().__init__(config, list(per_node))
        self.per_node = per_node
        self.exprs = {s.expr(config): s for s in in_use(config)}

    def query(self, expr, at=None):
        signal = self.exprs.get(expr)
        if signal is None:
            return super().query(expr, at)
        self.queries += 1
        self.asked.append(expr)
        if self.fail_with is not None:
            raise self.fail_with
        return [Sample(self._labels(node, signal.source, {"gpu": "3"} if signal.name == "clock-events" else {}),
                       own[signal.name]) for node, own in self.per_node.items() if own.get(signal.name) is not None]


def many_jobs(count: int, size: int = 8) -> list[RunningJob]:
    return [job([f"gpu{j * size + i:04d}" for i in range(size)], job_id=str(1000 + j)) for j in range(count)]


def test_the_queries_are_one_per_signal_and_two_for_identities_however_many_jobs():
    config = cfg()
    counts = []
    for jobs in (many_jobs(1), many_jobs(100)):
        prom = SignalProm(config, {n: healthy() for j in jobs for n in j.nodes})
        judged, queries = evaluate(config, prom, jobs, NOW)
        assert [h.verdict for h in judged] == [OK] * len(jobs)
        counts.append(queries)
    assert counts == [len(in_use(config)) + 2] * 2
    no_node_exporter = parse_config({"prometheus": {"jobs": {"dcgm": "dcgm", "node": None}}}, "t", {})
    assert "ib" not in {s.name for s in in_use(no_node_exporter)}


def test_series_are_mapped_to_slurm_nodes_and_split_by_job():
    config = cfg()
    first, second = many_jobs(2)
    per_node = {n: healthy() for n in first.nodes + second.nodes}
    per_node["gpu0010"] = healthy(**{"sm-clock": 1200.0})  # a node of the second job
    judged, _ = evaluate(config, SignalProm(config, per_node), [first, second], NOW)
    assert [(h.job.id, h.verdict, h.named()) for h in judged] == [("1000", OK, []), ("1001", SLOW, ["gpu0010"])]


def test_no_query_without_a_running_job():
    config = cfg()
    prom = SignalProm(config, {})
    assert evaluate(config, prom, [], NOW) == ([], 0) and prom.asked == []


def test_a_partial_answer_is_a_source_error():
    config = cfg()
    prom = SignalProm(config, {n: healthy() for n in NODES})
    prom.partial = ["query processing would load too many samples"]
    with pytest.raises(SourceUnavailable, match="may be partial"):
        evaluate(config, prom, [job()], NOW)


# ---- squeue ---------------------------------------------------------------------------------------------------
def test_squeue_lines_give_each_job_its_expanded_nodes_and_start():
    text = ("4242|alice|2026-12-04T14:02:11|gpu[041-044,050]|llama|70b\n"
            "4243_7|bob|N/A|gpu046|sweep\n\n")
    first, second = parse_running(text)
    assert (first.id, first.user, first.name) == ("4242", "alice", "llama|70b")  # the name may hold the delimiter
    assert first.nodes == ("gpu041", "gpu042", "gpu043", "gpu044", "gpu050") and first.start is not None
    assert (second.id, second.nodes, second.start) == ("4243_7", ("gpu046",), None)
    with pytest.raises(SourceUnavailable, match="not id|user|start|nodes|name"):
        parse_running("squeue: error: Invalid user\n")
    with pytest.raises(SourceUnavailable, match="job 17: bad range"):
        parse_running("17|alice|N/A|gpu[09-03]|x\n")


def test_running_jobs_asks_squeue_for_running_jobs_in_a_fixed_format():
    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "5|carol|2026-12-04T14:02:11|gpu[046-047]|train\n", "")

    jobs = SlurmCliImpl(scontrol="/usr/bin/scontrol", run=run, environ={}).running_jobs()
    assert calls == [["/usr/bin/squeue", "--noheader", "--states=RUNNING", "--format=%i|%u|%S|%N|%j"]]
    assert [(j.id, j.nodes) for j in jobs] == [("5", ("gpu046", "gpu047"))]


# ---- the command ---------------------------------------------------------------------------------------------
class Queue:
    """The Slurm jobs client's running jobs (squeue)."""

    def __init__(self, jobs=(), fail=None):
        self.jobs = list(jobs)
        self.fail = fail

    def running_jobs(self):
        if self.fail:
            raise self.fail
        return self.jobs


def invoke(args, config, prom, jobs=None, accounting=None):
    return CliRunner().invoke(main, args, obj=Clients(config=config, prom=prom, jobs=jobs, accounting=accounting))


def slow_cluster(config):
    """Job 4242 on NODES with gpu044 slow, a single-node job beside it, and a hung job 4343 of four nodes."""
    hung_nodes = tuple(f"gpu{i:03d}" for i in range(51, 55))
    per_node = {n: healthy(**({"sm-clock": 1200.0} if n == "gpu044" else {})) for n in NODES}
    per_node |= {n: healthy(nvlink=0.0, ib=0.0, **({"gpu-util": 0.0, "gpu-util-min": 0.0} if n == "gpu052" else {}))
                 for n in hung_nodes}
    running = [job(), job(("gpu060",), job_id="4300"), job(hung_nodes, job_id="4343")]
    return SignalProm(config, per_node), Queue(running)


def test_job_health_json_names_each_jobs_node_and_says_what_it_read(tmp_path):
    config = cfg(tmp_path)
    prom, queue = slow_cluster(config)
    result = invoke(["job-health", "--json"], config, prom, queue)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert (doc["single_node_jobs"], doc["queued"], doc["queries"]) == (1, [], len(in_use(config)) + 2)
    slow, hung = doc["jobs"]
    assert (slow["job"]["id"], slow["running"], slow["verdict"], slow["culprit"]) == ("4242", True, "slow", "gpu044")
    verdict = slow["verdicts"][0]
    assert (verdict["node"], verdict["signal"], verdict["value"], verdict["job_median"]) == ("gpu044", "sm-clock",
                                                                                           1200.0, 1980.0)
    assert slow["values"]["gpu041"]["sm-clock"] == 1980.0 and slow["no_data"] == []
    assert (hung["verdict"], hung["nodes_named"]) == ("hung", ["gpu052"])
    # Without --queue it is read-only: nothing queued, audited or written.
    assert State(config.state_dir).validate_queue.load() == {} and AuditLog(config.audit_log).read()[0] == []


def test_queue_queues_the_nodes_audits_each_verdict_once_and_writes_the_metrics(tmp_path):
    textfile = tmp_path / "textfile" / "opsctl-job-health.prom"
    textfile.parent.mkdir()  # node_exporter's textfile directory, there before opsctl
    config = cfg(tmp_path, textfile=str(textfile))
    prom, queue = slow_cluster(config)
    for _ in range(2):  # the timer's next minute finds the same verdicts
        result = invoke(["job-health", "--queue"], config, prom, queue)
        assert result.exit_code == 0, result.output
    assert "queued for opsctl validate" not in result.output  # the second run: already queued
    waiting = State(config.state_dir).validate_queue.load()
    assert set(waiting) == {"gpu044", "gpu052"}
    assert waiting["gpu044"]["why"].startswith("job 4242 slow: gpu044: sm clock 1200 MHz, job median 1980 MHz")
    records, _ = AuditLog(config.audit_log).read()
    assert sorted((r["event"], r["node"], r["checks"][0], r["reason"]) for r in records) == [
        ("job-health", "gpu044", "sm-clock", "job 4242"), ("job-health", "gpu052", "gpu-util-min", "job 4343")]
    assert records[0]["detail"].startswith("slow: gpu044: sm clock 1200 MHz")
    series = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for family in text_string_to_metric_families(textfile.read_text()) for s in family.samples}
    verdicts = sorted((dict(labels) for name, labels in series if name == "opsctl_job_health_verdict"),
                      key=lambda labels: labels["slurm_job"])
    assert verdicts == [
        {"signal": "sm-clock", "slurm_job": "4242", "slurm_node": "gpu044", "verdict": "slow"},
        {"signal": "gpu-util-min", "slurm_job": "4343", "slurm_node": "gpu052", "verdict": "hung"}]
    assert series[("opsctl_job_health_jobs", (("verdict", "slow"),))] == 1.0


def test_the_textfile_defaults_to_beside_opsctl_healths_and_a_bad_one_is_only_a_warning(tmp_path):
    (tmp_path / "collector").mkdir()
    config = parse_config({"prometheus": {"scrape_interval": "15s"},
                           "metrics": {"textfile": str(tmp_path / "collector" / "opsctl.prom")}}, "t",
                          {"OPSCTL_STATE_DIR": str(tmp_path / "state")})
    prom, queue = slow_cluster(config)
    assert invoke(["job-health", "--queue"], config, prom, queue).exit_code == 0
    assert "opsctl_job_health_verdict{" in (tmp_path / "collector" / "opsctl-job-health.prom").read_text()
    (tmp_path / "blocked").write_text("")  # a file where the directory should be
    blocked = cfg(tmp_path, textfile=str(tmp_path / "blocked" / "x.prom"))
    result = invoke(["job-health", "--queue"], blocked, prom, queue)
    assert result.exit_code == 0 and "metrics not written" in result.output


def test_human_output_lists_the_jobs_with_a_verdict(tmp_path):
    config = cfg(tmp_path)
    prom, queue = slow_cluster(config)
    lines = invoke(["job-health"], config, prom, queue).output.splitlines()
    assert lines[0] == "job 4242 (llama, user alice): running on gpu[041-048] (8 nodes): slow"
    assert lines[1].startswith("  gpu044: sm clock 1200 MHz, job median 1980 MHz")
    assert lines[-1] == f"2 running jobs of 2 nodes or more, 0 of them ok ({len(in_use(config)) + 2} queries)"


def test_exit_codes_slurm_or_prometheus_down_is_3(tmp_path):
    config = cfg(tmp_path)
    prom, queue = slow_cluster(config)
    down = invoke(["job-health"], config, prom, Queue(fail=SourceUnavailable("Slurm: squeue --noheader failed: "
                                                                              "Unable to contact slurm controller")))
    assert down.exit_code == 3 and "squeue" in down.output
    prom.fail_with = SourceUnavailable("Prometheus: connection refused")
    assert invoke(["job-health"], config, prom, queue).exit_code == 3


@pytest.mark.parametrize("job_health,words", [
    ({"window": "a minute"}, "config key job_health.window: expected a duration"),
    ({"window": "15s"}, "config key job_health.window: must span two scrapes"),
    ({"min_deviation": 2}, "config key job_health.min_deviation: must be between 0 and 1"),
])
def test_a_bad_job_health_key_is_a_one_line_config_error(tmp_path, job_health, words):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"prometheus": {"scrape_interval": "15s"}, "job_health": job_health}))
    result = CliRunner().invoke(main, ["job-health", "--config", str(path)], obj=Clients(jobs=Queue()))
    assert result.exit_code == 2
    assert result.output.startswith(f"opsctl: error: {words}") and len(result.output.strip().splitlines()) == 1


# ---- opsctl why of a running job ---------------------------------------------------------------------------
class Accounting:
    def __init__(self, jobs):
        self.jobs = {j.id: j for j in jobs}

    def finished_job(self, job_id):
        return self.jobs.get(job_id)

    def finished_jobs(self, since, until):
        return list(self.jobs.values())


def test_why_of_a_running_job_answers_with_its_verdict(tmp_path):
    config = cfg(tmp_path)
    prom, queue = slow_cluster(config)
    # slurmdbd learns of a start a moment after it: squeue, not sacct, says the job runs, and on which nodes
    running = FinishedJob("4242", "llama", "alice", "PENDING", (), None, None)
    result = invoke(["why", "4242", "--json"], config, prom, queue, Accounting([running]))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert (doc["running"], doc["verdict"], doc["culprit"], doc["job"]["state"]) == (True, "slow", "gpu044",
                                                                                     "RUNNING")
    assert doc["verdicts"][0]["words"].startswith("gpu044: sm clock 1200 MHz") and doc["queries"] > 0
    text = invoke(["why", "4242"], config, prom, queue, Accounting([running])).output
    assert "slow" in text.splitlines()[0] and "gpu044: sm clock" in text
    # --record writes the answer of an ended job: a running one is still refused, and nothing is written.
    refused = invoke(["why", "4242", "--record"], config, prom, queue, Accounting([running]))
    assert refused.exit_code == 2 and "has not ended (PENDING)" in refused.output
    assert AuditLog(config.audit_log).read()[0] == []
    pending = FinishedJob("4999", "next", "alice", "PENDING", (), None, None)  # squeue does not list it running
    waiting = invoke(["why", "4999"], config, prom, queue, Accounting([pending]))
    assert waiting.exit_code == 2 and "has not ended (PENDING) and does not run" in waiting.output
    single = invoke(["why", "4300", "--json"], config, prom, queue,
                    Accounting([FinishedJob("4300", "x", "alice", "RUNNING", ("gpu060",), NOW - 600, None)]))
    assert json.loads(single.output)["verdict"] == "one node"
