"""What the machines and provision tiers read of the vendor stack that the roles install from the lab's
vendor repositories (opsctl_lab.vendor_repos): the nvidia role's pinned packages on Debian 12, the builds
the repositories hold, and a node's installed packages."""

from pathlib import Path

import yaml

from opsctl_lab.vendor_repos import spec

ROOT = Path(__file__).resolve().parents[1]
NVIDIA_ROLE = ROOT / "playbooks" / "roles" / "nvidia"
DRIVER = yaml.safe_load((NVIDIA_ROLE / "defaults" / "main.yml").read_text())["nvidia_driver_version"]
BRANCH = DRIVER.split(".")[0]
PINNED = f"{DRIVER}-1"
NEWER = next(v for v in spec.load("cuda").package("nvidia-driver-cuda").versions if v != PINNED)
LUSTRE = yaml.safe_load((ROOT / "playbooks/roles/lustre_client/defaults/main.yml").read_text())["lustre_client_version"]
# Every package dpkg knows, with its version and status (`ii`; `hi` once the common role held it).
DPKG_QUERY = "dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\\n'"


def platform_packages(kind: str) -> list[str]:
    """The role's Debian 12 packages of one kind (driver_packages, fabric_packages, doca_packages)."""
    text = (NVIDIA_ROLE / "vars" / "debian-12.yml").read_text()
    text = text.replace("{{ nvidia_driver_version }}", DRIVER).replace("{{ nvidia_driver_branch }}", BRANCH)
    doca = yaml.safe_load((NVIDIA_ROLE / "defaults" / "main.yml").read_text())["nvidia_doca_version"]
    text = text.replace("{{ nvidia_doca_version }}", doca)
    return yaml.safe_load(text)["_nvidia_platform"][kind]


def installed(dpkg_output: str) -> dict[str, str]:
    """name -> version of the installed packages in DPKG_QUERY's output, held or not."""
    return {fields[0]: fields[1] for fields in map(str.split, dpkg_output.splitlines())
            if fields[2:] in (["ii"], ["hi"])}


def branch_builds(packages: dict[str, str], version: str) -> dict[str, str]:
    """The installed packages of the driver's branch whose version is not `version` (none: all are)."""
    return {name: v for name, v in packages.items() if v.startswith(f"{BRANCH}.") and v != version}
