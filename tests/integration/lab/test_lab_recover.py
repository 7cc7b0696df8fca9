"""A job that a node's fault ended, requeued without that node (docs/recover.md), on the lab's real Slurm: the
real slurmctld runs the slurm_controller role's own EpilogSlurmctld, the lab's stand-in for the head's path
unit (opsctl_lab.why_spool) runs `opsctl why --spool` as opsctl-why.service does, with the lab's config
(`recover.max_requeues: 1`) and state, and the emulated training ranks (opsctl_lab.hwtools.train) die when
their GPU falls off the bus. Nodes gpu052..gpu063 and gpu033..gpu035; the test resumes what it drained and
clears its faults."""

import json
import sys
import time

import pytest

from opsctl.slurm.hostlist import expand_hostlist, hostlist_expression
from tests.integration.lab.health_support import HealthLab

pytestmark = pytest.mark.lab

POOL = [f"gpu{i:03d}" for i in range(52, 64)]  # the two recovered jobs, and their second runs
LONE = ["gpu033", "gpu034", "gpu035"]  # the jobs that must never be requeued


@pytest.fixture
def h(lab, tmp_path):
    helper = HealthLab(lab, tmp_path)
    helper.jobs = []
    yield helper
    for job in helper.jobs:
        helper.lab.run("scancel", job, check=False)
    helper.cleanup()


def submit(h, nodes: list[str], count: int, command: str, *options: str) -> str:
    outside = [f"gpu{i:03d}" for i in range(1, 65) if f"gpu{i:03d}" not in nodes]
    job = h.lab.run("sbatch", "--parsable", "-N", str(count), "-x", ",".join(hostlist_expression(outside)),
                    "--exclusive", "-o", "/dev/null", "-D", "/tmp", *options, "--wrap", command).stdout.strip()
    h.jobs.append(job)
    return job


def queue(h, job: str) -> dict:
    """slurmctld's view: state, reason, nodes, excluded nodes."""
    line = h.lab.run("squeue", "-h", "--states=all", "-j", job, "-o", "%T|%r|%N|%x").stdout.strip()
    state, reason, nodes, excluded = (line.split("|") + ["", "", "", ""])[:4]
    return {"state": state, "reason": reason, "nodes": expand_hostlist(nodes) if nodes else [],
            "excluded": expand_hostlist(excluded) if excluded else []}


def wait_state(h, job: str, states: tuple[str, ...], timeout: float) -> dict:
    return h.lab.wait_until(lambda: (q := queue(h, job))["state"] in states and q, timeout,
                            f"job {job} {'/'.join(states)}")


def lab_history(h, *args: str) -> list[dict]:
    """The lab's own audit log: where the path unit's stand-in records and requeues."""
    out = h.lab.run(sys.executable, "-m", "opsctl", "history", *args, "--json", "--limit", "500").stdout
    return [json.loads(line) for line in out.splitlines()]


