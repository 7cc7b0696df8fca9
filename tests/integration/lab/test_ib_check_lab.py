"""`opsctl ib check` on a running lab node's emulated sysfs tree (kept current by the lab's emulator,
the same tree the real node_exporter reads): it passes when healthy, and fails naming the HCA after
each fault is injected with `opsctl lab inject`."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml

from tests.conftest import opsctl

pytestmark = pytest.mark.lab
NODE = "gpu031"  # no other lab test touches it


def check(lab, *args) -> tuple[int, dict]:
    proc = opsctl("ib", "check", "--json", "--sysfs-root", str(lab.lab_dir / "nodes" / NODE / "sys"), *args,
                  env=lab.env, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_a_healthy_lab_node_passes_with_its_counters_watched(lab):
    code, report = check(lab, "--window", "2")
    assert (code, report["verdict"], report["skipped"]) == (0, "pass", [])
    assert [h["device"] for h in report["hcas"]] == [f"mlx5_{i}" for i in range(8)]
    assert {(h["rate"], h["pcie"]["width"]) for h in report["hcas"]} == {("400 Gb/sec (4X NDR)", 16)}


@pytest.mark.parametrize("fault,failed,window", [
    ("ib-down", "port-state", "0"),
    ("ib-degraded", "link-rate", "0"),
    ("ib-fw-mismatch", "firmware", "0"),
    ("ib-counters", "error-counters", "3"),
    ("pcie-x8", "pcie-link", "0"),
])
def test_an_injected_fault_fails_the_check_naming_the_hca(lab, fault, failed, window):
    opsctl("lab", "inject", NODE, fault, "--hca", "2", env=lab.env)
    try:
        # The emulator rewrites the tree within a tick of the injection.
        # The last test's fault may still be in the tree for a tick after its clear: wait for this one's.
        code, report = lab.wait_until(lambda: (r := check(lab, "--window", window))[0] == 1
                                      and any(h["device"] == "mlx5_2" and failed in h["failed"] for h in r[1]["hcas"])
                                      and r, 30, f"{fault} in the sysfs tree")
        by_device = {h["device"]: h["failed"] for h in report["hcas"]}
        assert by_device.pop("mlx5_2") == [failed]
        assert set(map(tuple, by_device.values())) == {()}
        assert {f["device"] for f in report["findings"]} == {"mlx5_2"}
    finally:
        opsctl("lab", "clear", NODE, env=lab.env)


def test_node_check_drains_the_node_itself_and_resumes_it_once_the_fault_clears(lab, tmp_path):
    textfile = tmp_path / "opsctl_node_check.prom"
    argv = ["node", "check", "--drain-self", "--node", NODE, "--window", "0", "--textfile", str(textfile),
            "--sysfs-root", str(lab.lab_dir / "nodes" / NODE / "sys")]
    opsctl("lab", "inject", NODE, "ib-down", "--hca", "5", env=lab.env)
    try:
        failed = lab.wait_until(lambda: (p := opsctl(*argv, env=lab.env, check=False)).returncode == 1 and p, 30,
                                "the node check to fail")
        assert f"drained {NODE}: opsctl:node-check ib-port-state mlx5_5" in failed.stdout
        assert 'opsctl_node_check{check="ib-port-state",device="mlx5_5"} 1' in textfile.read_text()
        reason = lab.run("sinfo", "-h", "-n", NODE, "-o", "%E").stdout.strip()
        assert reason == "opsctl:node-check ib-port-state mlx5_5"
    finally:
        opsctl("lab", "clear", NODE, env=lab.env)
    passed = lab.wait_until(lambda: (p := opsctl(*argv, env=lab.env, check=False)).returncode == 0 and p, 30,
                            "the node check to pass")
    assert f"resumed {NODE}: every node check passes" in passed.stdout
    # A resumed node reads idle* until slurmctld's next ping reaches its slurmd.
    lab.wait_until(lambda: lab.sinfo_states()[NODE] == "idle", 120, f"{NODE} idle", interval=2)
    assert 'device="mlx5_5"' not in textfile.read_text()


def drain_self(lab, node: str):
    return opsctl("node", "check", "--drain-self", "--node", node, "--window", "0", "--sysfs-root",
                  str(lab.lab_dir / "nodes" / node / "sys"), env=lab.env, check=False)


def test_a_drain_that_names_another_rule_too_stays_after_a_passing_self_check(lab):
    """`opsctl health` joins rule ids: a node-check drain that an XID 79 joined needs a person."""
    reason = "opsctl:node-check,xid-79 ib-port-state mlx5_5; gpu3 xid 79"
    lab.run("scontrol", "update", f"nodename={NODE}", "state=drain", f"reason={reason}")
    try:
        proc = drain_self(lab, NODE)
        assert (proc.returncode, "resumed" in proc.stdout) == (0, False), proc.stdout + proc.stderr
        assert lab.run("sinfo", "-h", "-n", NODE, "-o", "%E").stdout.strip() == reason
    finally:
        lab.run("scontrol", "update", f"nodename={NODE}", "state=resume")


def node_own_drain_self(lab, tmp_path, node: str):
    """`opsctl node check --drain-self` as the node's timer runs it: with the node's own config and state
    directory (a real node keeps its lock and audit log on its own disk)."""
    config = tmp_path / f"{node}.yaml"
    config.write_text(yaml.safe_dump({"ib": {"sysfs_root": str(lab.lab_dir / "nodes" / node / "sys")},
                                      "state_dir": str(tmp_path / node), "audit_log": str(tmp_path / node / "audit")}))
    env = {k: v for k, v in lab.env.items() if k not in ("OPSCTL_STATE_DIR", "OPSCTL_CONFIG")}
    return opsctl("node", "check", "--drain-self", "--node", node, "--window", "0", "--config", str(config),
                  env=env, check=False)


def test_sm_down_on_every_node_drains_no_node_itself_and_each_says_why(lab, tmp_path):
    """The subnet manager down puts every port of every node in INIT: each node's own check fails, and none
    may drain itself for it (only `opsctl health`, which sees them all, decides)."""
    names = [f"gpu{i:03d}" for i in range(1, lab.nodes + 1)]
    opsctl("lab", "inject", "all", "sm-down", env=lab.env)
    try:
        lab.wait_until(lambda: all(h["state"] == "INIT" for h in check(lab, "--window", "0")[1]["hcas"]), 30,
                       "every port in INIT")
        with ThreadPoolExecutor(max_workers=4) as pool:
            procs = dict(zip(names, pool.map(lambda n: node_own_drain_self(lab, tmp_path, n), names), strict=True))
        wrong = {n: (p.returncode, p.stdout[-200:], p.stderr[-200:]) for n, p in procs.items()
                 if p.returncode != 1 or f"{n} not drained: ib-port-state" not in p.stdout
                 or "every rail is INIT" not in p.stdout}
        assert not wrong, wrong
        reasons = lab.run("sinfo", "-h", "-N", "-o", "%N %E").stdout
        assert "opsctl:node-check" not in reasons
    finally:
        opsctl("lab", "clear", "all", env=lab.env)
        # Later tests judge these nodes through Prometheus: every port must read ACTIVE there again first.
        lab.wait_until(lambda: not lab.query("node_infiniband_state_id < 4"), 60, "every port ACTIVE in Prometheus",
                       interval=2)
