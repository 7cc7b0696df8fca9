"""site.yml in check mode (--check --diff) for the platforms this machine cannot boot: Ubuntu 24.04, and
Ubuntu 22.04 beside a Debian 12 node whose NVIDIA stack is the production one (the lab emulates it).

The hosts answer with recorded facts of their platform (tests/fixtures/ansible-facts/, SOURCES.md says
where each capture comes from) through tests/component/platform_host: every module really parses its
arguments, then reports what it would change, and nvidia-smi answers with the lab's emulated H200s. The
inventory is the production example's variables (inventory/example/group_vars) on two or three hosts.

What this proves: every task of the playbook runs for that platform with its variables (no undefined
variable, no misspelt module option), with the package names, versions and repositories asserted here,
and the files it renders. What it cannot prove: that apt resolves those packages on a real host, that
the services start, that the node comes back from its reboot; that needs a real run
(docs/provisioning.md, "Platforms").
"""

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.unit.test_roles_static import PLAYBOOKS, REPO

FACTS = REPO / "tests" / "fixtures" / "ansible-facts"
FAKE_HOST = Path(__file__).resolve().parent / "platform_host"
BIN = Path(sys.executable).parent
SITE_REPOSITORY = {"name": "site-slurm", "uris": "https://repo.example.net/slurm/ubuntu", "suites": "jammy",
                   "components": "main", "key_url": "https://repo.example.net/slurm/key.asc",
                   "key_fingerprint": "0123456789ABCDEF0123456789ABCDEF01234567"}
DRIVER = "570.133.20"


def write_interpreter(tmp: Path, host: str, platform: str) -> Path:
    """The host's "Python": this machine's, with the fake host loaded and the host's facts and state."""
    shim = tmp / f"python-{host}"
    env = {"PYTHONPATH": f"{FAKE_HOST}:{REPO}:{REPO / 'lab'}", "OPSCTL_FAKE_HOST_FACTS": FACTS / f"{platform}.json",
           "OPSCTL_FAKE_HOST_STATE": tmp / f"{host}-state.json", "OPSCTL_HW_STATE": tmp / f"{host}-hardware.json"}
    shim.write_text("#!/bin/sh\n" + "".join(f"export {k}='{v}'\n" for k, v in env.items())
                    + f'exec {sys.executable} "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    return shim


def run_check_mode(tmp: Path, hosts: dict[str, tuple[str, str]], variables: dict,
                   args: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """site.yml --check --diff on `hosts` (name -> (group, platform)) with the production example's
    variables plus `variables`; returns the run and its recorded task results."""
    inventory = tmp / "inventory"
    shutil.copytree(REPO / "inventory" / "example" / "group_vars", inventory / "group_vars")
    groups: dict[str, dict] = {}
    for index, (name, (group, platform)) in enumerate(hosts.items()):
        groups.setdefault(group, {"hosts": {}})["hosts"][name] = {
            "ansible_host": f"10.20.0.{10 + index}", "ansible_connection": "opsctl_fake_host",
            "ansible_python_interpreter": str(write_interpreter(tmp, name, platform))}
    doc = {"all": {"hosts": {"localhost": {"ansible_connection": "local", "ansible_python_interpreter":
                                           str(write_interpreter(tmp, "localhost", hosts[next(iter(hosts))][1]))}},
                   "children": {"cluster": {"children": groups}}}}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(doc))
    record = tmp / "record.jsonl"
    env = {**os.environ, "ANSIBLE_CONFIG": str(PLAYBOOKS / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp / "facts"), "OPSCTL_RECORD": str(record),
           "ANSIBLE_CALLBACK_PLUGINS": str(FAKE_HOST / "callback_plugins"), "ANSIBLE_CALLBACKS_ENABLED": "opsctl_record",
           "ANSIBLE_CONNECTION_PLUGINS": str(FAKE_HOST / "connection_plugins")}
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(PLAYBOOKS / "site.yml"),
                           "--check", "--diff", "-e", json.dumps({"ansible_become": False, **variables}), *args],
                          capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
    lines = record.read_text().splitlines() if record.exists() else []
    return proc, [json.loads(line) for line in lines]


class Run:
    def __init__(self, proc: subprocess.CompletedProcess, results: list[dict]):
        self.proc, self.results = proc, results

    def apt_names(self, host: str) -> set[str]:
        names: set[str] = set()
        for r in self.results:
            if r["host"] == host and r["action"] == "ansible.builtin.apt" and r["args"] and r["args"].get("name"):
                name = r["args"]["name"]
                names |= {name} if isinstance(name, str) else set(name)
        return names

    def file(self, host: str, dest: str) -> str:
        """The content a template or copy task would write to `dest` (its --diff)."""
        for r in self.results:
            if r["host"] != host or not r["diff"]:
                continue
            for diff in r["diff"] if isinstance(r["diff"], list) else [r["diff"]]:
                if diff.get("after_header") == dest or (r["args"] or {}).get("dest") == dest:
                    return diff.get("after", "")
        raise AssertionError(f"{host} writes no {dest}")

    def ran(self, host: str, task: str) -> list[dict]:
        return [r for r in self.results if r["host"] == host and r["task"] == task]


