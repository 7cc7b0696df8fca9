"""`opsctl job-health` and `opsctl why` of a running job on the lab: real Slurm runs an 8-node synchronous job
of the lab's emulated ranks (`<lab>/bin/train`, opsctl_lab.sync_job: they step in lock-step), the emulated
dcgm-exporter and node_exporter show what their GPUs and HCAs do, and the real Prometheus holds it. A
`slow-gpu` makes one rank compute slower (its peers wait for it at low power), a `hang` stops one rank (its
peers wait for ever, nothing moves). Nodes gpu033..gpu056; the test cancels its jobs and clears its faults."""

import json
import time

import pytest
import yaml

from opsctl.actor.state import State
from tests.integration.lab.health_support import HealthLab

pytestmark = pytest.mark.lab

VERDICT_WITHIN_S = 120


@pytest.fixture
def h(lab, tmp_path):
    helper = HealthLab(lab, tmp_path)
    jobs: list[str] = []
    helper.jobs = jobs
    yield helper
    if jobs:
        lab.run("scancel", *jobs, check=False)
        lab.wait_until(lambda: not lab.run("squeue", "--noheader", "--jobs", ",".join(jobs), check=False)
                       .stdout.strip(), 60, "the test's jobs gone")
    helper.cleanup()


def train(h, nodes: str, count: int) -> str:
    """An 8-node synchronous job of the lab's emulated ranks, running (for longer than any test waits)."""
    rank = h.lab.lab_dir / "bin" / "train"
    job = h.lab.run("sbatch", "--parsable", "-N", str(count), "-w", nodes, "--exclusive", "-o", "/dev/null",
                    "-D", "/tmp", "--wrap", f"srun {rank} --seconds 900").stdout.strip()
    h.jobs.append(job)
    h.lab.wait_until(lambda: h.lab.run("squeue", "--noheader", "--jobs", job, "--format=%T").stdout.strip()
                     == "RUNNING", 60, f"job {job} running")
    return job


def why(h, job: str) -> dict:
    proc = h.opsctl("why", job, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def verdict_within(h, job: str, verdict: str, timeout: float = VERDICT_WITHIN_S) -> dict:
    """`opsctl why JOB --json` of the running job, asked again until it says `verdict` (or the time is up)."""
    deadline = time.monotonic() + timeout
    while True:
        answer = why(h, job)
        if answer["verdict"] == verdict or time.monotonic() > deadline:
            return answer
        time.sleep(h.lab.scrape_interval)


def window_s(h) -> float:
    """job_health.window as the test's config has it (the default: opsctl's, one minute)."""
    return float(yaml.safe_load(h.config.read_text()).get("job_health", {}).get("window", 60))


def test_a_slow_gpu_and_a_hung_rank_are_named_a_healthy_job_is_not_and_nothing_is_drained(h):
    # Three 8-node jobs at once, so that the three answers share one window of waiting.
    slow = train(h, "gpu[033-040]", 8)
    hung = train(h, "gpu[041-048]", 8)
    healthy = train(h, "gpu[049-056]", 8)
    h.inject("gpu036", "slow-gpu", gpu=3)
    h.inject("gpu045", "hang")
    injected = time.monotonic()
    wanted = {slow: "slow", hung: "hung"}
    answers: dict[str, dict] = {}
    deadline = injected + max(VERDICT_WITHIN_S, window_s(h) + 60)
    while len(answers) < len(wanted) and time.monotonic() < deadline:
        for job, verdict in wanted.items():
            if job not in answers and (answer := why(h, job))["verdict"] == verdict:
                answers[job] = {**answer, "after": time.monotonic() - injected}
        time.sleep(h.lab.scrape_interval)
    assert set(answers) == set(wanted), answers

    answer = answers[slow]
    assert answer["after"] <= VERDICT_WITHIN_S + 30  # the last ask may take a while
    assert (answer["running"], answer["verdict"], answer["culprit"]) == (True, "slow", "gpu036"), answer
    signals = {v["signal"] for v in answer["verdicts"] if v["node"] == "gpu036"}
    assert signals & {"sm-clock", "power", "clock-events"}, answer["verdicts"]
    assert {v["node"] for v in answer["verdicts"]} == {"gpu036"}  # nothing against its peers
    clock = next((v for v in answer["verdicts"] if v["signal"] == "sm-clock"), None)
    if clock is not None:
        assert clock["value"] < 0.9 * clock["job_median"] and "gpu036: sm clock" in clock["words"]

    answer = answers[hung]
    assert (answer["verdict"], answer["nodes_named"]) == ("hung", ["gpu045"]), answer
    assert answer["verdicts"][0]["signal"] == "gpu-util-min"

    # The healthy job has run a whole window of its own scrapes by now: no verdict.
    time.sleep(max(0.0, window_s(h) + 3 * h.lab.scrape_interval - (time.monotonic() - injected)))
    answer = why(h, healthy)
    assert (answer["verdict"], answer["verdicts"], answer["no_data"]) == ("ok", [], []), answer
    assert set(answer["values"]) == {f"gpu{i:03d}" for i in range(49, 57)}

    proc = h.opsctl("job-health", "--queue", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    named = {j["job"]["id"]: j["nodes_named"] for j in doc["jobs"]}
    assert (named[slow], named[hung], named[healthy]) == (["gpu036"], ["gpu045"], [])
    assert doc["queries"] < 20  # one per signal, whatever the number of jobs
    queue = State(h.state).validate_queue.load()
    assert "gpu036" in queue and "gpu045" in queue
    assert any(r["event"] == "job-health" and r["node"] == "gpu036" and r["reason"] == f"job {slow}"
               for r in h.audit())
    nodes = h.slurm()
    assert not any(nodes[f"gpu{i:03d}"].drained for i in range(33, 57))  # a verdict is never a drain
