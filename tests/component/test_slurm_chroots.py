"""The newer Slurm releases, real, from their debootstrap chroots: each runs a cluster of its own
(munged, slurmctld, slurmd per node) that takes a drain and a resume through the host-side wrappers."""

import os
import shutil
import subprocess

import pytest

from opsctl_lab.slurm_chroot import SUITES, ChrootCluster, SlurmChroot

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("debootstrap") is None,
                                reason="needs root and debootstrap (make deps-machines)")


@pytest.mark.parametrize("index,suite", list(enumerate(SUITES)))
def test_a_chroot_cluster_of_that_release_drains_and_resumes(tmp_path, index, suite):
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
    cluster = ChrootCluster(chroot, f"reboot-{suite}", ["gpu1", "gpu2"], extra_conf="RebootProgram=/bin/true\n",
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
