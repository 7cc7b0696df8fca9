"""`opsctl why JOB` and `opsctl suspects` (opsctl/why, opsctl/commands/why.py) over fakes of opsctl's own
Protocols: which events a job's window holds, who the likely culprit is, the suspicion score and the
validation queue, and the command's exit codes. The lab tier runs both on real Slurm (slurmdbd, sacct) and
Prometheus (tests/integration/lab/test_lab_why.py); test_sacct.py parses the three releases' real sacct."""

import json

import pytest
from click.testing import CliRunner

from opsctl.actor.audit import AuditLog
from opsctl.actor.state import State
from opsctl.cli import main
from opsctl.clients import Clients
from opsctl.config import parse_config
from opsctl.errors import SourceUnavailable
from opsctl.prom.client import Series
from opsctl.slurm.accounting import FinishedJob
from opsctl.validate.sweep import choose
from opsctl.why import suspicion
from opsctl.why.evidence import Event, Found, Window, gather, window
from opsctl.why.verdict import judge, render, to_json
from tests.unit.fakes import FakeProm, node

START, END = 1_750_000_000.0, 1_750_000_600.0


def invoke(args, config, prom, accounting):
    return CliRunner().invoke(main, args, obj=Clients(config=config, prom=prom, accounting=accounting))


class RangeProm(FakeProm):
    """FakeProm with range queries: `event(rule, node, device, points)` makes a rule's unheld condition
    breach at those (time, value) points; `down(node, source, points)` makes that exporter's `up` 0."""

    def __init__(self, config, nodes):
        super().__init__(config, nodes)
        self.events: dict[str, list[tuple[str, str, list]]] = {}
        self.downs: list[tuple[str, str, list]] = []
        self.ranges: list[tuple[str, float, float, float]] = []
        self.silent: set[str] = set()

    def query(self, expr, at=None):
        if expr.startswith("count_over_time(up{"):  # every target was scraped in the window, but the silent
            return [s for s in super().query(expr.split("(", 1)[1].split("[")[0], at)
                    if s.labels["node"] not in self.silent]
        return super().query(expr, at)

    def event(self, rule_id, node, device, points):
        self.events.setdefault(rule_id, []).append((node, device, points))

    def query_range(self, expr, start, end, step):
        self.queries += 1
        self.ranges.append((expr, start, end, step))
        if expr.startswith("up{") and expr.endswith("== 0"):
            return [Series(self._labels(n, s), tuple(p)) for n, s, p in self.downs]
        rule = next(r for r in self.rules if r.unheld_expr() == expr)
        return [Series(self._series(rule, n, d, 0.0).labels, tuple(p)) for n, d, p in self.events.get(rule.id, [])]


def config(tmp_path, **why):
    return parse_config({"prometheus": {"scrape_interval": "5s"}, "why": why}, "t",
                        {"OPSCTL_STATE_DIR": str(tmp_path / "state")})


def job(nodes=("gpu001", "gpu002", "gpu003", "gpu004"), state="FAILED", job_id="17", start=START, end=END):
    return FinishedJob(job_id, "train", "alice", state, tuple(nodes), start, end, "exit 1")


def test_the_culprit_is_the_node_whose_gpu_failed_as_the_job_ended(tmp_path):
    cfg = config(tmp_path)
    prom = RangeProm(cfg, [f"gpu{i:03d}" for i in range(1, 9)])
    prom.event("xid-79", "gpu003", "3", [(END + 4, 1.0), (END + 9, 1.0)])  # the scrape after the job died
    prom.event("gpu-temp-high", "gpu002", "0", [(START, 91.0), (END, 91.0)])  # hot all along: a warning
    prom.event("xid-79", "gpu007", "1", [(END - 30, 1.0)])  # not the job's node
    answer = judge(job(), gather(prom, prom.rules, cfg, job(), []))
    assert answer.culprit == "gpu003"
    first = answer.events[0]
    assert (first.node, first.check, first.evidence, first.at_start) == ("gpu003", "xid-79", "gpu3 xid=79 count=1",
                                                                        False)
    assert {e.node for e in answer.events} == {"gpu003", "gpu002"}
    lines = render(answer)
    assert lines[1] == "likely culprit: gpu003"
    assert lines[2] == "  gpu003: xid-79 gpu3 xid=79 count=1, first seen 4 s after the job ended"
    assert "already there when the job started" in lines[3]
    doc = to_json(answer)
    assert (doc["verdict"], doc["culprit"], doc["evidence"][0]["seconds_before_end"]) == ("culprit", "gpu003", -4.0)


