"""What a requeue asks of Slurm, on 24.11 and 26.05 for real (Debian 13's and unstable's, from the lab's
debootstrap chroots; 22.05 is the lab's own, tests/integration/lab/test_lab_recover.py): squeue prints an
ended job's fields as opsctl/slurm/requeue.py reads them (the comment whole, the requeue, restart and batch
flags), and hold, exclude, release puts it back to PENDING off the excluded node."""

import os
import shutil
import subprocess

import pytest

from opsctl.slurm import SlurmCliImpl
from opsctl_lab.slurm_chroot import ChrootCluster, SlurmChroot
from tests.conftest import wait_until

pytestmark = [pytest.mark.lab, pytest.mark.skipif(os.geteuid() != 0 or shutil.which("debootstrap") is None,
                                                  reason="needs root and debootstrap (make deps-machines)")]
SUITES = {"trixie": "24.11.", "sid": "26.05."}
NODES = ["gpu1", "gpu2"]


def sbatch(cluster: ChrootCluster, *args: str) -> str:
    out = subprocess.run([str(cluster.bin / "sbatch"), "--parsable", "-o", "/dev/null", "-D", "/", *args],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return out.strip().split(";", 1)[0]


@pytest.mark.parametrize("suite", list(SUITES))
def test_an_ended_job_reads_as_requeue_needs_and_is_requeued_off_its_culprit(suite):
    chroot = SlurmChroot.ensure(suite)
    assert chroot.version.startswith(SUITES[suite])
    slot = int(os.environ.get("OPSCTL_LAB_SLOT") or 0)
    # Indexes 7 and 8 of this slot: the lab tier's, whose modules run one after another.
    cluster = ChrootCluster(chroot, f"recover-{suite}-{slot}", NODES, index=10 * slot + 7 + list(SUITES).index(suite))
    cluster.up(fresh=True)
    try:
        slurm = SlurmCliImpl(cluster.sinfo, cluster.scontrol)
        mine = sbatch(cluster, "-N1", "-w", "gpu1", "--requeue", "--comment=opsctl:recover a|b Requeue=0",
                      "--wrap", "exit 3")
        theirs = sbatch(cluster, "-N1", "-w", "gpu2", "--no-requeue", "--wrap", "exit 3")
        ended = {job: wait_until(lambda job=job: (j := slurm.queued_job(job)) and j.state == "FAILED" and j, 60,
                                 f"job {job} FAILED") for job in (mine, theirs)}
        first = ended[mine]
        assert (first.comment, first.requeue, first.batch, first.restarts, first.partition) == (
            "opsctl:recover a|b Requeue=0", True, True, 0, "gpu")
        assert (first.excluded, first.required) == ("", "gpu1")
        assert ended[theirs].requeue is False

        slurm.requeue_excluding(mine, "gpu2", pending=False)
        again = slurm.queued_job(mine)
        assert again is not None
        assert (again.state, again.excluded, again.restarts) == ("PENDING", "gpu2", 1), again
        assert slurm.queued_job("999999") is None  # never known: as a job gone past MinJobAge
    finally:
        cluster.down()
