"""Whose reason is it, on Slurm 24.11 for real (Debian 13's, from the lab's debootstrap chroot): opsctl drains
and resumes nodes that run jobs; each job's epilog fails and Slurm drains the node itself ("Epilog error"),
keeping the reason the node had (`_drain_node()` keeps any existing reason, src/slurmctld/node_mgr.c; 24.11
without accounting storage keeps the last reason through a resume, `clusteracct_storage_g_node_up()`).
`opsctl remediate` and `opsctl node check --drain-self`, run as the lab runs them, leave every such node alone.

- gpu1: the head's actor drained it for a pending row remap (a fault the ladder resets) and resumed it: the
  words Slurm kept are replaced with `opsctl:resumed`, which Slurm's drain then keeps;
- gpu2: the node drained itself for a port down (`--drain-self`) and resumed itself when it passed;
- gpu3: as gpu1, but the replacement is refused (a client that only lifts the drain): Slurm's drain keeps the
  row remap's words themselves, and only the head's custody record tells that they are no longer opsctl's.
"""

import json
import os
import shutil
import subprocess
import time

import pytest
import yaml

from opsctl.actor.act import DRAIN, RESUME, Actor, Change
from opsctl.config import parse_config
from opsctl.errors import SourceUnavailable
from opsctl.slurm import SlurmCliImpl
from opsctl.slurm.base import RESUMED_REASON
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.ib_sysfs import write_tree
from opsctl_lab.slurm_chroot import ChrootCluster, SlurmChroot
from tests.conftest import OPSCTL, REPO

pytestmark = [pytest.mark.lab, pytest.mark.skipif(os.geteuid() != 0 or shutil.which("debootstrap") is None,
                                                  reason="needs root and debootstrap (make deps-machines)")]
NODES = ["gpu1", "gpu2", "gpu3"]
REMAP = "opsctl:row-remap-pending gpu3 remapped_rows_pending=1"
JOB_SECONDS = 30


class NoReplacement(SlurmCliImpl):
    """scontrol refuses the words that replace a kept reason (the resume itself goes through)."""

    def set_reason(self, names, reason):
        if reason == RESUMED_REASON:
            raise SourceUnavailable("Slurm: scontrol update failed: refused for this test")
        super().set_reason(names, reason)


@pytest.fixture
def cluster(tmp_path):
    """Three nodes of 24.11 whose every job's epilog fails."""
    slot = int(os.environ.get("OPSCTL_LAB_SLOT") or 0)
    chroot = SlurmChroot.ensure("trixie")
    assert chroot.version.startswith("24.11.")
    name = f"ownership-{slot}"  # its state dir is /var/lib/opsctl-<name> inside the chroot (ChrootCluster.inside)
    made = ChrootCluster(chroot, name, NODES, index=10 * slot + 2, gres="gpu:h200:8",
                         extra_conf=f"Epilog=/var/lib/opsctl-{name}/epilog-fails\n")
    made.state.mkdir(parents=True, exist_ok=True)
    epilog = made.state / "epilog-fails"
    epilog.write_text("#!/bin/sh\n# A job's epilog that fails: slurmctld drains the node (Epilog error).\nexit 1\n")
    epilog.chmod(0o755)
    made.up(fresh=True)
    try:
        yield made
    finally:
        made.down()


def configs(cluster, tmp_path):
    """(the head's config file, a node's) as the lab writes them: the chroot's Slurm, a state dir each."""
    slurm = {"sinfo": cluster.sinfo, "scontrol": cluster.scontrol}
    head = tmp_path / "head.yaml"
    head.write_text(yaml.safe_dump({"slurm": slurm, "state_dir": str(tmp_path / "head"),
                                    "audit_log": str(tmp_path / "head" / "audit.jsonl")}))
    node = tmp_path / "node.yaml"
    # Three nodes: one drained is a third of the cluster, which the default out-of-service limit refuses.
    node.write_text(yaml.safe_dump({"slurm": slurm, "state_dir": str(tmp_path / "node"),
                                    "audit_log": str(tmp_path / "node" / "audit.jsonl"),
                                    "safety": {"max_out_of_service_fraction": 1.0}}))
    return head, node