def test_each_rule_is_read_without_its_hold_over_the_job_window_whatever_the_node_count(tmp_path):
    cfg = config(tmp_path)
    counts = []
    for size in (4, 64):
        names = [f"gpu{i:03d}" for i in range(1, size + 1)]
        prom = RangeProm(cfg, names)
        gather(prom, prom.rules, cfg, job(names), [])
        counts.append(prom.queries)
        expr, start, end, step = prom.ranges[0]
        assert expr == prom.rules[0].unheld_expr() and "min_over_time" not in expr
        # From the start to two scrape intervals after the end, a second apart: the scrape that saw it.
        assert (start, end, step) == (START, END + 10, 1.0)
    # rules, `up` == 0, identities at the start and the end, and which targets were scraped at all
    assert counts[0] == counts[1] == len(prom.rules) + 1 + 4 + 1


def test_a_long_job_is_read_at_a_coarser_step_within_prometheus_points_limit(tmp_path):
    span = window(job(end=START + 7 * 86400), config(tmp_path))
    assert (span.until - span.start) / span.step <= 11_000 and span.step > 1


def test_no_event_is_no_evidence(tmp_path):
    cfg = config(tmp_path)
    prom = RangeProm(cfg, ["gpu001", "gpu002", "gpu003", "gpu004"])
    answer = judge(job(state="CANCELLED"), gather(prom, prom.rules, cfg, job(state="CANCELLED"), []))
    assert (answer.culprit, to_json(answer)["verdict"]) == ("", "no evidence")
    assert render(answer)[1].startswith("no evidence: no rule breached")


def test_a_node_without_any_scrape_in_the_window_is_no_data_not_no_evidence(tmp_path):
    cfg = config(tmp_path)
    prom = RangeProm(cfg, ["gpu001", "gpu002", "gpu003", "gpu004"])
    prom.silent = {"gpu002"}  # Prometheus was down, or the node's exporters never answered
    answer = judge(job(), gather(prom, prom.rules, cfg, job(), []))
    assert (answer.verdict, to_json(answer)["no_data"]) == ("no data", ["gpu002"])
    assert render(answer)[1].startswith("no data: Prometheus holds no scrape of gpu002")
    # Such a failed job counts against no node's suspicion.
    assert suspicion.score([job()], {}, frozenset({"17"}))["gpu001"].failed == 0


def test_an_exporter_that_went_down_and_an_opsctl_drain_are_evidence(tmp_path):
    cfg = config(tmp_path)
    prom = RangeProm(cfg, ["gpu001", "gpu002"])
    prom.downs.append(("gpu002", "node", [(END - 2, 0.0), (END + 5, 0.0)]))
    drained = {"event": "drain", "node": "gpu001", "checks": ["ib-down"], "time": "2025-06-15T15:08:40Z",
               "dry_run": False}  # 1_750_000_120, within the window
    planned = {**drained, "dry_run": True}
    found = gather(prom, prom.rules, cfg, job(("gpu001", "gpu002")), [drained, planned])
    events = {(e.node, e.check, e.evidence) for e in found.events}
    assert events == {("gpu002", "exporter-down", "node exporter down"),
                      ("gpu001", "opsctl-drain", "drained by opsctl (ib-down)")}
    # The drain (its rule drains) outranks the quiet exporter, though the exporter is nearer the end.
    assert judge(job(), found).culprit == "gpu001"


def test_slurms_own_node_fail_names_the_node(tmp_path):
    cfg = config(tmp_path)
    prom = RangeProm(cfg, ["gpu004", "gpu005"])
    prom.event("gpu-temp-high", "gpu004", "0", [(END - 20, 91.0)])
    failed = FinishedJob("5", "x", "u", "NODE_FAIL", ("gpu004", "gpu005"), START, END, "", failed_node="gpu005")
    answer = judge(failed, gather(prom, prom.rules, cfg, failed, []))
    assert (answer.culprit, answer.events[0].check) == ("gpu005", "slurm-node-fail")


def test_a_new_event_outranks_a_condition_the_job_started_with():
    span = Window(START, END, END + 10, 1.0)
    old = Event("gpu001", "xid-79", "fail", "drain", "gpu0 xid=79", START, END, at_start=True)
    new = Event("gpu002", "gpu-temp-high", "warn", "report", "gpu1 92 C", END - 5, END, at_start=False)
    assert judge(job(), Found([old, new], span, ())).culprit == "gpu002"