@pytest.fixture(scope="module")
def noble(tmp_path_factory) -> Run:
    """Ubuntu 24.04: Slurm 23.11 from the distribution; reboots allowed, so the run goes to the end."""
    tmp = tmp_path_factory.mktemp("noble")
    return Run(*run_check_mode(tmp, {"head01": ("controller", "ubuntu-24.04"), "gpu001": ("gpu_nodes", "ubuntu-24.04")},
                               {"nvidia_reboot_allowed": True}))


@pytest.fixture(scope="module")
def jammy(tmp_path_factory) -> Run:
    """Ubuntu 22.04 (its Slurm 21.08 is too old: a site repository's 24.11) with a Debian 12 GPU node."""
    tmp = tmp_path_factory.mktemp("jammy")
    return Run(*run_check_mode(tmp, {"head01": ("controller", "ubuntu-22.04"), "gpu001": ("gpu_nodes", "ubuntu-22.04"),
                                     "gpu002": ("gpu_nodes", "debian-12")},
                               {"nvidia_reboot_allowed": True, "slurm_site_repository": SITE_REPOSITORY,
                                "slurm_version": "24.11.5-1"}))


def assert_succeeded(run: Run):
    assert run.proc.returncode == 0, run.proc.stdout[-5000:] + run.proc.stderr[-2000:]


def test_ubuntu_24_04_runs_every_task_in_check_mode(noble):
    assert_succeeded(noble)
    assert {r["host"] for r in noble.results} >= {"head01", "gpu001"}
    assert not [r for r in noble.results if r["status"] == "failed"]


def test_ubuntu_22_04_and_debian_12_run_every_task_in_check_mode(jammy):
    assert_succeeded(jammy)
    assert not [r for r in jammy.results if r["status"] == "failed"]


UBUNTU_GPU_PACKAGES = {
    f"nvidia-dkms-570-open={DRIVER}-0ubuntu1", f"libnvidia-compute-570={DRIVER}-0ubuntu1",
    f"nvidia-utils-570={DRIVER}-0ubuntu1", f"nvidia-compute-utils-570={DRIVER}-0ubuntu1",
    f"nvidia-fabricmanager-570={DRIVER}-1", f"libnvidia-nscq-570={DRIVER}-1", "doca-ofed=2.9.1*",
    "datacenter-gpu-manager-4-core=1:4.2.3-1", "datacenter-gpu-manager-4-cuda12=1:4.2.3-1",
    "datacenter-gpu-manager-exporter=4.1.3-1",
}


def test_ubuntu_24_04_packages(noble):
    assert noble.apt_names("gpu001") >= UBUNTU_GPU_PACKAGES | {
        "linux-headers-6.8.0-52-generic", "slurmd=23.11.4-1.2ubuntu5", "slurm-client=23.11.4-1.2ubuntu5",
        "libpam-slurm-adopt=23.11.4-1.2ubuntu5", "munge=0.5.15-4ubuntu0.1",
        "prometheus-node-exporter=1.7.0-1ubuntu0.3"}
    assert noble.apt_names("head01") >= {"slurmctld=23.11.4-1.2ubuntu5", "munge=0.5.15-4ubuntu0.1",
                                         "prometheus=2.45.3+ds-2ubuntu0.3", "prometheus-node-exporter=1.7.0-1ubuntu0.3"}


def test_ubuntu_22_04_and_debian_12_packages(jammy):
    assert jammy.apt_names("gpu001") >= UBUNTU_GPU_PACKAGES | {
        "linux-headers-5.15.0-102-generic", "slurmd=24.11.5-1", "munge=0.5.14-6ubuntu0.1",
        "prometheus-node-exporter=1.3.1-1ubuntu0.22.04.3"}
    assert jammy.apt_names("head01") >= {"slurmctld=24.11.5-1", "prometheus=2.31.2+ds1-1ubuntu1.22.04.3"}
    debian = jammy.apt_names("gpu002")
    assert debian >= {f"nvidia-driver-cuda={DRIVER}-1", f"nvidia-kernel-open-dkms={DRIVER}-1",
                      f"nvidia-persistenced={DRIVER}-1", f"nvidia-fabricmanager-570={DRIVER}-1",
                      f"libnvidia-nscq-570={DRIVER}-1", "slurmd=24.11.5-1", "munge=0.5.15-2+deb12u1",
                      "prometheus-node-exporter=1.5.0-1+b6"}
    assert not {name for name in debian if "ubuntu" in name}


@pytest.mark.parametrize("platform,host,cuda,doca", [
    ("noble", "gpu001", "ubuntu2404", "ubuntu24.04"), ("jammy", "gpu001", "ubuntu2204", "ubuntu22.04"),
    ("jammy", "gpu002", "debian12", "debian12")])
