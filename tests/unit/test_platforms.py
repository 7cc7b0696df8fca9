"""The platforms the roles support, read as files and filters (no Ansible run): the platform filters,
every role's per-platform variable files, the pins in them, the meta platforms, and the package holds
covering every pinned production package. tests/component/test_platform_check_mode.py runs the playbook
itself for the platforms."""

import re
from pathlib import Path

import pytest

from tests.unit.test_roles_static import PLAYBOOKS, ROLES, load_module, load_yaml

PLATFORM = load_module(PLAYBOOKS / "filter_plugins" / "opsctl_platform.py", "opsctl_platform")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HOSTLIST = load_module(PLAYBOOKS / "filter_plugins" / "slurm_hostlist.py", "slurm_hostlist")
SUPPORTED = load_yaml(ROLES / "common" / "vars" / "main.yml")["_common_supported_platforms"]
PLATFORM_ROLES = sorted(p.parent.parent.name for p in ROLES.glob("*/vars/debian-12.yml"))

UBUNTU_2404 = {"distribution": "Ubuntu", "distribution_version": "24.04", "distribution_major_version": "24",
               "os_family": "Debian"}
DEBIAN_12 = {"distribution": "Debian", "distribution_version": "12.15", "distribution_major_version": "12",
             "os_family": "Debian"}


def test_platform_names_and_vars_files():
    assert PLATFORM.platform_name(UBUNTU_2404) == "ubuntu-24.04"
    assert PLATFORM.platform_name(DEBIAN_12) == "debian-12"
    assert PLATFORM.platform_vars_files(DEBIAN_12, "/r") == ["/r/vars/debian-12.yml", "/r/vars/debian-12.yml",
                                                             "/r/vars/debian.yml"]
    assert PLATFORM.platform_vars_files(UBUNTU_2404, "/r") == ["/r/vars/ubuntu-24.04.yml", "/r/vars/ubuntu-24.yml",
                                                               "/r/vars/debian.yml"]


@pytest.mark.parametrize("version,platform,misfit", [
    ("0.5.15-2+deb12u1", "ubuntu-24.04", "a Debian 12 build (+deb12), not for ubuntu-24.04"),
    ("0.5.15-2+deb12u1", "debian-12", ""),
    ("1.3.1-1ubuntu0.22.04.3", "ubuntu-24.04", "a build for Ubuntu 22.04, not for ubuntu-24.04"),
    ("1.3.1-1ubuntu0.22.04.3", "ubuntu-22.04", ""),
    ("0.5.15-4ubuntu0.1", "debian-12", "an Ubuntu build, not for debian-12"),
    ("23.11.4-1.2ubuntu5", "ubuntu-24.04", ""),
    ("24.11.5-1", "ubuntu-22.04", ""),
    ("0.25.0-1+b4", "ubuntu-24.04", "a Debian binary rebuild (+b4), not for ubuntu-24.04"),
    ("0.25.0-1+b4", "debian-12", ""),
])
def test_version_misfit(version, platform, misfit):
    assert PLATFORM.version_misfit(version, platform) == misfit


def test_pin_misfits_names_the_variable():
    assert PLATFORM.pin_misfits({"munge_version": "0.5.15-2+deb12u1", "prometheus_version": ""}, "ubuntu-24.04") == [
        "munge_version 0.5.15-2+deb12u1 is a Debian 12 build (+deb12), not for ubuntu-24.04"]


def test_host_addresses_never_write_a_name_as_an_address():
    hostvars = {
        "head": {"ansible_host": "10.20.0.10"},
        "gpu001": {"ansible_facts": {"default_ipv4": {"address": "10.20.1.1"}}},
        "gpu002": {"ansible_host": "gpu002.cluster.example.net",
                   "ansible_facts": {"default_ipv4": {"address": "10.20.1.2"}}},
        "gpu003": {"cluster_address": "10.30.1.3", "ansible_host": "10.20.1.3"},
        "gpu004": {},
    }
    assert PLATFORM.host_addresses(list(hostvars), hostvars) == [
        {"name": "head", "address": "10.20.0.10"}, {"name": "gpu001", "address": "10.20.1.1"},
        {"name": "gpu002", "address": "10.20.1.2"}, {"name": "gpu003", "address": "10.30.1.3"},
        {"name": "gpu004", "address": None}]


LISTENING_ROLES = ["node_exporter", "dcgm_exporter", "prometheus", "alertmanager", "grafana", "nfs_server"]


def test_services_bind_the_cluster_address_that_prometheus_scrapes_never_a_name():
    """A name in ansible_host may resolve to the stock `127.0.1.1 <hostname>` line on the node itself: the
    exporter would listen on loopback, pass a check made on the node, and be down for Prometheus."""
    hostvars = {"gpu002": {"ansible_host": "gpu002.cluster.example.net",
                           "ansible_facts": {"default_ipv4": {"address": "10.20.1.2"}}}}
    assert PLATFORM.cluster_address("gpu002", hostvars) == "10.20.1.2"
    for role in LISTENING_ROLES:
        defaults = load_yaml(ROLES / role / "defaults" / "main.yml")
        assert defaults[f"{role}_listen_address"] == "{{ inventory_hostname | cluster_address(hostvars) }}", role
    file_sd = (ROLES / "prometheus" / "templates" / "file_sd.yml.j2").read_text()
    assert "default(host | cluster_address(hostvars))" in file_sd