def test_suspicion_counts_failures_that_nothing_explains():
    jobs = [job(("gpu007",), "FAILED", str(i)) for i in range(6)] + \
        [job(("gpu007",), "COMPLETED", str(i)) for i in range(6, 10)] + \
        [job(("gpu007", "gpu008"), "FAILED", "20"), job(("gpu008",), "CANCELLED", "21")]
    # Job 20 failed with evidence on gpu008: it counts against gpu008 alone, not its job mate.
    scores = suspicion.score(jobs, {"20": {"gpu008"}})
    assert (scores["gpu007"].jobs, scores["gpu007"].failed, scores["gpu007"].explained) == (11, 6, 0)
    assert (scores["gpu008"].jobs, scores["gpu008"].failed, scores["gpu008"].explained) == (2, 0, 1)
    cfg = parse_config({}, "t", {})
    assert scores["gpu007"].suspect(cfg) and not scores["gpu008"].suspect(cfg)
    # Below the share or the count, no suspect: 6 failed of 20, or 4 of 5.
    many = suspicion.score(jobs + [job(("gpu007",), "COMPLETED", str(i)) for i in range(30, 39)], {})
    assert not many["gpu007"].suspect(cfg)
    few = suspicion.score([job(("gpu009",), "FAILED", str(i)) for i in range(4)] + [job(("gpu009",), "COMPLETED")], {})
    assert not few["gpu009"].suspect(cfg)


def test_a_queued_node_goes_first_however_recently_validated(tmp_path):
    cfg = parse_config({"validate": {"max_nodes_per_sweep": 1}}, "t", {})
    cluster = {n: node(n) for n in ("gpu001", "gpu002")}
    last = {"gpu002": 1_000.0 - 60}
    assert choose(cluster, last, None, 1_000.0, cfg).nodes["gpu002"].result == "skip:validated-recently"
    sweep = choose(cluster, last, None, 1_000.0, cfg, queued=frozenset({"gpu002"}))
    assert (sweep.nodes["gpu002"].result, sweep.nodes["gpu001"].result) == ("", "skip:sweep-full")


class Accounting:
    def __init__(self, jobs=(), fail=None):
        self.jobs = {j.id: j for j in jobs}
        self.fail = fail

    def finished_job(self, job_id):
        if self.fail:
            raise self.fail
        return self.jobs.get(job_id)

    def finished_jobs(self, since, until):
        return list(self.jobs.values())


def run(tmp_path, args, accounting, prom=None):
    cfg = config(tmp_path)
    prom = prom or RangeProm(cfg, ["gpu001", "gpu002", "gpu003", "gpu004"])
    return invoke(args, config=cfg, prom=prom, accounting=accounting)


def test_why_exit_codes(tmp_path):
    assert run(tmp_path, ["why", "17"], Accounting([job()])).exit_code == 0
    missing = run(tmp_path, ["why", "18"], Accounting([job()]))
    assert missing.exit_code == 2 and "has no such job" in missing.output
    # A running job is answered by job-health's verdict (tests/unit/test_job_health.py); --record refuses it.
    busy = run(tmp_path, ["why", "17", "--record"], Accounting([job(state="RUNNING", end=None)]))
    assert busy.exit_code == 2 and "has not ended (RUNNING)" in busy.output
    down = run(tmp_path, ["why", "17"], Accounting(fail=SourceUnavailable("Slurm: sacct --json failed: Connection "
                                                                          "refused")))
    assert down.exit_code == 3 and "sacct" in down.output
    assert run(tmp_path, ["why", "17x"], Accounting()).exit_code == 2


def test_record_writes_one_audit_record_per_node_and_only_for_a_failed_job(tmp_path):
    cfg = config(tmp_path)
    prom = RangeProm(cfg, ["gpu001", "gpu002", "gpu003", "gpu004"])
    prom.event("xid-79", "gpu003", "3", [(END + 4, 1.0)])
    result = invoke(["why", "17", "--record", "--json"], config=cfg, prom=prom, accounting=Accounting([job()]))
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["culprit"] == "gpu003"
    records, _ = AuditLog(cfg.audit_log).read()
    assert [(r["node"], r["checks"]) for r in records] == [
        ("gpu001", []), ("gpu002", []), ("gpu003", ["xid-79"]), ("gpu004", [])]
    assert all(r["event"] == "why" and r["reason"] == "job 17" and "likely culprit gpu003" in r["detail"]
               for r in records)
    done = invoke(["why", "18", "--record"], config=cfg, prom=prom,
                  accounting=Accounting([job(state="COMPLETED", job_id="18")]))
    assert done.exit_code == 0 and "nothing to explain" in done.output
    assert len(AuditLog(cfg.audit_log).read()[0]) == 4


