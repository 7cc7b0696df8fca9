"""site.yml in check mode (--check --diff) for the platforms this machine cannot boot: Ubuntu 24.04 and
Ubuntu 22.04, beside a Debian 12 node whose NVIDIA stack is the production one (the lab emulates it).

The hosts answer with recorded facts of their platform (tests/fixtures/ansible-facts/, SOURCES.md says
where each capture comes from) through the connection in tests/component/platform_host: every module
call is answered with what the host would report in check mode, and nvidia-smi answers with the lab's
emulated H200s. The inventory is the production example's variables (inventory/example/group_vars) on
four hosts, in one run.

What this proves: every task of the playbook runs for that platform with its variables (no undefined
variable, no missing platform value; module options are ansible-lint's `args` rule), with the package
names, versions and repositories asserted here, and the files it renders. What it cannot prove: that
apt resolves those packages on a real host, that the keys carry the fingerprints (a fresh host in
check mode downloads nothing), that the services start, that the node comes back from its reboot;
that needs a real run (docs/provisioning.md, "Platforms").
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.unit.test_roles_static import PLAYBOOKS, REPO

FACTS = REPO / "tests" / "fixtures" / "ansible-facts"
FAKE_HOST = Path(__file__).resolve().parent / "platform_host"
# slurmdbd's database password stand-in: it must appear nowhere in the run's output or its records.
SLURMDBD_PASSWORD = "check-mode-slurmdbd-stand-in"
BIN = Path(sys.executable).parent


def fake_host(tmp: Path, name: str, platform: str) -> dict:
    return {"ansible_connection": "opsctl_fake_host", "ansible_python_interpreter": "/usr/bin/python3",
            "opsctl_fake_host_facts": str(FACTS / f"{platform}.json"),
            "opsctl_fake_host_state": str(tmp / f"{name}-state.json")}


def run_check_mode(tmp: Path, hosts: dict[str, tuple[str, str]], variables: dict,
                   host_vars: dict[str, dict] | None = None,
                   known: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """site.yml --check --diff on `hosts` (name -> (group, platform)) with the production example's
    variables, `host_vars` per host and `variables` as extra variables; the `known` hosts' hardware
    facts are in the fact cache beforehand. Returns the run and its recorded task results."""
    inventory = tmp / "inventory"
    shutil.copytree(REPO / "inventory" / "example" / "group_vars", inventory / "group_vars")
    groups: dict[str, dict] = {}
    for index, (name, (group, platform)) in enumerate(hosts.items()):
        groups.setdefault(group, {"hosts": {}})["hosts"][name] = {"ansible_host": f"10.20.0.{10 + index}",
                                                                  **fake_host(tmp, name, platform),
                                                                  **(host_vars or {}).get(name, {})}
    # Tasks delegated to the control host (opsctl's wheel, the alert rules) are answered alike: the
    # wheel is not built (that is the same on every platform); an empty one stands for it.
    wheels = tmp / "wheels"
    wheels.mkdir()
    (wheels / "opsctl-0.0.0-py3-none-any.whl").write_bytes(b"")
    doc = {"all": {"hosts": {"localhost": fake_host(tmp, "localhost", hosts[next(iter(hosts))][1])},
                   "children": {"cluster": {"children": groups}}}}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(doc))
    record = tmp / "record.jsonl"
    env = {**os.environ, "ANSIBLE_CONFIG": str(PLAYBOOKS / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp / "facts"), "OPSCTL_RECORD": str(record),
           "ANSIBLE_CALLBACK_PLUGINS": str(FAKE_HOST / "callback_plugins"),
           "ANSIBLE_CALLBACKS_ENABLED": "opsctl_record",
           # the connection reads each module from its payload, which pipelining hands it
           "ANSIBLE_CONNECTION_PLUGINS": str(FAKE_HOST / "connection_plugins"), "ANSIBLE_PIPELINING": "1"}
    for name in known:  # in the fact cache with their hardware, as after an earlier run
        hw = json.loads((FACTS / f"{hosts[name][1]}.json").read_text())["opsctl_hw"]
        subprocess.run([str(BIN / "ansible"), "-i", str(inventory), name, "-m", "ansible.builtin.set_fact",
                        "-a", json.dumps({"opsctl_hw": hw, "cacheable": True})],
                       capture_output=True, text=True, timeout=300, env=env, cwd=REPO, check=True)
    # The example's secrets come from a site's vault; stand-ins here (check mode sends nothing anywhere).
    secrets = {"vault_alertmanager_email_password": "check-mode-stand-in",
               "vault_grafana_admin_password": "check-mode-stand-in",
               "vault_slurm_dbd_storage_pass": SLURMDBD_PASSWORD}
    extra = {"ansible_become": False, "opsctl_wheel_dir": str(wheels), **secrets, **variables}
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(PLAYBOOKS / "site.yml"),
                           "--check", "--diff", "-e", json.dumps(extra)],
                          capture_output=True, text=True, timeout=1800, env=env, cwd=REPO)
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


# One run for all platforms (each host costs about 15 s of CI): an Ubuntu 24.04 head node and GPU
# node and an Ubuntu 22.04 GPU node, which go to the end, and a Debian 12 GPU node with the production
# NVIDIA stack (the lab proves the rest of Debian 12, with emulated GPUs), which needs a reboot it is
# not allowed and stops there. A cluster runs one Slurm release: this one has the site repository's
# 24.11 (Ubuntu 22.04's own 21.08 is too old); Ubuntu 24.04's own 23.11 pins are checked by
# tests/unit/test_platforms.py and the preflight only.
HOSTS = {"head01": ("controller", "ubuntu-24.04"), "gpu001": ("gpu_nodes", "ubuntu-24.04"),
         "gpu002": ("gpu_nodes", "ubuntu-22.04"), "gpu003": ("gpu_nodes", "debian-12")}
UBUNTU_HOSTS = ["gpu001", "gpu002"]
SITE_REPOSITORY = {"name": "site-slurm", "uris": "https://repo.example.net/slurm/{{ ansible_distribution | lower }}",
                   "suites": "{{ ansible_distribution_release }}", "components": "main",
                   "key_url": "https://repo.example.net/slurm/key.asc",
                   "key_fingerprint": "0123456789ABCDEF0123456789ABCDEF01234567"}
SLURM = "24.11.5-1"
DRIVER = "570.133.20"
UBUNTU_GPU_PACKAGES = {
    f"nvidia-dkms-570-open={DRIVER}-0ubuntu1", f"libnvidia-compute-570={DRIVER}-0ubuntu1",
    f"nvidia-utils-570={DRIVER}-0ubuntu1", f"nvidia-compute-utils-570={DRIVER}-0ubuntu1",
    f"nvidia-fabricmanager-570={DRIVER}-1", f"libnvidia-nscq-570={DRIVER}-1", "doca-ofed=2.9.1*",
    "datacenter-gpu-manager-4-core=1:4.2.3*", "datacenter-gpu-manager-4-cuda12=1:4.2.3*",
    "datacenter-gpu-manager-exporter=4.1.3-1",
}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    tmp = tmp_path_factory.mktemp("check-mode")
    allowed = {name: {"nvidia_reboot_allowed": name != "gpu003"} for name in HOSTS}
    # Whamcloud builds no Lustre client for Debian 12: site.yml's preflight play refuses the node before
    # anything changes anywhere unless it names a site build (docs/storage-provisioning.md).
    allowed["gpu003"]["lustre_client_repo_url"] = "https://repo.example.net/lustre/debian-12/client"
    # gpu003 is a node the cluster knows from an earlier run, so slurm.conf still lists it when it
    # stops before this run's hardware discovery.
    return Run(*run_check_mode(tmp, HOSTS, {"slurm_site_repository": SITE_REPOSITORY, "slurm_version": SLURM},
                               allowed, known=("gpu003",)))


def test_every_task_runs_on_every_platform(run):
    """Every play reaches its end on every host but gpu003 (see the next test). Tasks that check
    a running service (uri) are skipped in check mode, as on a real host."""
    assert run.proc.returncode == 2, run.proc.stdout[-5000:] + run.proc.stderr[-2000:]
    failed = [(r["host"], r["task"]) for r in run.results if r["status"] == "failed"]
    assert failed == [("gpu003", "nvidia : Stop where a reboot is needed but not allowed")], failed
    for host in ("head01", *UBUNTU_HOSTS):
        assert run.ran(host, "common : Hold pinned packages"), host
    for host in UBUNTU_HOSTS:
        assert run.ran(host, "dcgm_exporter : Ensure dcgm-exporter is started and enabled"), host
    assert run.ran("head01", "opsctl : Ensure the opsctl health timer state")


def test_a_reboot_that_is_not_allowed_stops_that_node_with_one_line(run):
    assert "blacklist nouveau\n" in run.file("gpu003", "/etc/modprobe.d/opsctl-nvidia-blacklist.conf")
    assert run.ran("gpu003", "nvidia : Rebuild the initramfs")
    failed = run.ran("gpu003", "nvidia : Stop where a reboot is needed but not allowed")
    assert " ".join(failed[0]["msg"].split()) == (
        "gpu003: the NVIDIA driver or its kernel modules changed and need a reboot; nvidia_reboot_allowed is false: "
        "reboot the node (or allow it), then run again")
    assert not run.ran("gpu003", "nvidia : Reboot for the NVIDIA driver")
    assert not run.ran("gpu003", "slurm_common : Install the Slurm packages")


def test_packages_of_each_platform(run):
    assert run.apt_names("head01") >= {f"slurmctld={SLURM}", f"slurmdbd={SLURM}", "mariadb-server",
                                       "munge>=0.5.15-4ubuntu0.1", "prometheus-alertmanager>=0.26.0+ds-1",
                                       "prometheus>=2.45.3+ds-2ubuntu0.3", "prometheus-node-exporter>=1.7.0-1ubuntu0.3"}
    assert run.apt_names("gpu001") >= UBUNTU_GPU_PACKAGES | {
        "linux-headers-6.8.0-52-generic", f"slurmd={SLURM}", f"slurm-client={SLURM}", f"libpam-slurm-adopt={SLURM}",
        "munge>=0.5.15-4ubuntu0.1", "prometheus-node-exporter>=1.7.0-1ubuntu0.3"}
    assert run.apt_names("gpu002") >= UBUNTU_GPU_PACKAGES | {
        "linux-headers-5.15.0-102-generic", f"slurmd={SLURM}", "munge>=0.5.14-6ubuntu0.1",
        "prometheus-node-exporter>=1.3.1-1ubuntu0.22.04.3"}
    debian = run.apt_names("gpu003")
    assert debian >= {f"nvidia-driver-cuda={DRIVER}-1", f"nvidia-kernel-open-dkms={DRIVER}-1",
                      f"nvidia-persistenced={DRIVER}-1", f"nvidia-fabricmanager-570={DRIVER}-1",
                      f"libnvidia-nscq-570={DRIVER}-1", "doca-ofed=2.9.1*"}
    assert not {name for name in debian if "ubuntu" in name}
    # Lustre's modules from the site's DKMS build (the example's mirror), built against DOCA's MLNX_OFED.
    mirror = "https://mirror.example.net/lustre/2.15.6/ubuntu2204/client/"
    installs = run.ran("gpu002", "lustre_client : Install the Lustre client packages")
    assert [(r["args"] or {}).get("deb") for r in installs] == [
        f"{mirror}lustre-client-modules-dkms_2.15.6-1_amd64.deb", f"{mirror}lustre-client-utils_2.15.6-1_amd64.deb"]
    # NVIDIA's Debian packaging needs Debian's contrib; the Ubuntu hosts get no such file.
    contrib = run.file("gpu003", "/etc/apt/sources.list.d/opsctl-nvidia-distribution.sources")
    assert "URIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: contrib\n" in contrib
    for host in UBUNTU_HOSTS:
        enable = run.ran(host, "nvidia : Enable the distribution component the driver packages depend on")
        assert [r for r in enable if r["status"] != "skipped"] == [], host


@pytest.mark.parametrize("host,cuda,doca", [("gpu001", "ubuntu2404", "ubuntu24.04"),
                                            ("gpu002", "ubuntu2204", "ubuntu22.04"),
                                            ("gpu003", "debian12", "debian12")])
def test_repositories_of_each_platform(run, host, cuda, doca):
    cuda_sources = run.file(host, "/etc/apt/sources.list.d/nvidia-cuda.sources")
    assert f"URIs: https://developer.download.nvidia.com/compute/cuda/repos/{cuda}/x86_64/\n" in cuda_sources
    assert "Suites: /\n" in cuda_sources and "Signed-By: /etc/apt/keyrings/nvidia-cuda.asc\n" in cuda_sources
    doca_sources = run.file(host, "/etc/apt/sources.list.d/nvidia-doca.sources")
    assert f"URIs: https://linux.mellanox.com/public/repo/doca/2.9.1/{doca}/x86_64/\n" in doca_sources
    keys = {(r["args"] or {}).get("url") for r in run.ran(host, "common : Download the repository key")}
    assert keys >= {f"https://developer.download.nvidia.com/compute/cuda/repos/{cuda}/x86_64/3bf863cc.pub",
                    "https://linux.mellanox.com/public/repo/doca/GPG-KEY-Mellanox.pub"}
    pin = run.file(host, "/etc/apt/preferences.d/opsctl-nvidia-driver.pref")
    assert f"Pin: version {DRIVER}-*\n" in pin and "Package: *nvidia* *cuda* libnv*\n" in pin


@pytest.mark.parametrize("host,distribution,release", [("head01", "ubuntu", "noble"), ("gpu002", "ubuntu", "jammy")])
def test_site_repository_for_slurm(run, host, distribution, release):
    sources = run.file(host, "/etc/apt/sources.list.d/site-slurm.sources")
    assert f"URIs: https://repo.example.net/slurm/{distribution}\nSuites: {release}\nComponents: main\n" in sources
    assert "https://repo.example.net/slurm/key.asc" in {
        (r["args"] or {}).get("url") for r in run.ran(host, "common : Download the repository key")}
    # A site repository of SchedMD's packages makes no slurm user (the recorded hosts have none): the role
    # does, with the distribution packages' uid, before anything is owned by it.
    made = run.ran(host, "slurm_common : Make the Slurm user")
    assert made and {(r["args"]["name"], r["args"]["uid"]) for r in made} == {("slurm", 64030)}, made


def test_rendered_slurm_files(run):
    slurm_conf = run.file("head01", "/etc/slurm/slurm.conf").splitlines()
    assert "PrologEpilogTimeout=300" in slurm_conf and "ProctrackType=proctrack/cgroup" in slurm_conf
    assert "CgroupPlugin=cgroup/v2" in run.file("head01", "/etc/slurm/cgroup.conf")
    gres = run.file("gpu001", "/etc/slurm/gres.conf")
    assert "File=/dev/nvidia0 Cores=0-55" in gres and "File=/dev/nvidia7 Cores=56-111" in gres


def test_accounting_on_the_head_with_its_password_never_shown(run):
    """slurm.conf sends jobs to the head's slurmdbd; the head gets MariaDB with Slurm's InnoDB settings on
    localhost, its database and user, slurmdbd.conf and slurmdbd (the site repository's, as slurmctld;
    test_packages_of_each_platform); the tasks that carry the database password show none of it, and it
    is nowhere in the run's output or its records."""
    slurm_conf = run.file("head01", "/etc/slurm/slurm.conf").splitlines()
    assert {"AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=head01",
            "AccountingStoragePort=6819", "AccountingStorageTRES=gres/gpu"} <= set(slurm_conf)
    assert "AccountingStorageTRES=gres/gpu" in run.file("gpu001", "/etc/slurm/slurm.conf").splitlines()
    drop_in = run.file("head01", "/etc/mysql/mariadb.conf.d/70-opsctl-slurmdbd.cnf").splitlines()
    assert {"[mysqld]", "bind-address = 127.0.0.1", "innodb_buffer_pool_size = 4096M",
            "innodb_lock_wait_timeout = 900"} <= set(drop_in)
    for task in ("slurm_dbd : Template slurmdbd.conf", "slurm_dbd : Create slurmdbd's database and user, "
                 "and grant it the database"):
        ran = run.ran("head01", task)
        assert ran and ran[0]["args"] is None and ran[0]["diff"] is None, ran  # no_log: censored
    assert not {name for name in run.apt_names("gpu001") if name.startswith("slurmdbd")}
    assert SLURMDBD_PASSWORD not in run.proc.stdout + run.proc.stderr
    assert SLURMDBD_PASSWORD not in json.dumps(run.results)


