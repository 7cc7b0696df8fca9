"""The topology.conf that `opsctl ib topology --output` writes, loaded by this host's real slurmctld (Debian 12's
Slurm 22.05, TopologyPlugin=topology/tree): `scontrol show topology` lists the leaf groups with their nodes and
the spines above them, and slurmctld logs no "Multiple leaf switches contain nodes" for the rail-optimised
fabric. The fabric is the lab contract's (tests/unit/test_topology_fabric.py, ibnetdiscover's exact format).
Seconds: munged and slurmctld only, no slurmd."""

import os
import shutil
import subprocess
import time

import pytest
from click.testing import CliRunner

from opsctl.cli import main
from opsctl.clients import Clients
from opsctl.config import parse_config
from tests.component.promlab import free_port
from tests.unit.fakes import FakeSlurm, gpu_nodes
from tests.unit.test_topology_fabric import RailFabric

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not (shutil.which("slurmctld") and shutil.which("munged")),
                                reason="needs root, slurmctld and munged (Debian 12's slurmctld, munge)")

SLURM_CONF = """ClusterName=topology-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={port}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={munge}/munge.socket
CredType=cred/munge
StateSaveLocation={dir}/state
SlurmctldPidFile={dir}/slurmctld.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdSpoolDir={dir}/spool/%n
SelectType=select/cons_tres
TopologyPlugin=topology/tree
NodeName=gpu[001-064] NodeAddr=127.0.0.1 NodeHostname=localhost Port=[{node_port}-{last_port}] CPUs=1 State=UNKNOWN
PartitionName=gpu Nodes=ALL Default=YES State=UP
"""


def wait_for(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = check()
        if answer:
            return answer
        time.sleep(0.1)
    raise AssertionError(what)


@pytest.fixture
def slurm_dir(tmp_path):
    (tmp_path / "state").mkdir()
    os.chmod(tmp_path, 0o755)
    key = tmp_path / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    munged = subprocess.Popen(["munged", "--foreground", "--force", f"--socket={tmp_path}/munge.socket",
                               f"--key-file={key}", f"--pid-file={tmp_path}/munged.pid",
                               f"--log-file={tmp_path}/munged.log", f"--seed-file={tmp_path}/munged.seed"])
    try:
        wait_for(lambda: (tmp_path / "munge.socket").exists(), 10, "munged made no socket")
        yield tmp_path
    finally:
        munged.terminate()
        munged.wait(10)


def write_topology(directory) -> str:
    fabric = directory / "ibnetdiscover"
    fabric.mkdir()
    for hca, text in RailFabric().outputs().items():
        (fabric / f"{hca}.txt").write_text(text)
    config = parse_config({}, "t", env={"OPSCTL_STATE_DIR": str(directory / "opsctl"),
                                        "OPSCTL_AUDIT_LOG": str(directory / "audit.jsonl")})
    out = directory / "written.conf"
    result = CliRunner().invoke(main, ["ib", "topology", "--input", str(fabric), "--output", str(out)],
                                obj=Clients(config=config, slurm=FakeSlurm(gpu_nodes(64))))
    assert result.exit_code == 0, result.output
    return out.read_text()


def show_topology(munge_dir, name: str, topology_conf: str) -> tuple[str, str]:
    """slurmctld started on `topology_conf`: (`scontrol show topology`, slurmctld's log)."""
    directory = munge_dir / name
    (directory / "state").mkdir(parents=True)
    (directory / "topology.conf").write_text(topology_conf)
    node_port = free_port()
    conf = directory / "slurm.conf"
    conf.write_text(SLURM_CONF.format(port=free_port(), dir=directory, munge=munge_dir, node_port=node_port,
                                      last_port=node_port + 63))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    ctld = subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(conf)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    try:
        def topology():
            out = subprocess.run(["scontrol", "show", "topology"], env=env, capture_output=True, text=True,
                                 timeout=10)
            return out.stdout if out.returncode == 0 else ""

        shown = wait_for(topology, 20, "slurmctld did not answer `scontrol show topology`")
    finally:
        ctld.terminate()
        ctld.wait(20)
    return shown, (directory / "slurmctld.log").read_text()


def test_slurmctld_loads_the_tree_and_shows_every_switch(slurm_dir):
    shown, log = show_topology(slurm_dir, "written", write_topology(slurm_dir))
    assert shown.splitlines() == [
        "SwitchName=su1-leaf Level=0 LinkSpeed=1 Nodes=gpu[001-032]",
        "SwitchName=su2-leaf Level=0 LinkSpeed=1 Nodes=gpu[033-064]",
        "SwitchName=spine1 Level=1 LinkSpeed=1 Nodes=gpu[001-064] Switches=su1-leaf,su2-leaf"]
    assert "Multiple leaf switches" not in log


def test_slurmctld_warns_of_a_node_under_two_leaves(slurm_dir):
    """What the tree avoids by listing a node once: slurmctld's warning for a node under two leaf switches (a
    leaf per rail written as it is cabled), so that the check above can fail."""
    per_rail = ("SwitchName=rail0-su1-leaf Nodes=gpu[001-032]\nSwitchName=rail1-su1-leaf Nodes=gpu[001-032]\n"
                "SwitchName=su2-leaf Nodes=gpu[033-064]\n"
                "SwitchName=spine Switches=rail0-su1-leaf,rail1-su1-leaf,su2-leaf\n")
    _, log = show_topology(slurm_dir, "per-rail", per_rail)
    assert "Multiple leaf switches contain nodes: gpu[001-032]" in log
