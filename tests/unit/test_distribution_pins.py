"""The distribution pins of vars/<platform>.yml against the distributions' own archives: the Packages
stanzas of Debian 12 and Ubuntu 22.04 and 24.04 (release, -updates and -security pockets, as a node's
sources.list has them) for the packages the roles pin, captured in tests/fixtures/apt/archive/
(SOURCES.md). A minimum a role installs at (`munge>=...`) must be met by a build the archive holds, or
a new node would not provision; and it must be a build of that platform, or it says nothing about it."""

import re
from pathlib import Path

import pytest

from tests.unit.test_platforms import SUPPORTED
from tests.unit.test_roles_static import ROLES, load_yaml

ARCHIVE = Path(__file__).resolve().parents[1] / "fixtures" / "apt" / "archive"
SUITES = {"debian-12": "bookworm", "ubuntu-22.04": "jammy", "ubuntu-24.04": "noble"}
POCKETS = ("", "-updates", "-security")

# (role, the key of vars/<platform>.yml, the package it pins)
MINIMUMS = [("munge", "_munge_platform", "munge"), ("prometheus", "_prometheus_platform", "prometheus"),
            ("node_exporter", "_node_exporter_platform", "prometheus-node-exporter"),
            ("alertmanager", "_alertmanager_platform", "prometheus-alertmanager")]


def _order(char: str) -> int:
    """dpkg's lexical order (lib/dpkg/version.c, order()): `~` before the end, the end before letters,
    letters before every other character."""
    return -1 if char == "~" else ord(char) if char.isalpha() else ord(char) + 256


def _part_key(part: str) -> tuple:
    """dpkg's verrevcmp() as a key: alternating non-digit and digit runs, the first by _order (0 marks its
    end), the second as a number."""
    runs = re.findall(r"(\D*)(\d*)", part)
    return tuple((tuple(map(_order, text)) + (0,), int(digits or 0)) for text, digits in runs)


def version_key(version: str) -> tuple:
    """Epoch, upstream version and Debian revision, in the order `dpkg --compare-versions` sorts them."""
    epoch, _, rest = version.partition(":") if ":" in version else ("0", "", version)
    upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "0")
    return int(epoch), _part_key(upstream), _part_key(revision)


def compare_versions(a: str, b: str) -> int:
    """Negative, zero or positive as Debian version a sorts before, with or after b."""
    key_a, key_b = version_key(a), version_key(b)
    return (key_a > key_b) - (key_a < key_b)


@pytest.mark.parametrize("lower,higher", [
    ("0.5.15-2", "0.5.15-2+deb12u1"), ("0.26.0", "0.26.0+ds-1"), ("0.23.0", "0.23.0-4"),
    ("1.0~rc1-1", "1.0-1"), ("2.31.2+ds1-1ubuntu1", "2.31.2+ds1-1ubuntu1.22.04.3"), ("1:2.6.1-1", "2:0.1-1"),
    ("0.5.14-6", "0.5.14-6ubuntu0.1"), ("1.5.0-1+b6", "1.5.0-2"), ("9", "10"), ("1.0-1", "1.0a-1"),
])
def test_compare_versions_sorts_as_dpkg(lower, higher):
    assert compare_versions(lower, higher) < 0 < compare_versions(higher, lower)
    assert compare_versions(higher, higher) == 0


def archive_builds(platform: str, package: str) -> list[str]:
    """Every Version of PACKAGE in the platform's captured pockets."""
    builds = []
    for pocket in POCKETS:
        path = ARCHIVE / f"{SUITES[platform]}{pocket}.Packages"
        text = path.read_text() if path.exists() else ""  # bookworm-updates carries none of them
        for stanza in text.split("\n\n"):
            fields = dict(re.findall(r"^([\w-]+): (.*)$", stanza, flags=re.M))
            if fields.get("Package") == package:
                builds.append(fields["Version"])
    return builds


@pytest.mark.parametrize("platform", sorted(SUPPORTED))
@pytest.mark.parametrize("role,key,package", MINIMUMS)
def test_each_minimum_is_met_by_its_platforms_archive_and_is_one_of_its_builds(platform, role, key, package):
    """The minimum is a build the platform's archive holds now (the release pocket's, or a security build
    where the archive replaced that), and the newest build meets it."""
    minimum = load_yaml(ROLES / role / "vars" / f"{platform}.yml")[key]["version"]
    builds = archive_builds(platform, package)
    assert builds, (platform, package)
    assert minimum in builds, (minimum, builds)
    assert compare_versions(max(builds, key=version_key), minimum) >= 0


@pytest.mark.parametrize("platform", sorted(SUPPORTED))
def test_the_platforms_slurm_build_is_the_one_its_archive_carries(platform):
    """The preflight compares the platform's own Slurm with the release a site asks for (Ubuntu 22.04's
    21.08 is too old: a site repository is required there)."""
    version = load_yaml(ROLES / "slurm_common" / "vars" / f"{platform}.yml")["_slurm_platform"]["distribution_version"]
    assert version == max(archive_builds(platform, "slurmctld"), key=version_key)


def test_the_slurm_user_has_the_uid_the_distribution_packages_give_it():
    """slurm-wlm-basic-plugins' preinst (byte for byte the same in Debian 12, Ubuntu 22.04 and 24.04) makes
    the user with uid and gid 64030: the role makes it with the same where SchedMD's packages make none."""
    preinst = (ARCHIVE / "slurm-wlm-basic-plugins.preinst").read_text()
    uid = re.search(r"adduser --quiet --system --group --uid (\d+) .* slurm$", preinst, flags=re.M).group(1)
    assert load_yaml(ROLES / "slurm_common" / "defaults" / "main.yml")["slurm_user_uid"] == int(uid)
