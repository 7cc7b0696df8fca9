"""`opsctl validate --idle` and `--preflight` on the lab: real Slurm runs one exclusive job per idle node in
the `validate` partition, each runs `opsctl node validate` with the node's emulated dcgmi and all_reduce_perf,
a preflight's reservation and its multi-node srun steps are Slurm's own, the real node_exporter and
Prometheus carry the results, and `opsctl health --drain` drains the failure. Nodes gpu038..gpu058; each
test removes the validation results and the reservation it left."""

import json

import pytest
import yaml

from tests.integration.lab.health_support import HealthLab

pytestmark = pytest.mark.lab


@pytest.fixture
def h(lab, tmp_path):
    helper = HealthLab(lab, tmp_path)
    helper.wait_calm()  # a sweep's health run acts: an earlier module's fault on every node would stop it
    # The lab's own validation job: `opsctl node validate` with each node's config and textfile directory.
    lab_config = yaml.safe_load(open(lab.env["OPSCTL_CONFIG"]).read())
    raw = yaml.safe_load(helper.config.read_text())
    raw["validate"] = {**lab_config["validate"], "job_timeout": "2m"}
    helper.config.write_text(yaml.safe_dump(raw))
    yield helper
    for node in helper.touched:
        for name in ("opsctl-validate.prom", "opsctl-validate-pairs.prom"):
            (lab.lab_dir / "nodes" / node / "textfile" / name).unlink(missing_ok=True)
    helper.cleanup()


def sweep(h, scope: str) -> tuple[int, dict, dict]:
    proc = h.opsctl("validate", "--idle", "--nodes", scope, "--json", timeout=300)
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    health = {n["node"]: n for n in doc["health"]["nodes"]} if doc["health"] else {}
    return proc.returncode, {n["node"]: n for n in doc["nodes"]}, health


def test_nvlink_slow_is_drained_by_one_sweep_and_the_healthy_nodes_pass(h):
    nodes = ["gpu038", "gpu039", "gpu040", "gpu041"]
    h.touched.update(nodes)
    h.inject("gpu039", "nvlink-slow", gpu=4)
    code, validated, health = sweep(h, "gpu[038-041]")
    assert code == 1
    assert {n: v["result"] for n, v in validated.items()} == {
        "gpu038": "pass", "gpu039": "fail", "gpu040": "pass", "gpu041": "pass"}
    assert validated["gpu039"]["detail"] == "nccl node" and all(validated[n]["job"] for n in nodes)
    assert health["gpu039"]["action"] == "drain"
    slurm = h.slurm()
    assert slurm["gpu039"].drained and slurm["gpu039"].reason == "opsctl:validate nccl node failed"
    assert not any(slurm[n].drained for n in ("gpu038", "gpu040", "gpu041"))
    busbw = {s["metric"]["node"]: float(s["value"][1])
             for s in h.lab.query('opsctl_node_validate_nccl_busbw_gbps{node=~"gpu03[89]"}')}
    assert busbw["gpu039"] < 431 < busbw["gpu038"]  # halved, and a healthy H200 node above Azure's floor
    # The next sweep leaves them alone: validated within validate.interval, or drained.
    _, again, _ = sweep(h, "gpu[038-041]")
    assert {n: v["result"] for n, v in again.items()} == {
        "gpu038": "skip:validated-recently", "gpu039": "skip:not-idle", "gpu040": "skip:validated-recently",
        "gpu041": "skip:validated-recently"}


def test_a_busy_node_is_left_until_it_is_idle_then_validated(h):
    h.touched.add("gpu042")
    job = h.lab.run("sbatch", "--parsable", "-w", "gpu042", "--exclusive", "-o", "/dev/null", "-D", "/tmp",
                    "--wrap", "sleep 600").stdout.strip()
    try:
        h.lab.wait_until(lambda: h.slurm()["gpu042"].runs_jobs, 30, "the user's job running on gpu042")
        code, validated, health = sweep(h, "gpu042")
        assert (code, validated["gpu042"]["result"], validated["gpu042"]["job"], health) == (0, "skip:busy", "", {})
    finally:
        h.lab.run("scancel", job)
    # Idle with no flag: a cancelled job leaves the node COMPLETING for a moment, busy to a sweep too.
    h.lab.wait_until(lambda: (h.slurm()["gpu042"].state, h.slurm()["gpu042"].flags) == ("idle", ()), 60,
                     "gpu042 idle again")
    code, validated, health = sweep(h, "gpu042")
    assert (code, validated["gpu042"]["result"]) == (0, "pass"), validated
    assert health["gpu042"]["action"] == "none"


def test_a_preflight_hands_over_8_good_nodes_of_16_and_names_the_slow_node_and_rail(h):
    nodes = [f"gpu{i:03d}" for i in range(43, 59)]
    h.touched.update(nodes)
    h.inject("gpu047", "ib-slow", hca=3)
    name = "opsctl-test-preflight"
    try:
        proc = h.opsctl("validate", "--preflight", "8", "--nodes", "gpu[043-058]", "--spares", "8",
                        "--reservation", name, "--user", "nobody", "--json", timeout=400)
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        found = doc["preflight"]
        assert [(r["node"], r["hca"], r["verdict"]) for r in found["rails"]] == [("gpu047", "mlx5_3", "slow")]
        assert len({e["peer"] for e in found["rails"][0]["evidence"]}) >= 2
        results = {n["node"]: n["result"] for n in doc["nodes"]}
        assert results == {n: "fail" if n == "gpu047" else "pass" for n in nodes}
        assert len(found["handed_over"]) == 8 and "gpu047" not in found["handed_over"]
        # Slurm's reservation holds exactly those 8, for the caller, and no longer as maintenance
        shown = h.lab.run("scontrol", "-o", "show", "reservation", name).stdout
        fields = dict(f.split("=", 1) for f in shown.split() if "=" in f)
        assert h.lab.run("scontrol", "show", "hostnames", fields["Nodes"]).stdout.split() == found["handed_over"]
        assert fields["Users"] == "nobody" and "MAINT" not in fields["Flags"]
        # the rail's result went through the node's textfile and the catalog rule to its drain
        slurm = h.slurm()
        assert slurm["gpu047"].drained and slurm["gpu047"].reason == "opsctl:validate nccl-pair mlx5_3 failed"
        assert not any(slurm[n].drained for n in nodes if n != "gpu047")
    finally:
        h.lab.run("scontrol", "delete", f"ReservationName={name}", check=False)