def test_suspects_queue_uses_recorded_answers_and_never_drains(tmp_path):
    cfg = config(tmp_path)
    jobs = [job(("gpu007",), "FAILED", str(i)) for i in range(6)] + \
        [job(("gpu007",), "COMPLETED", str(i)) for i in range(6, 10)]
    prom = RangeProm(cfg, ["gpu007"])
    result = invoke(["suspects", "--queue", "--json"], config=cfg, prom=prom, accounting=Accounting(jobs))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert (doc["suspects"], doc["queued"]) == (["gpu007"], ["gpu007"])
    assert "6 of its 10 jobs failed" in State(cfg.state_dir).validate_queue.load()["gpu007"]["why"]
    asked = prom.queries
    # A failed job that `why --record` explained is read from the audit log, not queried again.
    audit = AuditLog(cfg.audit_log)
    for i in range(6):
        audit.write("why", node="gpu007", checks=["xid-79"], reason=f"job {i}")
    again = json.loads(invoke(["suspects", "--json"], config=cfg, prom=prom, accounting=Accounting(jobs)).output)
    assert again["suspects"] == [] and prom.queries == asked


@pytest.mark.parametrize("text,names", [
    ("gpu[001-003,010],head", ["gpu001", "gpu002", "gpu003", "gpu010", "head"]),
    ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
    ("r[1-2]-g[1-2]", ["r1-g1", "r1-g2", "r2-g1", "r2-g2"]),
])
def test_hostlists_expand_as_slurm_writes_them(text, names):
    from opsctl.slurm.hostlist import expand_hostlist, hostlist_expression

    assert expand_hostlist(text) == names
    assert sorted(expand_hostlist(",".join(hostlist_expression(names)))) == sorted(names)


class Gone:
    """slurmctld no longer holds any job (they ended more than MinJobAge ago)."""

    def queued_job(self, job_id):
        return None


def test_spool_records_each_job_the_epilog_left_and_empties_the_directory(tmp_path):
    cfg = config(tmp_path)
    prom = RangeProm(cfg, ["gpu001", "gpu002", "gpu003", "gpu004"])
    prom.event("xid-79", "gpu003", "3", [(END + 4, 1.0)])
    spool = tmp_path / "spool"
    spool.mkdir()
    for name in ("17", "18", "19", "junk"):
        (spool / name).touch()
    accounting = Accounting([job(), job(state="COMPLETED", job_id="18")])  # 19: accounting never heard of it
    # Job 17 left slurmctld's memory: nothing to requeue (tests/unit/test_recover.py requeues).
    result = CliRunner().invoke(main, ["why", "--spool", str(spool)], obj=Clients(
        config=cfg, prom=prom, accounting=accounting, requeues=Gone()))
    assert result.exit_code == 2, result.output  # job 19's usage error, once; the others were done
    assert list(spool.iterdir()) == []
    assert "job 19: job 19: Slurm's accounting (sacct) has no such job" in result.output
    assert "removed 'junk', not a job id" in result.output and "nothing to explain" not in result.output
    records, _ = AuditLog(cfg.audit_log).read()
    assert {r["reason"] for r in records} == {"job 17"} and len(records) == 4  # one per node of the failed job
    assert invoke(["why"], config=cfg, prom=prom, accounting=accounting).exit_code == 2  # JOB or --spool


def test_a_recorded_no_data_answer_counts_against_no_one(tmp_path):
    cfg = config(tmp_path)
    jobs = [job(("gpu007",), "FAILED", str(i)) for i in range(6)] + \
        [job(("gpu007",), "COMPLETED", str(i)) for i in range(6, 10)]
    audit = AuditLog(cfg.audit_log)
    for i in range(6):
        audit.write("why", node="gpu007", reason=f"job {i}", detail=f"job {i} FAILED: no data")
    prom = RangeProm(cfg, ["gpu007"])
    doc = json.loads(invoke(["suspects", "--json"], config=cfg, prom=prom, accounting=Accounting(jobs)).output)
    assert (doc["suspects"], doc["nodes"][0]["failed_unexplained"], prom.queries) == ([], 0, 0)
