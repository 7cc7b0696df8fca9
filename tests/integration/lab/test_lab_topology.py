"""`opsctl ib topology` on the simulated lab's fabric (64 nodes, 8 rails, 2 scalable units; the lab's emulated
ibnetdiscover, its config's ib.ibnetdiscover), and what Slurm makes of the files it writes:

- `--output` lists every one of the 64 nodes under a leaf switch (tree) and in a block (`--format block`);
- slurmctld loads the tree on 22.05 (this host's, a scratch one as tests/component/test_topology_slurmctld.py
  starts), 24.11 and 26.05 (the lab's debootstrap chroots, slurmctld alone), and the block file on 24.11 and
  26.05; `scontrol show topology` lists what was written;
- on 24.11, with all 64 nodes up (64 slurmd) and the block topology, a 32-node job lands inside one block:
  gpu[001-004] are busy first, so that the lowest-numbered free nodes (what select/cons_tres takes without a
  topology: gpu[005-036]) straddle the two blocks, and the job must take the second block whole;
- `recable-rail:3` on gpu010: `--check` exits 1 naming gpu010, mlx5_3 and rail 3, and the lab's slurmctld has
  the node drained `opsctl:ib-cabling`; `uplink-down` on a leaf is a warning and drains nothing. Every fault
  and drain is cleared at the end.
"""

import os
import shutil
import subprocess
import time

import pytest

from opsctl.slurm.hostlist import expand_hostlist
from opsctl_lab.slurm_chroot import ChrootCluster, SlurmChroot
from tests.component.test_topology_slurmctld import show_topology, slurm_dir  # noqa: F401 (a fixture)
from tests.conftest import opsctl

pytestmark = [pytest.mark.lab, pytest.mark.skipif(os.geteuid() != 0 or shutil.which("debootstrap") is None,
                                                  reason="needs root and debootstrap (make deps-machines)")]
NODE, HCA, RAIL = "gpu010", "mlx5_3", 3
LEAF = "rail2-su1-leaf"
SUITES = {"trixie": "24.11", "sid": "26.05"}


def settings(text: str, key: str) -> dict[str, list[str]]:
    """name -> its nodes, for each `<key>=name Nodes=...` line of a topology.conf (or `scontrol show topology`)."""
    found = {}
    for line in text.splitlines():
        words = dict(word.partition("=")[::2] for word in line.split("#", 1)[0].split())
        if key in words and "Nodes" in words:
            found[words[key]] = expand_hostlist(words["Nodes"])
    return found