@pytest.mark.parametrize("host", UBUNTU_HOSTS)
def test_nvidia_boot_files_and_dcgm_exporter(run, host):
    blacklist = run.file(host, "/etc/modprobe.d/opsctl-nvidia-blacklist.conf")
    assert "blacklist nouveau\n" in blacklist and "options nouveau modeset=0\n" in blacklist
    assert "nvidia_peermem\n" in run.file(host, "/etc/modules-load.d/opsctl-nvidia.conf")
    unit = run.file(host, "/etc/systemd/system/dcgm-exporter.service")
    assert "--remote-hostengine-info localhost:5555" in unit
    masked = run.ran(host, "dcgm_exporter : Mask package units that would run a second exporter")
    assert [r["args"]["name"] for r in masked] == ["nvidia-dcgm-exporter"] and masked[0]["args"]["masked"]
    assert run.ran(host, "nvidia : Rebuild the initramfs") and run.ran(host, "nvidia : Reboot for the NVIDIA driver")


def test_admins_log_in_ahead_of_pam_slurm_adopt(run):
    access = run.file("gpu001", "/etc/security/opsctl-slurm-access.conf")
    assert "+:root opsadmin (opsctl-admins):ALL\n" in access and access.rstrip().endswith("-:ALL:ALL")


@pytest.mark.parametrize("host", ["head01", *UBUNTU_HOSTS])
def test_every_pinned_package_is_held_and_no_minimum_build(run, host):
    pinned = {name.split("=", 1)[0] for name in run.apt_names(host) if "=" in name and ">=" not in name}
    minimum = {name.split(">=", 1)[0] for name in run.apt_names(host) if ">=" in name}
    holds = run.ran(host, "common : Hold pinned packages")
    assert [r["args"]["argv"][:3] for r in holds] == [["apt-mark", "hold", "--simulate"]], holds  # holds nothing
    held = set(holds[0]["args"]["argv"][3:])
    assert pinned and pinned <= held, sorted(pinned - held)
    # munge, Prometheus, node_exporter: security builds must reach them (common_held_packages says why).
    assert "munge" in minimum and not minimum & held, sorted(minimum & held)