def test_a_job_a_gpu_killed_is_requeued_without_that_node_once_and_no_other_job_is(h):
    train = h.lab.lab_dir / "bin" / "train"
    recover = ("--requeue", "--comment=opsctl:recover")
    done = submit(h, POOL, 4, f"srun --kill-on-bad-exit=1 {train} --seconds 20", *recover)
    capped = submit(h, POOL, 4, f"srun --kill-on-bad-exit=1 {train} --seconds 600", *recover)
    # Beside them, the jobs that must never be requeued: one that did not opt in, killed by the same fault;
    # one a person cancels; one that fails on its own, with no node evidence.
    theirs = submit(h, [LONE[0]], 1, f"srun --kill-on-bad-exit=1 {train} --seconds 600", "--requeue")
    cancelled = submit(h, [LONE[1]], 1, f"srun {train} --seconds 600", *recover)
    own_bug = submit(h, [LONE[2]], 1, "sleep 5; exit 3", *recover)
    first = {job: wait_state(h, job, ("RUNNING",), 60)["nodes"] for job in (done, capped, theirs, cancelled)}
    time.sleep(2 * h.lab.scrape_interval)  # healthy scrapes of their nodes first
    culprits = {job: first[job][1] for job in (done, capped)}
    for node in [*culprits.values(), LONE[0]]:
        h.inject(node, "xid:79", gpu=1)

    # Pending again within 30 s of its end (as squeue first shows it ended), held off the node that ended it.
    # The requeue is hold, exclude, release: squeue may show it PENDING and held before the exclusion is set;
    # what counts is pending again, released, with the exclusion.
    ended: dict[str, float] = {}
    pending: dict[str, dict] = {}
    deadline = time.monotonic() + 90
    while len(pending) < 2 and time.monotonic() < deadline:
        for job, node in culprits.items():
            seen = queue(h, job)
            if seen["state"] == "FAILED":
                ended.setdefault(job, time.monotonic())
            elif seen["state"] == "PENDING" and node in seen["excluded"] and "held" not in seen["reason"] \
                    and job not in pending:
                pending[job] = {**seen, "after": time.monotonic() - ended.get(job, time.monotonic())}
        time.sleep(0.5)
    assert set(pending) == set(culprits), (ended, pending, {job: queue(h, job) for job in culprits})
    for job in culprits:
        assert pending[job]["after"] <= 30, pending[job]
    # And the culprits drained, as the health timer would once their rule's failure is no longer pending.
    h.lab.wait_until(lambda: h.opsctl("health", "--drain").returncode in (0, 1) and all(
        h.slurm()[node].drained for node in culprits.values()), 90, "the culprits drained")

    # Eligible again cred_expire + 1 s after the requeue (61 s in the lab), on 4 nodes none of them a culprit.
    second = {job: wait_state(h, job, ("RUNNING", "COMPLETED"), 150)["nodes"] for job in (done, capped)}
    for job in (done, capped):
        assert culprits[job] not in second[job] and len(second[job]) == 4
    assert wait_state(h, done, ("COMPLETED",), 90)

    # The capped job fails again, on a node of its second run: requeued once already (the lab's
    # recover.max_requeues: 1), it stays ended and the refusal says why.
    h.inject(second[capped][2], "xid:79", gpu=1)
    assert wait_state(h, capped, ("FAILED",), 60)
    h.lab.wait_until(lambda: any(r["event"] == "requeue-refused" for r in lab_history(h, "--job", capped)), 60,
                     f"the refusal of job {capped}'s second requeue")
    time.sleep(5)
    assert queue(h, capped)["state"] == "FAILED"

    for job, node in culprits.items():
        events = [(r["event"], r["node"]) for r in lab_history(h, "--job", job)]
        assert ("why", node) in events and ("requeue", node) in events, events
        on_node = [r for r in lab_history(h, node) if r["event"] == "requeue"]
        assert [r["reason"] for r in on_node] == [f"job {job}"] and on_node[0]["checks"] == ["xid-79"]
    refused = [r for r in lab_history(h, "--job", capped) if r["event"] == "requeue-refused"]
    assert len(refused) == 1 and "requeued once already" in refused[0]["detail"]

    # The others: each failed one has its `why` record, none a requeue; the one with no node evidence that
    # opted in says why not, the one that did not opt in has no requeue record at all.
    h.lab.run("scancel", cancelled)
    for job, state in ((theirs, "FAILED"), (cancelled, "CANCELLED"), (own_bug, "FAILED")):
        assert wait_state(h, job, (state,), 60)
    h.lab.wait_until(lambda: all(any(r["event"] == "why" for r in lab_history(h, "--job", job))
                                 for job in (theirs, own_bug)), 90, "the why records of both failed jobs")
    time.sleep(5)
    for job in (theirs, cancelled, own_bug):
        assert queue(h, job)["state"] in ("FAILED", "CANCELLED")
        assert not [r for r in lab_history(h, "--job", job) if r["event"] == "requeue"]
    refused = [r for r in lab_history(h, "--job", own_bug) if r["event"] == "requeue-refused"]
    assert len(refused) == 1 and "no node to blame (no evidence)" in refused[0]["detail"]
    assert not [r for r in lab_history(h, "--job", theirs) if r["event"].startswith("requeue")]
