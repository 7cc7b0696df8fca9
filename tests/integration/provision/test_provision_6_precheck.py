"""The InfiniBand precheck (roles/ib_precheck) in tagged runs, about 35 s each: it quarantines exactly the
failing node and a clear returns it; with every port INIT it quarantines no one and says why. And
`opsctl ib fabric-test --drain` from the control host drains the node of a slow HCA.
"""

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.integration.provision.support import (
    BIN,
    INVENTORY,
    NEEDS_MACHINES,
    NEEDS_ROOT,
    REPO,
    changed_tasks,
    clear_faults_and_resume,
    lab_cli,
    make_provision,
    wait_until,
)

pytestmark = [NEEDS_ROOT]


IB_PRECHECK_NODE = "gpu1"  # gpu2 is the other tests' node
IB_PRECHECK_TASK = "ib_precheck : Quarantine the failing nodes and resume the ones that pass again"


@pytest.fixture
def precheck_alone(machines):
    """Every GPU node in service, and the head's health timer stopped while the test runs: its ib-down rule
    drains a node after a 1 m hold, and the drains seen here must be the precheck's own. Earlier modules
    may leave a fault or a drain of opsctl's own (test_provision_5_observability.py's gpu2 is cleared and
    resumed at its end): every fault is cleared and opsctl's own drains resumed first."""
    machines.on_head("systemctl stop opsctl-health.timer")
    try:
        clear_faults_and_resume(machines, "opsctl:")
        for name in machines.gpu_nodes:
            wait_until(lambda name=name: machines.node_state(name)[0] in ("idle", "mixed"), 120, f"{name} in service")
        assert {n: machines.drained(n) for n in machines.gpu_nodes} == dict.fromkeys(machines.gpu_nodes)
        yield machines
    finally:
        clear_faults_and_resume(machines, "opsctl:ib-precheck")
        machines.on_head("systemctl start opsctl-health.timer")


def precheck_run() -> subprocess.CompletedProcess:
    """`make provision --tags ib_precheck`, with the opsctl that the full runs installed (and proved):
    its installation is a third of a tagged run."""
    start = time.monotonic()
    proc = make_provision("--tags", "ib_precheck", "-e", "ib_precheck_install=false")
    sys.stderr.write(f"ib_precheck tagged run: {time.monotonic() - start:.0f} s\n")
    return proc


@pytest.mark.provision
@NEEDS_MACHINES
def test_ib_precheck_quarantines_exactly_the_failing_node_and_a_clear_returns_it(precheck_alone):
    machines = precheck_alone
    node = IB_PRECHECK_NODE
    others = [n for n in machines.gpu_nodes if n != node]
    lab_cli("inject", node, "ib-down", "--hca", "2")
    down = precheck_run()
    assert down.returncode == 0, down.stdout[-6000:] + down.stderr[-3000:]
    state, reason = machines.drained(node) or ("", "")
    assert "drain" in state and reason.startswith("opsctl:ib-precheck port-state mlx5_2 state DOWN"), (state, reason)
    assert {n: machines.drained(n) for n in others} == dict.fromkeys(others)
    assert f"drained {node}: opsctl:ib-precheck" in down.stdout
    assert {title for title, _ in changed_tasks(down.stdout)} == {IB_PRECHECK_TASK}

    lab_cli("clear", node)
    back = precheck_run()
    assert back.returncode == 0, back.stdout[-6000:] + back.stderr[-3000:]
    assert f"resumed {node}: the InfiniBand precheck passes" in back.stdout
    assert {n: machines.drained(n) for n in machines.gpu_nodes} == dict.fromkeys(machines.gpu_nodes)
    assert {title for title, _ in changed_tasks(back.stdout)} == {IB_PRECHECK_TASK}


@pytest.mark.provision
@NEEDS_MACHINES
def test_ib_precheck_with_every_port_init_quarantines_no_one_and_says_why(precheck_alone):
    machines = precheck_alone
    for name in machines.gpu_nodes:
        lab_cli("inject", name, "sm-down")
    run = precheck_run()
    assert run.returncode != 0, run.stdout[-6000:]
    assert (f"InfiniBand precheck: circuit breaker: every InfiniBand port of the {len(machines.gpu_nodes)} tested "
            "node(s) is in INIT: the subnet manager is down or unreachable, not the nodes; draining none"
            in run.stdout), run.stdout[-6000:]
    assert {n: machines.drained(n) for n in machines.gpu_nodes} == dict.fromkeys(machines.gpu_nodes)
    assert not changed_tasks(run.stdout)


def slurm_over_ssh(machines, directory: Path) -> dict:
    """sinfo and scontrol of the head, as commands on this host: scripts that run them there over SSH
    (root, the lab key, strict host-key checking), so that opsctl here drains in the lab's Slurm."""
    hv = machines.hosts[machines.head]
    ssh = shlex.join(["ssh", "-i", hv["ansible_ssh_private_key_file"],
                      *shlex.split(hv.get("ansible_ssh_common_args", "")), "-o", "BatchMode=yes",
                      f"root@{hv['ansible_host']}"])
    paths = {}
    for tool in ("sinfo", "scontrol"):
        path = directory / tool
        path.write_text(f"#!/bin/bash\nexec {ssh} \"$(printf '%q ' {tool} \"$@\")\"\n")
        path.chmod(0o755)
        paths[tool] = str(path)
    return paths


@pytest.mark.provision
@NEEDS_MACHINES
def test_fabric_test_drains_the_node_of_the_slow_hca(precheck_alone, tmp_path):
    """`opsctl ib fabric-test --drain` from the control host against the provisioned machines: ib-slow on
    one HCA of gpu2 drains gpu2, and only gpu2, with the reason `opsctl:ib-fabric mlx5_4 slow ...`, under
    the site's opsctl config (its drain limits) as the head has it."""
    machines = precheck_alone
    node = "gpu2"
    config = yaml.safe_load(machines.on_head("cat /etc/opsctl/config.yaml"))
    config.update(state_dir=str(tmp_path / "state"), audit_log=str(tmp_path / "audit.jsonl"))
    config["slurm"] = {**config.get("slurm", {}), **slurm_over_ssh(machines, tmp_path)}
    (tmp_path / "config.yml").write_text(yaml.safe_dump(config))
    lab_cli("inject", node, "ib-slow", "--hca", "4")
    try:
        run = subprocess.run([str(BIN / "opsctl"), "ib", "fabric-test", "--inventory", str(INVENTORY), "--drain",
                              "--config", str(tmp_path / "config.yml")],
                             capture_output=True, text=True, timeout=600, cwd=REPO)
        state, reason = machines.drained(node) or ("", "")
        others = {n: machines.drained(n) for n in machines.gpu_nodes if n != node}
    finally:
        lab_cli("clear", node)
        if (machines.drained(node) or ("", ""))[1].startswith("opsctl:ib-fabric"):
            machines.resume(node)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    assert "drain" in state and reason.startswith("opsctl:ib-fabric mlx5_4 slow"), (state, reason, run.stdout)
    assert others == dict.fromkeys(others)
    assert f"drained {node}: opsctl:ib-fabric" in run.stdout
    audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [r["node"] for r in audit if r["event"] == "drain"] == [node]
