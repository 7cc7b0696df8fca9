"""Requeueing a failed job without its culprit (opsctl/recover/, opsctl/actor/requeue.py, opsctl/slurm/requeue.py):
who opts in, what blames a node enough, what Slurm must allow, the cap, the budget and the breaker, the order of
intent and scontrol, and `why --spool` calling it. Over fakes of opsctl's own Protocols; the lab tier
(tests/integration/lab/test_lab_recover.py) runs it on real slurmctld, from a real EpilogSlurmctld."""

import json
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from opsctl.actor.audit import AuditLog
from opsctl.actor.requeue import Requeue, Requeuer
from opsctl.actor.state import State
from opsctl.cli import main
from opsctl.clients import Clients
from opsctl.config import parse_config
from opsctl.errors import SourceUnavailable
from opsctl.recover.policy import decide
from opsctl.slurm.cli import SlurmCliImpl
from opsctl.slurm.requeue import QueuedJob, parse_queued_job
from opsctl.why.evidence import Event, Window
from opsctl.why.verdict import Answer
from tests.unit.fakes import FakeSlurm, gpu_nodes
from tests.unit.test_why import END, START, Accounting, RangeProm, job

NOW = 1_750_000_700.0
NODES = ("gpu001", "gpu002", "gpu003", "gpu004")


def config(tmp_path, **recover):
    return parse_config({"prometheus": {"scrape_interval": "5s"}, "recover": recover}, "t",
                        {"OPSCTL_STATE_DIR": str(tmp_path / "state")})


def queued(**over) -> QueuedJob:
    base = QueuedJob(id="17", state="FAILED", partition="gpu", qos="normal", excluded="", required="",
                     comment="opsctl:recover", requeue=True, restarts=0, batch=True)
    return replace(base, **over)


def event(node="gpu003", check="xid-79", severity="fail", action="drain") -> Event:
    return Event(node, check, severity, action, "gpu3 xid=79 count=1", END - 2, END + 4, at_start=False)


def answer(*events: Event, unseen=()) -> Answer:
    return Answer(job(), Window(START, END, END + 10, 1.0), tuple(events), 0, tuple(unseen))


def decided(tmp_path, the_answer=None, the_job=None, q="default", requeues=None, recent=(), nodes=64, **recover):
    return decide(the_job or job(), the_answer or answer(event()), queued() if q == "default" else q,
                  config(tmp_path, **recover), requeues or {}, list(recent), lambda: nodes)


# ---- the policy ------------------------------------------------------------------------------------
def test_an_opted_in_job_that_a_draining_fault_ended_is_requeued_without_the_culprit(tmp_path):
    plan = decided(tmp_path, q=queued(excluded="gpu[010-012]"))
    assert plan.requeue and plan.culprit == "gpu003" and plan.excluded == "gpu[003,010-012]"
    assert plan.opted_in_by == "--comment=opsctl:recover"


@pytest.mark.parametrize("state", ["CANCELLED", "COMPLETED", "TIMEOUT", "OUT_OF_MEMORY"])
def test_a_job_that_did_not_fail_is_never_requeued_nor_recorded(tmp_path, state):
    plan = decided(tmp_path, the_job=job(state=state))
    assert not plan.requeue and not plan.refused


@pytest.mark.parametrize(("comment", "recover", "how"), [
    ("opsctl:recover", {}, "--comment=opsctl:recover"),
    ("nightly, opsctl:recover", {}, "--comment=opsctl:recover"),
    ("", {"all_jobs": True}, "recover.all_jobs"),
    ("", {"partitions": ["gpu"]}, "partition gpu (recover.partitions)"),
    ("", {"qos": ["normal"]}, "QOS normal (recover.qos)"),
])
def test_a_job_opts_in_by_its_comment_or_the_sites_policy(tmp_path, comment, recover, how):
    plan = decided(tmp_path, q=queued(comment=comment), **recover)
    assert plan.requeue and plan.opted_in_by == how


@pytest.mark.parametrize("comment", ["", "opsctl:recovered", "not-opsctl:recover", "opsctl"])
def test_a_job_that_did_not_opt_in_is_none_of_opsctls_business(tmp_path, comment):
    plan = decided(tmp_path, q=queued(comment=comment), partitions=["other"], qos=["high"])
    assert (plan.requeue, plan.refused) == (False, "")


