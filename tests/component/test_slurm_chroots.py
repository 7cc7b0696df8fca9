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