def test_the_controllers_epilog_hands_failed_jobs_to_opsctl_why_on_the_head(run):
    """slurm.conf's EpilogSlurmctld is the slurm_controller role's script, which spools the id of a job
    that did not end cleanly for the head's opsctl-why.path (opsctl role) to explain (docs/why.md)."""
    assert "EpilogSlurmctld=/etc/slurm/opsctl-epilog-slurmctld.sh" in run.file(
        "head01", "/etc/slurm/slurm.conf").splitlines()
    epilog = run.file("head01", "/etc/slurm/opsctl-epilog-slurmctld.sh")
    assert ': > "/var/spool/opsctl-why/$SLURM_JOB_ID"' in epilog and '"0:0" ]' in epilog
    assert "DirectoryNotEmpty=/var/spool/opsctl-why" in run.file("head01", "/etc/systemd/system/opsctl-why.path")
    assert "ExecStart=/opt/opsctl/bin/opsctl why --spool /var/spool/opsctl-why --wait 120" in run.file(
        "head01", "/etc/systemd/system/opsctl-why.service")


@pytest.mark.parametrize("host", ["head01", *UBUNTU_HOSTS])
def test_needrestart_lists_only_and_unattended_upgrades_leave_the_held_packages_from_the_first_apt_run(run, host):
    """Ubuntu 24.04's needrestart restarts the services of a replaced library after every APT transaction:
    before the role's first one, it is told to list only; unattended-upgrades skip every held pattern."""
    assert "$nrconf{restart} = 'l';" in run.file(host, "/etc/needrestart/conf.d/50-opsctl.conf").splitlines()
    blacklist = run.file(host, "/etc/apt/apt.conf.d/51opsctl-unattended-upgrades")
    assert 'Unattended-Upgrade::Package-Blacklist {' in blacklist and '    "nvidia-.*$";' in blacklist.splitlines()
    tasks = [r["task"] for r in run.results if r["host"] == host]
    assert tasks.index("common : Keep needrestart from restarting services after APT transactions") < \
        tasks.index("common : Install base packages"), tasks[:12]
