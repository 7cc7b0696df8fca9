"""`opsctl why JOB` and `opsctl suspects` on the lab: real Slurm runs the jobs, the lab's real slurmdbd
and MariaDB keep their accounting (sacct --json), the lab's emulated training ranks
(opsctl_lab.hwtools.train) die when their node's GPU fails, and the real Prometheus holds what happened.
Nodes gpu033..gpu037 and gpu059..gpu062; every test clears and resumes the nodes it touched."""

import json
import time

import pytest
import yaml

from tests.integration.lab.health_support import HealthLab

pytestmark = pytest.mark.lab


@pytest.fixture
def h(lab, tmp_path):
    helper = HealthLab(lab, tmp_path)
    yield helper
    helper.cleanup()


def submit(h, nodes: str, count: int, command: str) -> str:
    return h.lab.run("sbatch", "--parsable", "-N", str(count), "-w", nodes, "--exclusive", "-o", "/dev/null",
                     "-D", "/tmp", "--wrap", command).stdout.strip()


def sacct_state(h, job: str) -> str:
    out = h.lab.run("sacct", "-n", "-X", "-P", "-j", job, "-o", "state").stdout.split()
    return out[0] if out else ""


def ended(h, job: str, timeout: float = 60) -> str:
    return h.lab.wait_until(lambda: (s := sacct_state(h, job)) not in ("", "PENDING", "RUNNING") and s, timeout,
                            f"job {job} ended in accounting")


def running(h, job: str) -> None:
    h.lab.wait_until(lambda: sacct_state(h, job) == "RUNNING", 60, f"job {job} running")


def why(h, job: str, *args) -> dict:
    proc = h.opsctl("why", job, "--json", "--wait", "60", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_node_whose_gpu_fell_off_the_bus_is_named_and_a_cancelled_job_has_no_evidence(h):
    train = h.lab.lab_dir / "bin" / "train"
    job = submit(h, "gpu[059-062]", 4, f"srun --kill-on-bad-exit=1 {train}")
    cancelled = submit(h, "gpu[033-036]", 4, f"srun {train}")
    running(h, job)
    running(h, cancelled)
    time.sleep(2 * h.lab.scrape_interval)  # some healthy scrapes of both jobs' nodes
    h.inject("gpu061", "xid:79", gpu=3)
    assert ended(h, job) == "FAILED"  # the rank on gpu061 died, and Slurm ended the others
    h.lab.run("scancel", cancelled)
    assert ended(h, cancelled) == "CANCELLED"

    answer = why(h, job, "--record")
    assert answer["job"]["state"] == "FAILED" and answer["job"]["nodes"] == ["gpu059", "gpu060", "gpu061", "gpu062"]
    assert (answer["verdict"], answer["culprit"]) == ("culprit", "gpu061")
    first = answer["evidence"][0]
    assert (first["node"], first["check"], first["evidence"].split()[0]) == ("gpu061", "xid-79", "gpu3")
    assert {e["node"] for e in answer["evidence"]} == {"gpu061"}  # nothing against its job mates
    assert not first["already_at_start"] and abs(first["seconds_before_end"]) <= 3 * h.lab.scrape_interval
    # Rule by rule over the window, plus the identities and `up`: as many queries for 4 nodes as for 64.
    assert answer["queries"] < 100
    text = h.opsctl("why", job).stdout
    assert "likely culprit: gpu061" in text and "gpu061: xid-79 gpu3" in text

    # --record: one audit record per node of the job, each in that node's history.
    history = h.opsctl("history", "gpu061", "--json").stdout.splitlines()
    mine = [json.loads(line) for line in history if json.loads(line)["event"] == "why"]
    assert len(mine) == 1 and mine[0]["checks"] == ["xid-79"] and mine[0]["reason"] == f"job {job}"
    assert "likely culprit gpu061" in mine[0]["detail"]
    mates = [r for r in h.audit() if r["event"] == "why" and r["node"] == "gpu060"]
    assert len(mates) == 1 and mates[0]["checks"] == [] and "likely culprit gpu061" in mates[0]["detail"]

    quiet = why(h, cancelled)
    assert (quiet["job"]["state"], quiet["verdict"], quiet["culprit"], quiet["evidence"]) == (
        "CANCELLED", "no evidence", None, [])
    assert "no evidence" in h.opsctl("why", cancelled).stdout


def test_a_node_in_many_failed_jobs_without_evidence_is_queued_for_validation_not_drained(h):
    started = time.time()
    # 10 jobs on gpu037, 6 of them failed with no fault anywhere; gpu033 ran 4 good jobs beside them.
    jobs = [submit(h, "gpu037", 1, "exit 1" if i < 6 else "true") for i in range(10)]
    jobs += [submit(h, "gpu033", 1, "true") for _ in range(4)]
    for job in jobs:
        ended(h, job)
    # slurmdbd learns a job's eligible time a moment after its end, and sacct's time window needs it.
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started - 5))
    h.lab.wait_until(lambda: set(jobs) <= set(h.lab.run("sacct", "-n", "-X", "-a", "-S", since, "-o", "jobid")
                                               .stdout.split()), 60, "the jobs in sacct's time window")
    # gpu037 was validated a minute ago: without the queue, a sweep skips it.
    h.state.mkdir(parents=True, exist_ok=True)
    (h.state / "validated.json").write_text(json.dumps({"gpu037": time.time() - 60}))
    assert plan(h)["gpu037"] == "skip:validated-recently"
    # Only this test's jobs count (a lab that ran before keeps its accounting): the lookback reaches back
    # to a few seconds before they started.
    raw = yaml.safe_load(h.config.read_text())
    raw["why"] = {"suspect_lookback": f"{int(time.time() - started) + 5}s"}  # read again just below
    h.config.write_text(yaml.safe_dump(raw))

    proc = h.opsctl("suspects", "--queue", "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    scores = {n["node"]: n for n in found["nodes"]}
    assert (found["suspects"], found["queued"]) == (["gpu037"], ["gpu037"]), found
    assert (scores["gpu037"]["jobs"], scores["gpu037"]["failed_unexplained"]) == (10, 6)
    assert scores["gpu033"]["suspect"] is False
    assert not h.slurm()["gpu037"].drained  # the score alone never drains
    assert "gpu037" in json.loads((h.state / "validate-queue.json").read_text())
    assert plan(h)["gpu037"] == "would-validate"  # queued: first in the next sweep, however recent


def plan(h) -> dict:
    # gpu037 idle again: a job that just ended leaves its node COMPLETING for a moment.
    h.lab.wait_until(lambda: (h.slurm()["gpu037"].state, h.slurm()["gpu037"].flags) == ("idle", ()), 60,
                     "gpu037 idle")
    proc = h.opsctl("validate", "--idle", "--dry-run", "--nodes", "gpu037", "--json")
    assert proc.returncode == 0, proc.stderr
    return {n["node"]: n["result"] for n in json.loads(proc.stdout)["nodes"]}