def test_recovery_turned_off_requeues_nothing(tmp_path):
    plan = decided(tmp_path, enabled=False)
    assert (plan.requeue, plan.refused) == (False, "")


@pytest.mark.parametrize(("the_answer", "said"), [
    (answer(), "no evidence"),
    (answer(unseen=("gpu002",)), "no data"),
    (answer(event(severity="warn", action="report", check="gpu-temp-high")), "gpu-temp-high on gpu003 is not a"),
    (answer(event(action="report", check="exporter-down")), "exporter-down on gpu003 is not a failure that drains"),
])
def test_no_node_to_blame_is_a_refusal_never_a_requeue(tmp_path, the_answer, said):
    plan = decided(tmp_path, the_answer=the_answer)
    assert not plan.requeue and plan.refused.startswith("not requeued: no node to blame") and said in plan.refused


def test_opsctls_own_drain_and_slurms_node_fail_blame_the_node(tmp_path):
    for blaming in (event(check="opsctl-drain"), event(check="slurm-node-fail")):
        assert decided(tmp_path, the_answer=answer(blaming)).requeue


@pytest.mark.parametrize(("q", "said"), [
    (queued(batch=False), "not a batch job"),
    (queued(requeue=False), "--no-requeue"),
    (queued(state="RUNNING"), "already RUNNING again"),
    (queued(required="gpu[001-004]"), "asks for gpu003 by name"),
])
def test_what_slurm_cannot_requeue_is_refused_with_its_reason(tmp_path, q, said):
    plan = decided(tmp_path, q=q)
    assert not plan.requeue and said in plan.refused


def test_a_job_gone_from_slurmctld_is_refused_only_where_every_job_opts_in(tmp_path):
    assert (decided(tmp_path, q=None).refused, decided(tmp_path, q=None).requeue) == ("", False)
    plan = decided(tmp_path, q=None, all_jobs=True)
    assert not plan.requeue and "slurmctld no longer holds the job" in plan.refused


def test_a_job_slurm_requeued_itself_after_node_fail_is_still_kept_off_the_culprit(tmp_path):
    plan = decided(tmp_path, the_job=job(state="NODE_FAIL"), q=queued(state="PENDING", restarts=1))
    assert plan.requeue and plan.excluded == "gpu003"


def test_the_cap_per_job_the_hourly_budget_and_the_breaker(tmp_path):
    twice = {"17": [{"at": NOW - 900, "culprit": "gpu007"}, {"at": NOW - 300, "culprit": "gpu003"}]}
    assert "requeued 2 times already" in decided(tmp_path, requeues=twice).refused
    assert decided(tmp_path, requeues=twice, max_requeues=3).requeue
    spent = [{"at": NOW - 60, "culprit": "gpu003"}] * 10
    assert "the budget is spent: 10 requeues" in decided(tmp_path, recent=spent).refused
    assert decided(tmp_path, recent=spent, max_requeues_per_hour=11).requeue
    # Seven other nodes blamed within the hour: the eighth is past 10 % of 64 nodes (6.4), a shared fault.
    many = [{"at": NOW - 60, "culprit": f"gpu{i:03d}"} for i in range(10, 17)]
    assert "circuit breaker: 8 different nodes" in decided(tmp_path, recent=many).refused
    assert decided(tmp_path, recent=many[:5]).requeue


def test_the_node_count_is_asked_only_when_the_breaker_could_trip(tmp_path):
    def never() -> int:
        raise AssertionError("Slurm's nodes were read")

    assert decide(job(), answer(event()), queued(), config(tmp_path), {}, [], never).requeue