def test_gres_layouts_group_hosts_by_minor_numbers_and_affinity():
    gpus = [{"index": i, "minor": i, "cores": "0"} for i in range(2)]
    hostvars = {"gpu1": {"opsctl_hw": {"gpus": gpus}}, "gpu3": {"opsctl_hw": {"gpus": gpus}},
                "gpu2": {"opsctl_hw": {"gpus": [{**g, "minor": 1 - g["index"]} for g in gpus]}}}
    layouts = HOSTLIST.slurm_gres_layouts(["gpu1", "gpu2", "gpu3"], hostvars)
    assert [(layout["nodes"], layout["first"], [g["minor"] for g in layout["gpus"]]) for layout in layouts] == [
        ("gpu[1,3]", "gpu1", [0, 1]), ("gpu2", "gpu2", [1, 0])]
    with pytest.raises(Exception, match="no opsctl_hw facts for gpu4"):
        HOSTLIST.slurm_gres_layouts(["gpu1", "gpu4"], {**hostvars, "gpu4": {}})
    assert HOSTLIST.hosts_without(["gpu1", "gpu4"], {**hostvars, "gpu4": {}}, "opsctl_hw") == ["gpu4"]


@pytest.mark.parametrize("role", PLATFORM_ROLES)
def test_every_platform_role_has_a_file_per_supported_platform_and_the_family_floor(role):
    files = {p.stem for p in (ROLES / role / "vars").glob("*.yml")} - {"main"}
    assert files == set(SUPPORTED) | {"debian"}


def test_roles_with_platform_files_load_them():
    assert set(PLATFORM_ROLES) == {"alertmanager", "lustre_client", "munge", "nfs_client", "node_exporter", "nvidia",
                                   "prometheus", "slurm_common"}
    for role in PLATFORM_ROLES:
        text = (ROLES / role / "tasks" / "platform.yml").read_text()
        assert "lookup('ansible.builtin.first_found', ansible_facts | platform_vars_files(role_path))" in text


@pytest.mark.parametrize("platform", sorted(SUPPORTED))
def test_each_platforms_own_pins_fit_it(platform):
    """A distribution version in vars/<platform>.yml is a build for that platform (Ubuntu 22.04's Slurm
    is too old and is refused by the preflight instead)."""
    for role, prefix, key in (("munge", "munge", "version"), ("node_exporter", "node_exporter", "version"),
                              ("prometheus", "prometheus", "version"), ("alertmanager", "alertmanager", "version"),
                              ("slurm_common", "slurm", "distribution_version")):
        value = load_yaml(ROLES / role / "vars" / f"{platform}.yml")[f"_{prefix}_platform"][key]
        assert value and PLATFORM.version_misfit(value, platform) == "", (role, value)


def test_meta_platforms_are_the_supported_ones():
    codenames = {"debian-12": ("Debian", "bookworm"), "ubuntu-22.04": ("Ubuntu", "jammy"),
                 "ubuntu-24.04": ("Ubuntu", "noble")}
    expected = sorted(codenames[p] for p in SUPPORTED)
    for meta in ROLES.glob("*/meta/main.yml"):
        platforms = load_yaml(meta)["galaxy_info"]["platforms"]
        assert sorted((p["name"], v) for p in platforms for v in p["versions"]) == expected, meta


def _render(text: str) -> str:
    """The pinned package strings with the role defaults they use filled in."""
    values = {"nvidia_driver_branch": "570", "nvidia_driver_version": "570.133.20", "nvidia_doca_version": "2.9.1",
              "dcgm_exporter_dcgm_version": "4.2.3", "dcgm_exporter_version": "4.1.3",
              "dcgm_exporter_cuda_major": "12", "ansible_facts.kernel": "6.8.0-52-generic"}
    return re.sub(r"{{\s*([\w.]+)\s*}}", lambda m: values[m.group(1)], text)


def production_packages() -> set[str]:
    """Every package name the roles pin on any platform (name=version): NVIDIA's, DCGM's, Slurm's, munge,
    Prometheus and node_exporter."""
    names = set()
    for platform in SUPPORTED:
        nvidia = load_yaml(ROLES / "nvidia" / "vars" / f"{platform}.yml")["_nvidia_platform"]
        names |= {_render(p) for key in ("driver_packages", "fabric_packages", "doca_packages") for p in nvidia[key]}
    dcgm = load_yaml(ROLES / "dcgm_exporter" / "defaults" / "main.yml")["dcgm_exporter_packages"]
    names |= {_render(p) for p in dcgm}
    for role, key in (("slurm_controller", "slurm_controller_packages"), ("slurm_compute", "slurm_compute_packages")):
        names |= set(load_yaml(ROLES / role / "defaults" / "main.yml")[key])
    names |= MINIMUM_BUILDS | {"slurm-smd-slurmd", "slurm-smd-client"}
    return {name.split("=", 1)[0] for name in names}