def test_repositories_of_the_platform(request, platform, host, cuda, doca):
    run = request.getfixturevalue(platform)
    cuda_sources = run.file(host, "/etc/apt/sources.list.d/nvidia-cuda.sources")
    assert f"URIs: https://developer.download.nvidia.com/compute/cuda/repos/{cuda}/x86_64/\n" in cuda_sources
    assert "Suites: /\n" in cuda_sources and "Signed-By: /etc/apt/keyrings/nvidia-cuda.asc\n" in cuda_sources
    doca_sources = run.file(host, "/etc/apt/sources.list.d/nvidia-doca.sources")
    assert f"URIs: https://linux.mellanox.com/public/repo/doca/2.9.1/{doca}/x86_64/\n" in doca_sources
    keys = {(r["args"] or {}).get("url") for r in run.ran(host, "common : Download the repository key")}
    assert keys == {f"https://developer.download.nvidia.com/compute/cuda/repos/{cuda}/x86_64/3bf863cc.pub",
                    "https://linux.mellanox.com/public/repo/doca/GPG-KEY-Mellanox.pub"}
    pin = run.file(host, "/etc/apt/preferences.d/opsctl-nvidia-driver.pref")
    assert f"Pin: version {DRIVER}-*\n" in pin and "nvidia-fabricmanager-570" in pin


def test_site_repository_for_slurm_on_ubuntu_22_04(jammy):
    sources = jammy.file("head01", "/etc/apt/sources.list.d/site-slurm.sources")
    assert "URIs: https://repo.example.net/slurm/ubuntu\nSuites: jammy\nComponents: main\n" in sources


@pytest.mark.parametrize("platform,timeout_line", [("noble", "PrologEpilogTimeout=300"),
                                                   ("jammy", "PrologEpilogTimeout=300")])
def test_rendered_slurm_files(request, platform, timeout_line):
    run = request.getfixturevalue(platform)
    slurm_conf = run.file("head01", "/etc/slurm/slurm.conf")
    assert timeout_line in slurm_conf.splitlines() and "ProctrackType=proctrack/cgroup" in slurm_conf
    assert "CgroupPlugin=cgroup/v2" in run.file("head01", "/etc/slurm/cgroup.conf")
    gres = run.file("gpu001", "/etc/slurm/gres.conf")
    assert "File=/dev/nvidia0 Cores=0-55" in gres and "File=/dev/nvidia7 Cores=56-111" in gres


@pytest.mark.parametrize("platform", ["noble", "jammy"])
def test_nvidia_boot_files_and_dcgm_exporter(request, platform):
    run = request.getfixturevalue(platform)
    blacklist = run.file("gpu001", "/etc/modprobe.d/opsctl-nvidia-blacklist.conf")
    assert "blacklist nouveau\n" in blacklist and "options nouveau modeset=0\n" in blacklist
    assert "nvidia_peermem\n" in run.file("gpu001", "/etc/modules-load.d/opsctl-nvidia.conf")
    unit = run.file("gpu001", "/etc/systemd/system/dcgm-exporter.service")
    assert "--remote-hostengine-info localhost:5555" in unit
    masked = [r for r in run.ran("gpu001", "dcgm_exporter : Mask package units that would run a second exporter")]
    assert [r["args"]["name"] for r in masked] == ["nvidia-dcgm-exporter"] and masked[0]["args"]["masked"]
    assert run.ran("gpu001", "nvidia : Rebuild the initramfs") and run.ran("gpu001", "nvidia : Reboot for the NVIDIA driver")


def test_admins_log_in_ahead_of_pam_slurm_adopt(noble):
    access = noble.file("gpu001", "/etc/security/opsctl-slurm-access.conf")
    assert "+:root opsadmin (opsctl-admins):ALL\n" in access and access.rstrip().endswith("-:ALL:ALL")


@pytest.mark.parametrize("platform", ["noble", "jammy"])
def test_every_pinned_package_is_held(request, platform):
    run = request.getfixturevalue(platform)
    for host in ("head01", "gpu001"):
        pinned = {name.split("=", 1)[0] for name in run.apt_names(host) if "=" in name}
        held = {(r["args"] or {}).get("name") for r in run.ran(host, "common : Hold pinned packages")}
        assert pinned and pinned <= held, sorted(pinned - held)


def test_a_reboot_that_is_not_allowed_stops_the_node(tmp_path):
    proc, results = run_check_mode(tmp_path, {"head01": ("controller", "ubuntu-24.04"),
                                              "gpu001": ("gpu_nodes", "ubuntu-24.04")}, {}, ("--tags", "nvidia"))
    assert proc.returncode != 0
    failed = [r for r in results if r["status"] == "failed"]
    assert [(r["host"], r["task"]) for r in failed] == [("gpu001", "nvidia : Stop where a reboot is needed but not allowed")]
    assert " ".join(failed[0]["msg"].split()) == (
        "gpu001: the NVIDIA driver or its kernel modules changed and need a reboot; nvidia_reboot_allowed is false: "
        "reboot the node (or allow it), then run again")