# ---- slurmctld's job, as squeue prints it --------------------------------------------------------------
def test_squeue_answers_parse_with_a_comment_that_holds_the_delimiter_and_padded_flags():
    # Slurm 22.05 in the lab: `-o` as QUEUE_FORMAT, `-O` as FLAGS_FORMAT (each field padded to 20).
    queue = "1428|FAILED|gpu|normal|gpu[001-057,060-064]||opsctl:recover a|b QOS=evil\n"
    flags = "1428                |1                   |0                   |1                   |\n"
    job_ = parse_queued_job(queue, flags, "1428")
    assert job_ == QueuedJob(id="1428", state="FAILED", partition="gpu", qos="normal",
                             excluded="gpu[001-057,060-064]", required="", comment="opsctl:recover a|b QOS=evil",
                             requeue=True, restarts=0, batch=True)
    assert parse_queued_job("", "", "1428") is None
    with pytest.raises(SourceUnavailable, match="not 0 or 1"):
        parse_queued_job(queue, "1428|maybe|0|1|\n", "1428")


class Runner:
    """subprocess.run's shape: records each argv, answers from `answers` (first match on the argv's text)."""

    def __init__(self, answers=()):
        self.calls: list[list[str]] = []
        self.answers = list(answers)

    def __call__(self, argv, **kwargs):
        self.calls.append(argv)
        text = " ".join(argv)
        rc, out, err = next(((rc, out, err) for pattern, rc, out, err in self.answers if re.search(pattern, text)),
                            (0, "", ""))
        return subprocess.CompletedProcess(argv, rc, out, err)


def cli(runner) -> SlurmCliImpl:
    return SlurmCliImpl(run=runner, environ={})


def test_the_requeue_is_hold_exclude_release_and_releases_even_when_the_exclusion_fails():
    runner = Runner()
    cli(runner).requeue_excluding("17", "gpu003", pending=False)
    assert [c[1:] for c in runner.calls] == [["requeuehold", "17"], ["update", "JobId=17", "ExcNodeList=gpu003"],
                                             ["release", "17"]]
    runner = Runner([("update", 1, "", "Invalid node name specified")])
    with pytest.raises(SourceUnavailable, match="Invalid node name"):
        cli(runner).requeue_excluding("17", "gpu999", pending=True)
    assert [c[1] for c in runner.calls] == ["hold", "update", "release"]  # pending: Slurm requeued it already


def test_a_job_gone_from_slurmctld_is_none_and_squeue_down_is_an_error():
    assert cli(Runner([("squeue", 1, "", "slurm_load_jobs error: Invalid job id specified")])).queued_job("17") is None
    with pytest.raises(SourceUnavailable, match="Unable to contact"):
        cli(Runner([("squeue", 1, "", "slurm_load_jobs error: Unable to contact slurm controller")])).queued_job("17")


# ---- the gateway: compare and set, intent before scontrol, audit after -----------------------------------
class FakeQueue:
    def __init__(self, *jobs: QueuedJob, fail: Exception | None = None):
        self.jobs = {j.id: j for j in jobs}
        self.fail = fail
        self.requeued: list[tuple[str, str, bool]] = []

    def queued_job(self, job_id):
        return self.jobs.get(job_id)

    def requeue_excluding(self, job_id, excluded, pending):
        if self.fail:
            raise self.fail
        self.requeued.append((job_id, excluded, pending))
        self.jobs[job_id] = replace(self.jobs[job_id], state="PENDING", excluded=excluded,
                                    restarts=self.jobs[job_id].restarts + 1)


def plan(seen=None) -> Requeue:
    return Requeue(seen=seen or queued(), culprit="gpu003", excluded="gpu003", checks=("xid-79",), detail="d")


def test_a_job_changed_since_the_decision_is_left_alone_and_audited(tmp_path):
    cfg = config(tmp_path)
    slurm = FakeQueue(queued(restarts=1))  # someone requeued it meanwhile
    with Requeuer(cfg, slurm, NOW) as requeuer:
        why = requeuer.requeue(plan())
    assert why.startswith("changed:") and slurm.requeued == []
    records, _ = AuditLog(cfg.audit_log).read()
    assert [(r["event"], r["node"], r["reason"]) for r in records] == [("requeue-refused", "gpu003", "job 17")]
    assert State(cfg.state_dir).requeues.load() == {}