def run_opsctl(config, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("OPSCTL_STATE_DIR", "SLURM_CONF")}
    proc = subprocess.run([*OPSCTL, *args], capture_output=True, text=True, timeout=180, cwd=REPO,
                          env={**env, "OPSCTL_CONFIG": str(config)})
    assert proc.returncode in (0, 1, 4), f"opsctl {' '.join(args)}: exit {proc.returncode}: {proc.stderr}"
    return proc


def drain_self(config, node, sysfs):
    return run_opsctl(config, "node", "check", "--drain-self", "--node", node, "--window", "0",
                      "--sysfs-root", str(sysfs))


def wait(check, what, timeout=90):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)
    return found


def test_defect_4_slurms_own_drain_that_keeps_opsctls_reason_is_left_alone(cluster, tmp_path):
    slurm = SlurmCliImpl(cluster.sinfo, cluster.scontrol)
    head, node_conf = configs(cluster, tmp_path)
    healthy, port_down = tmp_path / "sys-ok", tmp_path / "sys-down"
    write_tree(healthy, NodeHardware(node="gpu2"))
    faulty = NodeHardware(node="gpu2")
    faulty.inject("ib-down", hca="mlx5_2", now=time.time())
    write_tree(port_down, faulty)
    sbatch = cluster.chroot.command(["env", f"SLURM_CONF={cluster.inside}/slurm.conf", "sbatch"])
    for name in NODES:  # a job on each, whose epilog will fail once it ends
        subprocess.run([*sbatch, "-w", name, "-N1", "--chdir=/", "--output=/dev/null", f"--wrap=sleep {JOB_SECONDS}"],
                       check=True, capture_output=True, text=True)
    wait(lambda: all(n.runs_jobs for n in (slurm.nodes()[m] for m in NODES)), "the jobs to run")

    config = parse_config(yaml.safe_load(head.read_text()), str(head), {})
    for name, client in (("gpu1", slurm), ("gpu3", NoReplacement(cluster.sinfo, cluster.scontrol))):
        for event, reason in ((DRAIN, REMAP), (RESUME, "")):
            with Actor(config, client, time.time()) as actor:
                seen = actor.nodes()[name]
                assert actor.apply([Change(node=name, event=event, seen=seen, reason=reason,
                                           checks=("row-remap-pending",))]).made, (name, event, seen)
    assert "drained gpu2" in drain_self(node_conf, "gpu2", port_down).stdout
    assert "resumed gpu2" in drain_self(node_conf, "gpu2", healthy).stdout
    resumed = slurm.nodes()
    assert [resumed[n].reason for n in NODES] == [RESUMED_REASON, RESUMED_REASON, REMAP]
    assert not any(resumed[n].drained for n in NODES)

    # The jobs end, their epilogs fail: Slurm drains each node and keeps the reason it had, who set it and when.
    drained = wait(lambda: all((nodes := slurm.nodes())[n].drained for n in NODES) and nodes, "Slurm's drains",
                   timeout=JOB_SECONDS + 60)
    for name in NODES:
        assert (drained[name].reason, drained[name].reason_time) == (resumed[name].reason, resumed[name].reason_time)

    ladder = json.loads(run_opsctl(head, "remediate", "--json").stdout)
    assert not [n for n in ladder["nodes"] if n["action"] in ("reset", "reboot", "resume", "rma", "unvalidated")]
    for name in NODES:
        assert "resumed" not in drain_self(node_conf, name, healthy).stdout
    after = slurm.nodes()
    assert [(after[n].state_text, after[n].reason, after[n].reason_time) for n in NODES] == \
        [(drained[n].state_text, drained[n].reason, drained[n].reason_time) for n in NODES]