# The distribution's packages the roles ask for at a minimum build: security updates must reach them.
MINIMUM_BUILDS = {"munge", "prometheus", "prometheus-node-exporter", "prometheus-alertmanager"}


def test_holds_cover_every_pinned_production_package_and_leave_security_builds_alone():
    patterns = load_yaml(ROLES / "common" / "defaults" / "main.yml")["common_held_packages"]
    packages = production_packages() - MINIMUM_BUILDS
    assert PLATFORM.packages_matching(sorted(MINIMUM_BUILDS | {"libmunge2"}), patterns) == []
    assert {"nvidia-dkms-570-open", "nvidia-kernel-open-dkms", "libnvidia-nscq-570", "nvidia-fabricmanager-570",
            "datacenter-gpu-manager-4-cuda12", "datacenter-gpu-manager-exporter", "doca-ofed"} <= packages
    assert sorted(packages - set(PLATFORM.packages_matching(packages, patterns))) == []
    assert PLATFORM.packages_matching(["chrony", "linux-headers-6.8.0-52-generic", "python3-apt"], patterns) == []


def test_only_installed_unheld_packages_that_match_are_held():
    patterns = load_yaml(ROLES / "common" / "defaults" / "main.yml")["common_held_packages"]
    selections = ["installed install slurmd", "installed hold slurmctld", "config-files deinstall grafana",
                  "installed install chrony", "installed install nvidia-fabricmanager-570", "not-installed unknown x",
                  ""]
    assert PLATFORM.packages_to_hold(selections, patterns) == ["nvidia-fabricmanager-570", "slurmd"]
    assert PLATFORM.packages_to_hold(["installed hold slurmd"], patterns) == []


def test_slurm_release_table_is_complete():
    releases = load_yaml(ROLES / "slurm_common" / "vars" / "main.yml")["_slurm_releases"]
    assert list(releases) == ["22.05", "23.02", "23.11", "24.05", "24.11", "25.05", "25.11", "26.05"]
    for release, keys in releases.items():
        assert set(keys) == {"epilog_timeout_key", "slurm_conf_unknown", "cgroup_keys", "cgroup_v1_only",
                             "cgroup_v2_only"}, release
        assert keys["epilog_timeout_key"] not in keys["slurm_conf_unknown"]
        assert set(keys["cgroup_v1_only"]) | set(keys["cgroup_v2_only"]) <= set(keys["cgroup_keys"])
        defaults = load_yaml(ROLES / "slurm_common" / "defaults" / "main.yml")["slurm_cgroup_config_default"]
        assert set(defaults) <= set(keys["cgroup_keys"]) and not set(defaults) & set(keys["cgroup_v1_only"])


def test_the_example_inventory_pins_nothing_platform_specific():
    """The production example runs on any supported platform: no distribution pin in its variables."""
    example = Path(ROLES.parent.parent / "inventory" / "example" / "group_vars")
    text = "".join(p.read_text() for p in example.glob("*.yml"))
    assert not re.search(r"_version:", text)


def test_packages_not_installed_are_the_specs_dpkg_does_not_show_at_a_matching_version():
    """The nvidia role's quick answer before it asks apt: a spec is satisfied only by an installed (`ii`) or
    held (`hi`) package at the version the apt module would match (exact, or a trailing wildcard)."""
    installed = ["nvidia-driver-cuda 570.133.20-1 hi ", "libcuda1 570.133.20-1 ii ", "doca-ofed 2.9.1-1 ii ",
                 "nvidia-smi 570.133.20-1 iU ", "munge 0.5.15-2 rc "]
    specs = ["nvidia-driver-cuda=570.133.20-1", "libcuda1=570.133.20-*", "doca-ofed=2.9.1*", "nvidia-smi=570.133.20-*",
             "munge", "libcuda1=570.172.08-*", "nvidia-persistenced=570.133.20-1", "doca-ofed"]
    assert PLATFORM.packages_not_installed(specs, installed) == [
        "nvidia-smi=570.133.20-*", "munge", "libcuda1=570.172.08-*", "nvidia-persistenced=570.133.20-1"]
    assert PLATFORM.packages_not_installed(specs[:3], installed) == []


def test_packages_upgradable_are_those_whose_candidate_is_not_installed():
    policy = (FIXTURES / "apt" / "apt-cache-policy-doca-cuda.txt").read_text()
    names = ["mlnx-ofed-kernel-dkms", "mlnx-ofed-kernel-utils", "libnvidia-nscq-570"]
    assert PLATFORM.packages_upgradable(names, policy) == []
    assert PLATFORM.packages_upgradable(["nvidia-driver-pinning-570", "not-in-the-output"], policy) == [
        "nvidia-driver-pinning-570", "not-in-the-output"]
    moved = policy.replace("  Candidate: 24.10.OFED.24.10.1.1.4.1-1", "  Candidate: 25.01.OFED.25.01.0.6.0.1-1", 1)
    assert PLATFORM.packages_upgradable(names, moved) == ["mlnx-ofed-kernel-dkms"]