def test_the_intent_is_counted_before_scontrol_and_stays_when_scontrol_fails(tmp_path):
    cfg = config(tmp_path)
    slurm = FakeQueue(queued(), fail=SourceUnavailable("Slurm: scontrol requeuehold failed: Requested operation "
                                                       "is presently disabled"))
    with pytest.raises(SourceUnavailable), Requeuer(cfg, slurm, NOW) as requeuer:
        requeuer.requeue(plan())
    assert State(cfg.state_dir).requeues.load() == {"17": [{"at": NOW, "culprit": "gpu003"}]}
    records, _ = AuditLog(cfg.audit_log).read()
    assert [r["event"] for r in records] == ["requeue-failed"] and "presently disabled" in records[0]["detail"]


def test_only_the_requeuer_calls_slurms_requeue():
    root = Path(__file__).resolve().parents[2] / "opsctl"
    callers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                     if ".requeue_excluding(" in p.read_text())
    assert callers == ["actor/requeue.py"]


# ---- why --spool: explained, recorded, then requeued ----------------------------------------------------
def spool_run(tmp_path, jobs, queue, names, **recover):
    cfg = config(tmp_path, **recover)
    prom = RangeProm(cfg, list(NODES))
    prom.event("xid-79", "gpu003", "3", [(END + 4, 1.0)])
    spool = tmp_path / "spool"
    spool.mkdir(exist_ok=True)
    for name in names:
        (spool / name).touch()
    result = CliRunner().invoke(main, ["why", "--spool", str(spool)], obj=Clients(
        config=cfg, prom=prom, accounting=Accounting(jobs), slurm=FakeSlurm(gpu_nodes(8)), requeues=queue))
    return cfg, result


def test_spool_requeues_the_opted_in_job_after_recording_why_and_leaves_the_others(tmp_path):
    mine = queued()
    theirs = queued(id="18", comment="")
    cancelled = queued(id="19", state="CANCELLED")
    slurm = FakeQueue(mine, theirs, cancelled)
    jobs = [job(), job(job_id="18"), job(job_id="19", state="CANCELLED")]
    cfg, result = spool_run(tmp_path, jobs, slurm, ["17", "18", "19"])
    assert result.exit_code == 0, result.output
    assert slurm.requeued == [("17", "gpu003", False)]
    assert "job 17: job 17 FAILED (exit 1): likely culprit gpu003 (xid-79); requeued without it" in result.output
    records, _ = AuditLog(cfg.audit_log).read()
    requeues = [r for r in records if r["event"].startswith("requeue")]
    assert [(r["event"], r["node"], r["reason"], r["checks"]) for r in requeues] == [
        ("requeue", "gpu003", "job 17", ["xid-79"])]
    # The why records came first: the answer is on record whatever the requeue does.
    assert [r["event"] for r in records if r["reason"] == "job 17"] == ["why"] * 4 + ["requeue"]
    history = CliRunner().invoke(main, ["history", "--job", "17", "--json"], obj=Clients(config=cfg))
    assert [json.loads(line)["event"] for line in history.output.splitlines()] == ["why"] * 4 + ["requeue"]
    # Its cap: the job fails again on the culprit-free nodes and is refused the third time.
    for _ in range(2):
        slurm.jobs["17"] = replace(slurm.jobs["17"], state="FAILED")
        spool_run(tmp_path, jobs, slurm, ["17"])
    assert len(slurm.requeued) == 2
    assert "requeued 2 times already" in AuditLog(cfg.audit_log).read()[0][-1]["detail"]


def test_a_requeue_that_slurm_refuses_is_one_line_and_exit_3_after_the_answer_is_recorded(tmp_path):
    slurm = FakeQueue(queued(), fail=SourceUnavailable("Slurm: scontrol requeuehold failed: Unable to contact "
                                                       "slurm controller"))
    cfg, result = spool_run(tmp_path, [job()], slurm, ["17"])
    assert result.exit_code == 3
    assert "opsctl: job 17: not requeued: Slurm: scontrol requeuehold failed" in result.output
    assert [r["event"] for r in AuditLog(cfg.audit_log).read()[0]] == ["why"] * 4 + ["requeue-failed"]


def test_history_job_must_be_a_job_id(tmp_path):
    result = CliRunner().invoke(main, ["history", "--job", "17x"], obj=Clients(config=config(tmp_path)))
    assert result.exit_code == 2 and "--job must be a Slurm job id" in result.output
