"""ChrootCluster's slurm.conf: own ports per index, its own munged socket, GPU gres (the component and
lab tiers start these clusters for real)."""

from pathlib import Path

import pytest

from opsctl_lab.errors import LabError
from opsctl_lab.slurm_chroot import ChrootCluster, SlurmChroot

CHROOT = SlurmChroot(suite="trixie", root=Path("/nonexistent/trixie"))


def test_ports_munge_socket_and_gres():
    cluster = ChrootCluster(CHROOT, "x", ["gpu041", "gpu042"], index=27, gres="gpu:h200:8")
    conf = cluster.conf_text
    assert "SlurmctldPort=28844\n" in conf and "Port=[37101-37102]" in conf
    assert "AuthInfo=socket=/var/lib/opsctl-x/munge/munge.socket\n" in conf
    assert "GresTypes=gpu\n" in conf and " Gres=gpu:h200:8\n" in conf


@pytest.mark.parametrize("index", [0, 1, 27, 99])
def test_every_index_keeps_to_its_own_ports(index):
    mine = ChrootCluster(CHROOT, "x", ["n"] * 300, index=index)
    ports = set(range(29001 + 300 * index, 29001 + 300 * index + 300))
    assert max(ports) < 65536 and mine.ctld_port < 29001
    if index:
        other = ChrootCluster(CHROOT, "y", ["n"], index=index - 1)
        assert 29001 + 300 * (index - 1) + 300 <= min(ports) and other.ctld_port != mine.ctld_port


def test_an_index_out_of_range_is_refused():
    with pytest.raises(LabError, match="index must be 0-99"):
        ChrootCluster(CHROOT, "x", ["gpu1"], index=100)
