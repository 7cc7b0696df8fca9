"""The GPU node roles on the provisioned machines: the nvidia role reports the reboot it skips and checks the
loaded driver against the pin, and the common role adds an APT repository only with the expected key.
"""

import subprocess

import pytest
import yaml

from tests.integration.provision.support import BIN, ENV, INVENTORY, NEEDS_MACHINES, NEEDS_ROOT, REPO, playbook

pytestmark = [NEEDS_ROOT]


@pytest.mark.provision
@NEEDS_MACHINES
def test_nvidia_role_reports_the_skipped_reboot_and_checks_the_driver(machines):
    """A changed boot file needs a reboot: the lab's GPU nodes say so and skip it. The check afterwards
    compares the loaded driver with the pin: a pin the node does not run stops the play with one line."""
    node = machines.gpu_nodes[0]
    machines.ssh(node, "rm /etc/modprobe.d/opsctl-nvidia-blacklist.conf")
    proc = playbook("--tags", "nvidia", "--limit", node, "-e", "nvidia_driver_version=570.999.99")
    assert proc.returncode != 0
    assert (f"{node}: the NVIDIA driver or its kernel modules changed, which needs a reboot; skipped: this node's "
            "GPUs are emulated (nvidia_emulated)") in " ".join(proc.stdout.split())
    assert (f"{node}: the loaded NVIDIA driver is 570.133.20, nvidia_driver_version is 570.999.99 "
            "(a reboot may be pending)") in " ".join(proc.stdout.split())
    machines.ssh(node, "grep -x 'blacklist nouveau' /etc/modprobe.d/opsctl-nvidia-blacklist.conf")


# Debian 12's own archive key (debian-archive-keyring), armored: a key the lab machines have, for a
# repository they can reach. The fingerprint is the primary key's, B8B8...; 4CB5... is its subkey.
DEBIAN_KEY = {"name": "opsctl-test-debian", "uris": "http://deb.debian.org/debian", "suites": "bookworm-updates",
              "components": "main", "key_url": "file:///etc/apt/trusted.gpg.d/debian-archive-bookworm-automatic.asc",
              "key_fingerprint": "B8B80B5B623EAB6AD8775C45B7C5D7D6350947F8"}


@pytest.mark.provision
@NEEDS_MACHINES
def test_a_repository_is_added_only_with_the_expected_key(machines, tmp_path):
    """The common role's apt_repository (CUDA, DOCA, a site's Slurm): a key whose fingerprint is not the
    expected one stops the run with one line and installs nothing; the right one is installed, named
    in Signed-By, and apt reads the repository with it."""
    node = machines.gpu_nodes[2]
    sources = f"/etc/apt/sources.list.d/{DEBIAN_KEY['name']}.sources"

    def add(fingerprint: str) -> subprocess.CompletedProcess:
        play = [{"name": "One repository", "hosts": node, "gather_facts": False, "tasks": [{
            "name": "Add it", "ansible.builtin.include_role": {"name": "common", "tasks_from": "apt_repository"},
            "vars": {"common_apt_repository": {**DEBIAN_KEY, "key_fingerprint": fingerprint}}}]}]
        (tmp_path / "repository.yml").write_text(yaml.safe_dump(play, sort_keys=False))
        return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(INVENTORY), str(tmp_path / "repository.yml")],
                              capture_output=True, text=True, timeout=600, env=ENV, cwd=REPO)

    try:
        refused = add("0123456789ABCDEF0123456789ABCDEF01234567")
        assert refused.returncode != 0
        assert ("apt repository opsctl-test-debian: the key at file:///etc/apt/trusted.gpg.d/debian-archive-bookworm-"
                "automatic.asc has fingerprints B8B80B5B623EAB6AD8775C45B7C5D7D6350947F8, "
                "4CB50190207B4758A3F73A796ED0E7B82643E131, expected 0123456789ABCDEF0123456789ABCDEF01234567; "
                "not trusted") in " ".join(refused.stdout.split())
        assert machines.ssh(node, f"test -e {sources}", check=False).returncode == 1
        added = add(DEBIAN_KEY["key_fingerprint"])
        assert added.returncode == 0, added.stdout[-4000:]
        assert "Signed-By: /etc/apt/keyrings/opsctl-test-debian.asc" in machines.ssh(node, f"cat {sources}").stdout
        policy = machines.ssh(node, "apt-cache policy").stdout
        assert "http://deb.debian.org/debian bookworm-updates/main amd64 Packages" in policy
    finally:
        machines.ssh(node, f"rm -f {sources} /etc/apt/keyrings/opsctl-test-debian.asc", check=False)
