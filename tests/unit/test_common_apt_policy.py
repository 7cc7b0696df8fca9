"""The common role's unattended-upgrades blacklist: each held glob (common_held_packages) becomes the Python
regular expression unattended-upgrades matches a package name with (re.match: from the name's start), and
must match exactly the names the glob does, so that `slurmd` keeps slurmd and not slurmdbd."""

import fnmatch
import re

import jinja2
import pytest
import yaml

from tests.unit.test_roles_static import PLAYBOOKS

ROLE = PLAYBOOKS / "roles" / "common"
HELD = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())["common_held_packages"]
NAMES = ["slurmd", "slurmdbd", "slurmctld", "slurm-client", "libslurm40", "libslurm-dev", "slurm-smd-slurmd",
         "libpam-slurm-adopt", "grafana", "grafana-enterprise", "nvidia-driver-cuda", "libnvidia-compute-570",
         "nvidia-kernel-open-dkms", "cuda-drivers-570", "datacenter-gpu-manager-4-core", "doca-ofed",
         "mlnx-ofed-kernel-dkms", "linux-image-amd64", "linux-image-6.1.0-28-amd64", "linux-headers-amd64",
         "linux-generic", "linux-generic-hwe-22.04", "munge", "prometheus", "libc6", "libstdc++6"]


def blacklist(patterns: list[str]) -> list[str]:
    # trim_blocks as Ansible's template module renders
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True)
    env.filters["comment"] = lambda text, style="plain": f"// {text}"
    text = env.from_string((ROLE / "templates" / "unattended-upgrades.conf.j2").read_text()).render(
        ansible_managed="managed", common_held_packages=patterns)
    body = text.split("Unattended-Upgrade::Package-Blacklist {", 1)[1].split("};", 1)[0]
    return [line.strip().removesuffix(";").strip('"') for line in body.splitlines() if line.strip()]


def test_each_held_glob_is_one_entry():
    assert len(blacklist(HELD)) == len(HELD)


@pytest.mark.parametrize("pattern", [*HELD, "libstdc++6", "linux-image-6.1.?-amd64"])
def test_each_entry_matches_exactly_what_its_glob_matches(pattern):
    [regex] = blacklist([pattern])
    for name in [*NAMES, "linux-image-6.1.x-amd64", "linux-image-6.1.0-amd64"]:
        assert bool(re.match(regex, name)) == fnmatch.fnmatchcase(name, pattern), (pattern, regex, name)