@pytest.fixture(scope="module")
def written(lab, tmp_path_factory) -> dict[str, str]:
    """topology.conf of each plugin as `opsctl ib topology --output` writes it from the lab's fabric, which it
    also accepts as the fabric `--check` compares with."""
    files = {}
    for plugin in ("tree", "block"):
        path = tmp_path_factory.mktemp("topology") / f"{plugin}.conf"
        proc = opsctl("ib", "topology", "--format", plugin, "--output", str(path), env=lab.env, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"wrote {path} and accepted this fabric" in proc.stdout
        files[plugin] = path.read_text()
    return files


def test_every_lab_node_is_under_a_leaf_switch_and_in_a_block(lab, written):
    names = [f"gpu{i:03d}" for i in range(1, lab.nodes + 1)]
    # The lines with Nodes= are the leaf switches' (the spine names switches only).
    assert settings(written["tree"], "SwitchName") == {"su1-leaf": names[:32], "su2-leaf": names[32:]}
    assert "SwitchName=spine1 Switches=su1-leaf,su2-leaf" in written["tree"].splitlines()
    assert settings(written["block"], "BlockName") == {"su1-leaf": names[:32], "su2-leaf": names[32:]}
    assert "BlockSizes=32,64" in written["block"].splitlines()


def test_slurmctld_2205_loads_the_tree(slurm_dir, written):  # noqa: F811 (the fixture imported above)
    shown, log = show_topology(slurm_dir, "lab", written["tree"])
    assert settings(shown, "SwitchName") == {**settings(written["tree"], "SwitchName"),
                                             "spine1": [f"gpu{i:03d}" for i in range(1, 65)]}
    assert "Multiple leaf switches" not in log


def chroot_cluster(suite: str, plugin: str, topology: str, name: str = "topology") -> ChrootCluster:
    """A 64-node cluster of the suite's Slurm whose slurm.conf names the plugin and whose topology.conf (beside
    slurm.conf, in its state directory) is `topology`; not started."""
    slot = int(os.environ.get("OPSCTL_LAB_SLOT") or 0)
    cluster = ChrootCluster(SlurmChroot.ensure(suite), f"{name}-{suite}-{slot}",
                            [f"gpu{i:03d}" for i in range(1, 65)], index=10 * slot + 9,
                            extra_conf=f"TopologyPlugin=topology/{plugin}\n")
    cluster.state.mkdir(parents=True, exist_ok=True)
    (cluster.state / "topology.conf").write_text(topology)
    return cluster


def show(cluster: ChrootCluster) -> str:
    return subprocess.run([cluster.scontrol, "show", "topology"], capture_output=True, text=True, check=True,
                          timeout=30).stdout


@pytest.mark.parametrize("suite", list(SUITES))
@pytest.mark.parametrize("plugin", ["tree", "block"])
def test_slurmctld_of_the_newer_releases_loads_each_file(written, suite, plugin):
    cluster = chroot_cluster(suite, plugin, written[plugin])
    assert cluster.chroot.version.startswith(SUITES[suite] + ".")
    try:
        cluster.up(fresh=True, slurmd=False)
        shown = show(cluster)
    finally:
        cluster.down()
    key = "SwitchName" if plugin == "tree" else "BlockName"
    listed = settings(shown, key)
    for name, nodes in settings(written[plugin], key).items():
        assert listed[name] == nodes, shown
    assert set(listed) - set(settings(written[plugin], key)) <= {"spine1"}, shown


def squeue_nodes(cluster: ChrootCluster, job: str) -> list[str]:
    out = subprocess.run([str(cluster.bin / "squeue"), "-h", "-j", job, "-t", "RUNNING", "-o", "%N"],
                         capture_output=True, text=True, timeout=30).stdout.strip()
    return expand_hostlist(out) if out else []


def test_a_32_node_job_lands_inside_one_block_on_2411(written):
    cluster = chroot_cluster("trixie", "block", written["block"], name="topology-jobs")
    sbatch = cluster.chroot.command(["env", f"SLURM_CONF={cluster.inside}/slurm.conf", "sbatch", "--parsable",
                                     "--exclusive", "--chdir=/", "--output=/dev/null", "--wrap=sleep 60"])
    try:
        cluster.up(fresh=True, timeout=120)
        busy = submitted(sbatch, "-N4", "-w", "gpu[001-004]")
        wait(lambda: running_or_released(cluster, busy), "the first job to run", cluster, timeout=120)
        job = submitted(sbatch, "-N32")
        placed = wait(lambda: running_or_released(cluster, job), "the 32-node job to run", cluster, timeout=120)
    finally:
        cluster.down()
    blocks = settings(written["block"], "BlockName")
    assert len(placed) == 32 and any(set(placed) <= set(nodes) for nodes in blocks.values()), (placed, blocks)
    assert placed == blocks["su2-leaf"]


def submitted(sbatch: list[str], *args: str, tries: int = 3) -> str:
    """The job id of `sbatch ARGS`. A slurmctld just started on a machine busy with other streams can refuse a
    submission for a moment (its RPC queue full, a registration under way): asked again, with what it said."""
    for _ in range(tries):
        out = subprocess.run([*sbatch, *args], capture_output=True, text=True, timeout=60)
        if out.returncode == 0:
            return out.stdout.strip()
        time.sleep(5)
    raise AssertionError(f"sbatch {' '.join(args)} failed {tries} times: {out.stderr.strip()}")


def running_or_released(cluster: ChrootCluster, job: str) -> list[str]:
    """The job's nodes once it runs. On a machine busy with other streams, launching a job's steps (32
    nodes' or even 4) can outlast slurmd's message timeout: slurmctld then requeues the job held ("launch
    failed requeued held"). Where a job lands is what is tested, so such a job is released to be placed
    again (the same free block), and, as a requeued job becomes eligible only a while after its requeue
    (pending "BeginTime"), made eligible at once."""
    placed = squeue_nodes(cluster, job)
    if placed:
        return placed
    reason = subprocess.run([str(cluster.bin / "squeue"), "-h", "-j", job, "-o", "%r"], capture_output=True,
                            text=True, timeout=30).stdout.strip()
    scontrol = str(cluster.bin / "scontrol")
    if reason == "launch failed requeued held":
        subprocess.run([scontrol, "release", job], capture_output=True, text=True, timeout=30)
    elif reason == "BeginTime":
        subprocess.run([scontrol, "update", f"JobId={job}", "StartTime=now"], capture_output=True, text=True,
                       timeout=30)
    return []


def wait(check, what: str, cluster: ChrootCluster, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            queue = subprocess.run([str(cluster.bin / "squeue"), "-h", "-o", "%i %T %N %r"], capture_output=True,
                                   text=True, timeout=30)
            raise AssertionError(f"timed out waiting for {what}: squeue says {queue.stdout}{queue.stderr}")
        time.sleep(0.5)
    return found


def reasons(lab) -> dict[str, str]:
    out = lab.run("sinfo", "-h", "-N", "-o", "%N|%E").stdout
    return {node: reason for node, _, reason in (line.partition("|") for line in out.splitlines())}


def test_a_rail_cabled_to_another_rails_leaf_drains_the_node_and_a_lost_uplink_warns(lab, written):
    opsctl("lab", "inject", NODE, f"recable-rail:{RAIL}", env=lab.env)
    try:
        proc = opsctl("ib", "topology", "--check", env=lab.env, check=False)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        cross = [line for line in proc.stdout.splitlines() if line.startswith("drain cross-rail:")]
        assert len(cross) == 1 and f"{NODE} {HCA} (rail {RAIL})" in cross[0], proc.stdout
        assert reasons(lab)[NODE].startswith(f"opsctl:ib-cabling {HCA} cross-rail"), reasons(lab)[NODE]
        assert lab.sinfo_states()[NODE].startswith("drain")
    finally:
        opsctl("lab", "clear", NODE, env=lab.env)
        lab.run("scontrol", "update", f"nodename={NODE}", "state=resume", check=False)
    assert not reasons(lab)[NODE].startswith("opsctl:ib-cabling")

    opsctl("lab", "inject", "fabric", f"uplink-down:{LEAF}", env=lab.env)
    try:
        proc = opsctl("ib", "topology", "--check", env=lab.env, check=False)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        changes = [line for line in proc.stdout.splitlines() if line.startswith(("warn ", "drain "))]
        assert changes and all(line.startswith(f"warn fewer-uplinks: leaf {LEAF}") for line in changes), proc.stdout
        assert not [node for node, reason in reasons(lab).items() if reason.startswith("opsctl:ib-cabling")]
    finally:
        opsctl("lab", "clear", "fabric", env=lab.env)
    assert opsctl("ib", "topology", "--check", env=lab.env, check=False).returncode == 0
