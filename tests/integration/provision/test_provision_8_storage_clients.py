"""The storage client roles on the provisioned lab machines (nfs_client, lustre_client, and slurmd's
storage drop-in and epilog check of slurm_compute).

The lab kernel has neither an NFS nor a Lustre client, so the lab inventory sets nfs_client_activate and
lustre_client_activate to false: the units are rendered into /etc/opsctl/storage-units/ and verified
there, never installed into /etc/systemd/system nor started (inventory/lab/group_vars). In their place
/shared and /lustre are real bind mounts on the GPU machines (shared.mount and lustre.mount, written by
the lab's hardware emulation), so slurmd's RequiresMountsFor= and the epilog's check act on real mounts.

These tests provision nothing of their own: they use the session's provisioned machines (conftest.py), or
with OPSCTL_LAB_INVENTORY a lab of one's own, provisioned already; the fixture checks that slurmd runs.
Needs root and the lab machines (make deps-machines).
"""

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.integration.provision.support import NEEDS_MACHINES, NEEDS_ROOT, REPO, Machines, wait_until

pytestmark = [NEEDS_ROOT, NEEDS_MACHINES, pytest.mark.provision]

RENDER_DIR = "/etc/opsctl/storage-units"
GROUP_VARS = REPO / "inventory" / "lab" / "group_vars"


@pytest.fixture(scope="module")
def machines(request):
    """The machines of the session's `provisioned` fixture (conftest.py), or, when OPSCTL_LAB_INVENTORY
    names the inventory of a lab of one's own, that lab's machines, provisioned already."""
    own = os.environ.get("OPSCTL_LAB_INVENTORY")
    if own:
        assert (Path(own) / "hosts.yml").exists(), f"no lab machines ({own}/hosts.yml)"
        built = Machines(Path(own))
    else:
        built = request.getfixturevalue("provisioned")["machines"]
    for node in built.gpu_nodes:
        active = built.ssh(node, "systemctl is-active slurmd", check=False).stdout.strip()
        assert active == "active", f"{node}: slurmd is {active}: the machines are not provisioned"
    return built


def lab_vars(group: str) -> dict:
    return yaml.safe_load((GROUP_VARS / f"{group}.yml").read_text())


def verify_over_ssh(machines: Machines, host: str, units: list[str]) -> subprocess.CompletedProcess:
    files = " ".join(f"'{RENDER_DIR}/{name}'" for name in units)
    return machines.ssh(host, f"systemd-analyze verify --man=no {files}", check=False)


def rendered(machines: Machines, host: str) -> set[str]:
    return set(machines.ssh(host, f"ls -1 {RENDER_DIR}").stdout.split())


def test_every_gpu_machine_has_nfs_and_lustre_units_rendered_verified_and_not_installed(machines):
    units = ["home.mount", "home.automount", "shared.mount", "shared.automount", "lustre.mount", "lustre.automount"]
    for node in machines.gpu_nodes:
        assert set(units) <= rendered(machines, node), node
        checked = verify_over_ssh(machines, node, units)
        assert checked.returncode == 0 and checked.stderr == "", f"{node}: {checked.stderr}"
        lustre = machines.ssh(node, f"cat {RENDER_DIR}/lustre.mount").stdout
        assert "Type=lustre" in lustre and "Requires=lnet.service" in lustre
        assert "Options=flock,_netdev," in lustre
        # render-only: nothing of the roles' is in systemd's unit directory, no automount exists
        ours = machines.ssh(node, "grep -l -e '^Type=nfs4' -e '^Type=lustre' /etc/systemd/system/*.mount "
                                  "/etc/systemd/system/*.automount 2>/dev/null || true").stdout.split()
        assert ours == [], f"{node}: {ours}"
        automounts = machines.ssh(node, "systemctl list-units --all --no-legend --type=automount").stdout
        assert "home.automount" not in automounts and "lustre.automount" not in automounts, automounts


def test_lnet_is_configured_on_tcp_over_the_machines_interface(machines):
    for node in machines.gpu_nodes:
        conf = yaml.safe_load(machines.ssh(node, "cat /etc/lnet.conf").stdout)
        (net,) = conf["net"]
        device = machines.ssh(node, f"ip -o -4 addr show to {machines.addr(node)}").stdout.split()[1].split("@")[0]
        assert net == {"net type": "tcp", "local NI(s)": [{"interfaces": {0: device}}]}, (node, conf)


def test_head_has_the_nfs_units_for_home_and_shared_and_no_lustre(machines):
    names = rendered(machines, machines.head)
    assert {"home.mount", "home.automount", "shared.mount", "shared.automount"} <= names
    assert not {"lustre.mount", "lustre.automount"} & names
    checked = verify_over_ssh(machines, machines.head, ["home.mount", "home.automount", "shared.mount",
                                                         "shared.automount"])
    assert checked.returncode == 0 and checked.stderr == "", checked.stderr
    home = machines.ssh(machines.head, f"cat {RENDER_DIR}/home.mount").stdout
    assert "Type=nfs4" in home and "Options=_netdev,hard,nconnect=8,vers=4.2" in home
    if "storage" in machines.groups:
        storage = sorted(machines.groups["storage"])[0]
        assert f"What={machines.addr(storage)}:/home" in home


def test_slurmd_requires_the_lab_mounts(machines):
    required = lab_vars("gpu_nodes")["slurm_compute_required_mounts"]
    for node in machines.gpu_nodes:
        dropin = machines.ssh(node, "cat /etc/systemd/system/slurmd.service.d/opsctl-storage.conf").stdout
        assert f"RequiresMountsFor={' '.join(required)}" in dropin
        shown = machines.ssh(node, "systemctl show slurmd -p RequiresMountsFor").stdout.strip()
        assert sorted(shown.removeprefix("RequiresMountsFor=").split()) == sorted(required), shown


def test_epilog_drains_a_node_whose_required_mount_went_away(machines):
    """/lustre is unmounted behind systemd's back (umount, not `systemctl stop`, which would stop slurmd
    too, as it requires the mount): the next job's epilog drains the node, then the mount comes back."""
    node = machines.gpu_nodes[-1]
    if machines.ssh(node, "mountpoint -q /lustre", check=False).returncode != 0:
        pytest.skip(f"{node}: /lustre is no mount (the lab's lustre.mount is missing on this machine)")
    wait_until(lambda: machines.node_state(node)[0] in ("idle", "mixed"), 90, f"{node} idle")
    machines.on_head(f"timeout 60 srun -w {node} true")
    assert machines.drained(node) is None, machines.node_state(node)
    machines.ssh(node, "umount /lustre")
    try:
        machines.on_head(f"timeout 60 srun -w {node} true")
        state, reason = wait_until(lambda: machines.drained(node), 60, f"{node} drained by the epilog")
        assert reason.startswith("opsctl:epilog") and "storage /lustre not mounted" in reason, reason
    finally:
        machines.ssh(node, "systemctl start lustre.mount && mountpoint -q /lustre")
        machines.resume(node)
    wait_until(lambda: machines.node_state(node)[0] in ("idle", "mixed"), 60, f"{node} back in service")
