"""The newer Slurm releases, real, from their debootstrap chroots: each runs a cluster of its own
(munged, slurmctld, slurmd per node) that takes a drain and a resume through the host-side wrappers, and
reboots a node as the lab does (opsctl_lab.slurm_reboot); opsctl's actor refuses the reboot at their
ReturnToService=2."""

import os
import shutil
import subprocess

import pytest

from opsctl_lab.slurm_chroot import SUITES, ChrootCluster, SlurmChroot
from tests import reboot_cycle

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("debootstrap") is None,
                                reason="needs root and debootstrap (make deps-machines)")


@pytest.mark.parametrize("index,suite", list(enumerate(SUITES)))
def test_a_chroot_cluster_of_that_release_drains_and_resumes(tmp_path, index, suite):
    """A drain and a resume; and, as the chroot's slurm.conf sets ReturnToService=2, opsctl's actor refuses to
    reboot a node there: the release's own `scontrol show config` says so, and the node is not asked to."""
    from opsctl.actor.act import REBOOT_REFUSED, Actor, Change
    from opsctl.config import parse_config
    from opsctl.slurm import SlurmCliImpl

    chroot = SlurmChroot.ensure(suite)
    assert chroot.version.startswith(SUITES[suite] + ".")
    # Ports apart from every other lab slot's clusters (index = 10 * slot + n).
    cluster = ChrootCluster(chroot, f"test-{suite}", ["gpu1", "gpu2"],
                            index=10 * int(os.environ.get("OPSCTL_LAB_SLOT") or 0) + 5 + index)
    try:
        cluster.up()
        subprocess.run([cluster.scontrol, "update", "nodename=gpu2", "state=drain", "reason=bad dimm"], check=True)
        states = subprocess.run([cluster.sinfo, "-h", "-N", "-o", "%N %t %E"], capture_output=True, text=True,
                                check=True).stdout.splitlines()
        assert states == ["gpu1 idle none", "gpu2 drain bad dimm"]
        slurm = SlurmCliImpl(cluster.sinfo, cluster.scontrol)
        assert slurm.return_to_service() == 2
        config = parse_config({}, "t", {"OPSCTL_STATE_DIR": str(tmp_path / "state")})
        reboot = Change(node="gpu2", event="reboot", seen=slurm.nodes()["gpu2"], reason="opsctl:reboot gpu3 xid-79")
        with Actor(config, slurm, 0.0) as actor:
            assert actor.apply([reboot]).dropped == [(reboot, REBOOT_REFUSED)]
        assert not slurm.nodes()["gpu2"].down_for_reboot
        subprocess.run([cluster.scontrol, "update", "nodename=gpu2", "state=resume"], check=True)
    finally:
        cluster.down()
    assert cluster.running() == {}


@pytest.mark.parametrize("index,suite", list(enumerate(SUITES)))
def test_a_rollout_reboot_request_shows_in_that_releases_json(tmp_path, index, suite):
    """opsctl's `scontrol reboot ASAP nextstate=DOWN reason=...` (the driver rollout's reboot through Slurm) is
    accepted by the release, and its JSON shows the node rebooting with the rollout's reason, which is what
    `opsctl rollout reboot` waits on. RebootProgram is /bin/true: slurmd runs it and nothing reboots, so the
    node stays in the reboot's hands until the cluster goes down. (22.05's scontrol(1) documents the same
    form.)"""
    from opsctl.slurm import SlurmCliImpl

    chroot = SlurmChroot.ensure(suite)
    # Ports apart from the test above (5, 6) and the lab tier's release clusters (7 to 9), which run meanwhile.
    cluster = ChrootCluster(chroot, f"reboot-{suite}", ["gpu1", "gpu2"], reboot_program="/bin/true",
                            index=10 * int(os.environ.get("OPSCTL_LAB_SLOT") or 0) + 3 + index)
    reason = "opsctl:provision nvidia driver 570.172.08"
    try:
        cluster.up(fresh=True)  # slurmctld's saved state would keep the last run's reboot
        slurm = SlurmCliImpl(cluster.sinfo, cluster.scontrol)
        slurm.drain(["gpu2"], reason)
        slurm.reboot(["gpu2"], reason)
        node = slurm.nodes()["gpu2"]
        assert node.down_for_reboot and node.reason.startswith(reason), node
        assert node.reason_rules() == ["provision"] and not slurm.nodes()["gpu1"].down_for_reboot
    finally:
        cluster.down()


@pytest.mark.parametrize("index,suite", list(enumerate(SUITES)))
def test_a_node_rebooted_through_slurm_comes_back_down_with_opsctls_reason_and_resumes(index, suite):
    """The remediation ladder's reboot on that release, with the lab's RebootProgram (the node's slurmd stops
    and starts again with -b): drained with an opsctl: reason, `SlurmCliImpl.reboot`, down_for_reboot while
    the reboot is requested and issued, then back: DOWN, no flags, the reboot's reason (Slurm appends
    " : reboot issued : reboot complete"), back_from_reboot; opsctl's resume makes it idle. Both releases show
    the same steps as 22.05 (tests/reboot_cycle.py, and test_lab.py for 22.05):

        REBOOT_REQUESTED  idle  DRAIN,REBOOT_REQUESTED  <reason>
        REBOOT_ISSUED     down  DRAIN,REBOOT_ISSUED     <reason> : reboot issued
        back              down  -                       <reason> : reboot issued : reboot complete

    After the resume 24.11 keeps that reason on the idle node; 26.05 (like 22.05) clears it."""
    from opsctl.slurm import SlurmCliImpl

    chroot = SlurmChroot.ensure(suite)
    # Ports apart from the tests above (3 to 6) and the lab tier's release clusters (7 to 9).
    cluster = ChrootCluster(chroot, f"reboot-cycle-{suite}", ["gpu1", "gpu2"],
                            index=10 * int(os.environ.get("OPSCTL_LAB_SLOT") or 0) + 0 + index)
    try:
        cluster.up(fresh=True)
        slurm = SlurmCliImpl(cluster.sinfo, cluster.scontrol)
        before = cluster.running()["slurmd.gpu2"]
        reboot_cycle.check_cycle(reboot_cycle.reboot_cycle(slurm, "gpu2"))
        # The lab tracks the slurmd that came back in place of the one the reboot stopped.
        after = cluster.running()
        assert after.keys() == {"munged", "slurmctld", "slurmd.gpu1", "slurmd.gpu2"} and after["slurmd.gpu2"] != before
        node = reboot_cycle.resume(slurm, "gpu2")
        assert node.reason == (f"{reboot_cycle.BACK[2]}" if SUITES[suite] == "24.11" else "")
        assert slurm.nodes()["gpu1"].state == "idle"
    finally:
        cluster.down()
    assert cluster.running() == {}
