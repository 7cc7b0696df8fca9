"""The Slurm role's files, rendered by Ansible from the real role templates for the production example
(64 H200 nodes) and the lab, for each Slurm release the role's table knows that runs here: 22.05 (this
host's, Debian 12), 24.11 and 26.05 (debootstrap chroots of Debian 13 and unstable, opsctl_lab.slurm_chroot).
Each release's own parser (`slurmd -G`, with the GPU device files made in a private mount namespace)
reads the files, and each release's own man pages judge every key the role writes and the role's table
of release differences. Also: the preflight's refusals, the playbook's syntax with both inventories, and
the internal slurm_common role's guard.

cgroup/v2 on this host: slurmd's cgroup/v2 plugin needs a pure cgroup v2 host ("Hybrid mode is not
supported" in 22.05, "/sys/fs/cgroup is not a valid cgroup2 mountpoint" in 24.11 and 26.05). On a hybrid
host the production cgroup.conf is parsed with CgroupPlugin=cgroup/v1 instead, and its keys are checked
against the release's cgroup.conf(5) (test_written_keys_are_documented_by_the_release).
"""

import base64
import gzip
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.unit.test_roles_static import LAB_HOSTS, PLAYBOOKS, REPO, ROLES, load_yaml

CHECKER = ROLES / "slurm_common" / "files" / "opsctl-slurm-check"
BIN = Path(sys.executable).parent

# release -> (Debian suite of its chroot, None for this host's own; the package version)
RELEASES = {"22.05": (None, "22.05.8-4+deb12u3"), "24.11": ("trixie", "24.11.5-4+deb13u1"),
            "26.05": ("sid", "26.05.5-1")}
# The preflight wants a repository for any Slurm that Debian 12 does not ship; rendering installs nothing.
SITE_REPOSITORY = {"name": "site-slurm", "uris": "http://repo.example.net/slurm", "suites": "bookworm",
                   "components": "main", "key_url": "http://repo.example.net/slurm/key.asc",
                   "key_fingerprint": "0123456789ABCDEF0123456789ABCDEF01234567"}
NEEDS_CHROOTS = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("debootstrap") is None,
                                   reason="needs root and debootstrap (make deps-machines)")


# ---- rendering with the real role templates ------------------------------------------------------
H200_FACTS = {
    "gpu_count": 8,
    "gpu_model": "NVIDIA H200",
    "gpus": [{"index": i, "name": "NVIDIA H200", "pci_bus_id": f"00000000:{bus}:00.0", "minor": i,
              "cores": "0-55" if i < 4 else "56-111"}
             for i, bus in enumerate(["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"])],
    "hcas": [], "nvme": [], "memory_mb": 2063000, "cpus": 224, "sockets": 2, "cores_per_socket": 56,
    "threads_per_core": 2,
}
# The lab machines: 2 CPUs, affinity split over them; gpu2's minor numbers are reversed (hwinstall.py).
LAB_FACTS = {**H200_FACTS, "gpus": [{**g, "cores": "0" if g["index"] < 4 else "1"} for g in H200_FACTS["gpus"]],
             "memory_mb": 24105, "cpus": 2, "sockets": 1, "cores_per_socket": 2, "threads_per_core": 1}
LAB_FACTS_REVERSED = {**LAB_FACTS, "gpus": [{**g, "minor": 7 - g["index"]} for g in LAB_FACTS["gpus"]]}
# The group's first host lost its last GPU (off the bus): before, its facts made every node's line.
LAB_FACTS_GPU_LOST = {**LAB_FACTS, "gpu_count": 7, "gpus": LAB_FACTS["gpus"][:7], "lost_gpus": ["0000:DB:00.0"]}


def render_playbook(renders: dict[str, dict], facts: dict, facts_by_host: dict | None = None) -> str:
    """One play that gives every Slurm host its hardware facts, one that renders the files once per
    entry of `renders` (render directory -> extra role variables), with this host's own facts."""
    return yaml.safe_dump([
        {"name": "Hardware facts as hw_discovery reports them", "hosts": "controller:gpu_nodes",
         "gather_facts": False,
         "tasks": [{"name": "Set facts", "ansible.builtin.set_fact": {
             "opsctl_hw": "{{ (facts_by_host[inventory_hostname] if inventory_hostname in facts_by_host "
                          "else default_facts) }}"}}],
         "vars": {"facts_by_host": facts_by_host or {}, "default_facts": facts}},
        # This host's own facts (Debian 12): the platform the role loads its variables for.
        {"name": "Render the Slurm files", "hosts": "controller", "gather_facts": True, "gather_subset": ["min"],
         "tasks": [{"name": f"Render {directory}",
                    "ansible.builtin.include_role": {"name": "slurm_common", "tasks_from": "render"},
                    "vars": {"slurm_render_dir": directory, **variables}}
                   for directory, variables in renders.items()]},
    ], sort_keys=False)


def ansible_env(tmp: Path) -> dict:
    return {**os.environ, "ANSIBLE_CONFIG": str(PLAYBOOKS / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROLES),
            "ANSIBLE_FILTER_PLUGINS": str(PLAYBOOKS / "filter_plugins"), "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp / "facts")}


def local_args() -> list[str]:
    return ["-e", "ansible_become=false", "-e", "ansible_connection=local",
            "-e", f"ansible_python_interpreter={sys.executable}"]


def run_render(inventory: Path, tmp: Path, renders: dict[str, dict], facts: dict,
               facts_by_host: dict | None = None) -> subprocess.CompletedProcess:
    playbook = tmp / f"render-{len(list(tmp.glob('render-*.yml')))}.yml"
    playbook.write_text(render_playbook({str(tmp / name): variables for name, variables in renders.items()},
                                        facts, facts_by_host))
    # The production example's slurmdbd password comes from a site's vault (the preflight asks for it): a
    # stand-in here, rendering writes no slurmdbd.conf.
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(playbook), *local_args(),
                           "-e", "vault_slurm_dbd_storage_pass=render-stand-in"],
                          capture_output=True, text=True, timeout=300, env=ansible_env(tmp), cwd=REPO)


def release_vars(release: str) -> dict:
    if release == "22.05":
        return {}
    return {"slurm_version": RELEASES[release][1], "slurm_site_repository": SITE_REPOSITORY}


def lab_inventory(tmp: Path) -> Path:
    """inventory/lab/ as the lab writes it: the committed group_vars plus a hosts.yml like the lab's."""
    inv = tmp / "lab-inventory"
    shutil.copytree(REPO / "inventory" / "lab" / "group_vars", inv / "group_vars")
    (inv / "hosts.yml").write_text(LAB_HOSTS)
    return inv


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """production-<release> for each release and production-no-validate-partition (one ansible-playbook run),
    lab (22.05), and lab with gpu1 short of a GPU."""
    tmp = tmp_path_factory.mktemp("render")
    proc = run_render(REPO / "inventory" / "example", tmp,
                      {**{f"production-{release}": release_vars(release) for release in RELEASES},
                       "production-no-validate-partition": {"slurm_validate_partition": ""},
                       "production-no-accounting": {"slurm_accounting_enabled": False}}, H200_FACTS)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lab = lab_inventory(tmp)
    proc = run_render(lab, tmp, {"lab": {}}, LAB_FACTS, {"gpu2": LAB_FACTS_REVERSED})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    proc = run_render(lab, tmp, {"lab-gpu1-lost-a-gpu": {}}, LAB_FACTS, {"gpu1": LAB_FACTS_GPU_LOST})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {path.name: path for path in tmp.iterdir() if path.is_dir() and path.name != "facts"}


def read_conf(path: Path) -> dict:
    keys = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            key, _, value = line.partition("=")
            keys[key] = value
    return keys


def test_production_render_has_required_settings(rendered):
    conf = read_conf(rendered["production-22.05"] / "slurm.conf")
    assert conf["ProctrackType"] == "proctrack/cgroup"
    assert conf["TaskPlugin"] == "task/cgroup,task/affinity"
    assert conf["PrologFlags"] == "Contain"
    assert conf["PropagateResourceLimitsExcept"] == "MEMLOCK"
    text = (rendered["production-22.05"] / "slurm.conf").read_text()
    assert ("NodeName=gpu[001-064] CoresPerSocket=56 RealMemory=1959850 Sockets=2 ThreadsPerCore=2 "
            "Gres=gpu:h200:8 State=UNKNOWN") in text
    gres = (rendered["production-22.05"] / "gres.conf").read_text()
    for index in range(8):
        cores = "0-55" if index < 4 else "56-111"
        assert f"NodeName=gpu[001-064] Name=gpu Type=h200 File=/dev/nvidia{index} Cores={cores}\n" in gres
    assert read_conf(rendered["production-22.05"] / "cgroup.conf")["CgroupPlugin"] == "cgroup/v2"


def test_every_node_runs_the_node_check_as_its_health_check_at_slurmd_start_and_after(rendered):
    """slurmd runs HealthCheckProgram before it registers: a node that boots without a GPU drains itself before it
    takes a job. ANY,CYCLE: in every state, a part of the nodes at a time. The lab runs it only at slurmd's start
    (65535 s, the most slurm.conf takes)."""
    for release in ("22.05", "24.11", "26.05"):
        conf = read_conf(rendered[f"production-{release}"] / "slurm.conf")
        assert (conf["HealthCheckProgram"], conf["HealthCheckInterval"], conf["HealthCheckNodeState"]) == \
            ("/usr/local/sbin/opsctl-health-check", "600", "ANY,CYCLE")
    assert read_conf(rendered["lab"] / "slurm.conf")["HealthCheckInterval"] == "65535"


@pytest.mark.parametrize("release,key,absent", [("22.05", "PrologEpilogTimeout", "EpilogTimeout"),
                                                ("24.11", "PrologEpilogTimeout", "EpilogTimeout"),
                                                ("26.05", "EpilogTimeout", "PrologEpilogTimeout")])
def test_the_release_picks_its_epilog_timeout_key(rendered, release, key, absent):
    conf = read_conf(rendered[f"production-{release}"] / "slurm.conf")
    assert conf[key] == "300" and absent not in conf


def test_lab_render_differs_only_where_the_lab_says(rendered):
    prod, lab = read_conf(rendered["production-22.05"] / "slurm.conf"), read_conf(rendered["lab"] / "slurm.conf")
    lab_vars = load_yaml(REPO / "inventory" / "lab" / "group_vars" / "all.yml")
    changed = {k for k in prod.keys() | lab.keys() if prod.get(k) != lab.get(k)}
    assert changed - {"ClusterName", "SlurmctldHost", "AccountingStorageHost", "NodeName", "PartitionName"} == set(
        lab_vars["slurm_config"])
    assert read_conf(rendered["lab"] / "cgroup.conf")["CgroupPlugin"] == "cgroup/v1"


def test_gres_conf_names_each_gpu_by_its_minor_number(rendered):
    """gpu2's GPU index i is /dev/nvidia<7-i>: its lines name that device with GPU i's affinity; the
    nodes numbered alike share theirs."""
    lines = [line for line in (rendered["lab"] / "gres.conf").read_text().splitlines() if line.startswith("NodeName")]
    assert lines[:8] == [f"NodeName=gpu[1,3] Name=gpu Type=h200 File=/dev/nvidia{i} Cores={0 if i < 4 else 1}"
                         for i in range(8)]
    assert lines[8:] == [f"NodeName=gpu2 Name=gpu Type=h200 File=/dev/nvidia{7 - i} Cores={0 if i < 4 else 1}"
                         for i in range(8)]


def test_a_node_that_lost_a_gpu_has_a_line_of_its_own_and_the_others_keep_theirs(rendered):
    """Discovery per node: gpu1 reports 7 GPUs, gpu2 and gpu3 8. gpu1 gets its own NodeName= line (7 GPUs,
    and why, in a comment), gres.conf its own 7 lines; the partition and the others are as before."""
    directory = rendered["lab-gpu1-lost-a-gpu"]
    text = (directory / "slurm.conf").read_text()
    nodes = [line for line in text.splitlines() if line.startswith("NodeName=")]
    assert [(line.split()[0], line.split()[-2]) for line in nodes] == [
        ("NodeName=gpu[2-3]", "Gres=gpu:h200:8"), ("NodeName=gpu1", "Gres=gpu:h200:7")]
    assert "# gpu1 differs from the h200 profile: gpus 7 (profile 8), lost 0000:DB:00.0\n" in text
    assert nodes[0].replace("gpu[2-3]", "gpu[1-3]") in (rendered["lab"] / "slurm.conf").read_text()
    def partitions(path):
        return [line for line in path.read_text().splitlines() if line.startswith("PartitionName=")]

    assert partitions(directory / "slurm.conf") == partitions(rendered["lab"] / "slurm.conf")
    gres = [line.split()[0] for line in (directory / "gres.conf").read_text().splitlines() if line.startswith("Node")]
    assert gres == ["NodeName=gpu[2-3]"] * 8 + ["NodeName=gpu1"] * 7


def partition_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.startswith("PartitionName=")]


def test_validation_partition_holds_the_gpu_nodes_below_users_jobs(rendered):
    """opsctl validate --idle's partition (slurm_validate_partition): the GPU partition's nodes, PriorityTier 0
    (users' jobs, tier 1 by default, are scheduled first), hidden, root only, a whole node per job, never the
    default; the gpu partition stays the default one."""
    lines = partition_lines(rendered["production-22.05"] / "slurm.conf")
    assert lines == [
        "PartitionName=gpu Nodes=gpu[001-064] Default=YES DefMemPerCPU=8749 MaxTime=INFINITE OverSubscribe=NO "
        "State=UP",
        "PartitionName=validate Nodes=gpu[001-064] AllowGroups=root DefMemPerCPU=8749 Hidden=YES MaxTime=01:00:00 "
        "OverSubscribe=EXCLUSIVE PriorityTier=0 Default=NO State=UP"]
    gpu, validate = (dict(word.split("=", 1) for word in line.split()) for line in lines)
    assert validate["Nodes"] == gpu["Nodes"]
    assert [line.split()[0] for line in lines if " Default=YES " in line] == ["PartitionName=gpu"]
    lab = [line.split()[:2] for line in partition_lines(rendered["lab"] / "slurm.conf")]
    assert lab == [["PartitionName=gpu", "Nodes=gpu[1-3]"], ["PartitionName=validate", "Nodes=gpu[1-3]"]]


def test_an_empty_validation_partition_name_renders_none(rendered):
    """slurm_validate_partition: "" leaves the gpu partition alone, the default one."""
    conf = rendered["production-no-validate-partition"] / "slurm.conf"
    assert partition_lines(conf) == partition_lines(rendered["production-22.05"] / "slurm.conf")[:1]
    assert partition_lines(conf)[0].startswith("PartitionName=gpu Nodes=gpu[001-064] ")
    assert " Default=YES " in partition_lines(conf)[0]
    assert "validate" not in conf.read_text().split("# PARTITIONS", 1)[1]


def test_accounting_goes_to_slurmdbd_on_the_controller(rendered):
    """slurm_accounting_enabled (the default): every job to the controller's slurmdbd, GPUs accounted
    (AccountingStorageTRES), usage gathered from the job's cgroup."""
    conf = read_conf(rendered["production-22.05"] / "slurm.conf")
    assert {key: conf[key] for key in conf if key.startswith(("AccountingStorage", "JobAcctGather"))} == {
        "AccountingStorageType": "accounting_storage/slurmdbd", "AccountingStorageHost": conf["SlurmctldHost"],
        "AccountingStoragePort": "6819", "AccountingStorageTRES": "gres/gpu",
        "JobAcctGatherType": "jobacct_gather/cgroup"}
    lab = read_conf(rendered["lab"] / "slurm.conf")
    assert lab["AccountingStorageType"] == "accounting_storage/slurmdbd" and lab["AccountingStorageHost"] == "head"


def test_accounting_off_stores_nothing_and_asks_for_no_slurmdbd(rendered):
    """slurm_accounting_enabled: false: accounting_storage/none, and none of the keys that need slurmdbd
    (AccountingStorageTRES=gres/gpu among them); the rest of the file is the same."""
    on = read_conf(rendered["production-22.05"] / "slurm.conf")
    off = read_conf(rendered["production-no-accounting"] / "slurm.conf")
    assert off["AccountingStorageType"] == "accounting_storage/none"
    assert {k for k in on.keys() | off.keys() if on.get(k) != off.get(k)} == {
        "AccountingStorageType", "AccountingStorageHost", "AccountingStoragePort", "AccountingStorageTRES"}


# ---- Slurm's own parser, of each release -----------------------------------------------------------
def host_is_cgroup_v2_only() -> bool:
    return not Path("/sys/fs/cgroup/unified").exists() and Path("/sys/fs/cgroup/cgroup.controllers").exists()


needs_slurmd = pytest.mark.skipif(shutil.which("slurmd") is None or shutil.which("unshare") is None
                                  or os.geteuid() != 0, reason="needs slurmd, unshare and root")


def slurmd_check(directory: Path, nodes: list[str], cgroup: Path | None = None,
                 release: str = "22.05") -> subprocess.CompletedProcess:
    """The role's checker (slurmd -G -N NODE) with the release's slurmd: this host's, or its chroot's."""
    suite = RELEASES[release][0]
    if suite:
        from opsctl_lab.slurm_chroot import SlurmChroot

        return SlurmChroot.ensure(suite).slurmd_check(directory, nodes, cgroup)
    return subprocess.run([str(CHECKER), str(directory / "slurm.conf"), str(directory / "gres.conf"),
                           str(cgroup or directory / "cgroup.conf"), *nodes],
                          capture_output=True, text=True, timeout=120)


def parse_cgroup_for_this_host(directory: Path, tmp: Path) -> Path:
    """The cgroup.conf to parse here: on a hybrid v1/v2 host, the production file with CgroupPlugin=cgroup/v1
    (see the module docstring); its keys are checked against cgroup.conf(5) elsewhere."""
    source = directory / "cgroup.conf"
    if host_is_cgroup_v2_only():
        return source
    target = tmp / f"{directory.name}-cgroup.conf"
    target.write_text(source.read_text().replace("CgroupPlugin=cgroup/v2", "CgroupPlugin=cgroup/v1"))
    return target


def release_param(release: str):
    marks = [needs_slurmd] if RELEASES[release][0] is None else [NEEDS_CHROOTS]
    return pytest.param(release, marks=marks, id=release)


@pytest.mark.parametrize("release", [release_param(r) for r in RELEASES])
def test_production_files_pass_slurmd_of_the_release(rendered, tmp_path, release):
    directory = rendered[f"production-{release}"]
    proc = slurmd_check(directory, ["gpu001", "gpu064"], parse_cgroup_for_this_host(directory, tmp_path), release)
    assert proc.returncode == 0, proc.stderr[-3000:]


@needs_slurmd
def test_files_without_accounting_pass_slurmd(rendered, tmp_path):
    directory = rendered["production-no-accounting"]
    proc = slurmd_check(directory, ["gpu001"], parse_cgroup_for_this_host(directory, tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]


@needs_slurmd
@pytest.mark.parametrize("render", ["lab", "lab-gpu1-lost-a-gpu"])
def test_lab_files_pass_slurmd(rendered, render):
    proc = slurmd_check(rendered[render], ["gpu1", "gpu2", "gpu3"])
    assert proc.returncode == 0, proc.stderr[-3000:]


# Each line must fail the release's slurmd: the lines the role's release table keeps out are refused by
# the real parser of that release, so the table states facts, not guesses.
@pytest.mark.parametrize("release,target,line", [
    ("22.05", "slurm.conf", "NodeName=gpu001 Bogus=1"),
    ("22.05", "slurm.conf", "SelectType=select/nonexistent"),
    ("22.05", "gres.conf", "NodeName=gpu001 Name=gpu Type=h200 Fiel=/dev/nvidia0"),
    ("22.05", "cgroup.conf", "ConstrainKernelMemory=yes"),
    ("22.05", "cgroup.conf", "EnableControllers=yes"),
    ("22.05", "slurm.conf", "EpilogTimeout=60"),
    ("24.11", "slurm.conf", "EpilogTimeout=60"),
    ("24.11", "cgroup.conf", "ConstrainKmemSpace=no"),
    ("26.05", "cgroup.conf", "ConstrainKmemSpace=no"),
])
def test_a_line_the_release_refuses_fails_its_slurmd(rendered, tmp_path, release, target, line):
    needed = "slurmd" if release == "22.05" else "debootstrap"
    if os.geteuid() != 0 or shutil.which(needed) is None:
        pytest.skip(f"needs root and {needed}")
    broken = tmp_path / "broken"
    shutil.copytree(rendered["lab"] if release == "22.05" else rendered[f"production-{release}"], broken)
    cgroup = broken / "cgroup.conf"
    cgroup.write_text(cgroup.read_text().replace("CgroupPlugin=cgroup/v2", "CgroupPlugin=cgroup/v1"))
    with open(broken / target, "a") as handle:
        handle.write(line + "\n")
    proc = slurmd_check(broken, ["gpu1" if release == "22.05" else "gpu001"], release=release)
    assert proc.returncode == 1, proc.stderr


@needs_slurmd
def test_checker_takes_inline_candidates(rendered):
    """The form the role's validate: uses: two files inline (b64:), one path."""
    lab = rendered["lab"]
    inline = "b64:" + base64.b64encode((lab / "gres.conf").read_bytes()).decode()
    proc = subprocess.run([str(CHECKER), str(lab / "slurm.conf"), inline, str(lab / "cgroup.conf"), "gpu2"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not Path("/dev/nvidia7").exists() or Path("/dev/nvidia7").is_char_device()


# ---- every key against the release's own man pages ----------------------------------------------------
def man_page(release: str, name: str) -> Path:
    suite = RELEASES[release][0]
    if suite is None:
        return Path(f"/usr/share/man/man5/{name}.5.gz")
    from opsctl_lab.slurm_chroot import SlurmChroot

    return SlurmChroot.ensure(suite).root / f"usr/share/man/man5/{name}.5.gz"


def man_keys(path: Path) -> tuple[set[str], set[str], set[str]]:
    """(documented keys, keys "Only for cgroup/v1", keys "Only for cgroup/v2") of a Slurm man page."""
    text = gzip.decompress(path.read_bytes()).decode(errors="replace")
    keys, v1_only, v2_only = set(), set(), set()
    for block in re.split(r"^\.TP\s*$", text, flags=re.M)[1:]:
        head, _, body = block.strip().partition("\n")
        match = re.match(r"\\fB(\w+)\\fR", head)
        if not match:
            continue
        keys.add(match.group(1))
        body = body.split(".TP")[0]
        if "Only for cgroup/v1" in body:
            v1_only.add(match.group(1))
        if "Only for cgroup/v2" in body:
            v2_only.add(match.group(1))
    return keys, v1_only, v2_only


def man_param(release: str):
    marks = [pytest.mark.skipif(not Path("/usr/share/man/man5/cgroup.conf.5.gz").exists(),
                                reason="cgroup.conf(5) not installed (slurm-client)")]
    if RELEASES[release][0]:
        marks.append(NEEDS_CHROOTS)
    return pytest.param(release, marks=marks, id=release)


@pytest.mark.parametrize("release", [man_param(r) for r in RELEASES])
def test_release_table_is_the_releases_cgroup_conf(release):
    """The role's table of release differences is each release's own cgroup.conf(5)."""
    keys, v1_only, v2_only = man_keys(man_page(release, "cgroup.conf"))
    table = load_yaml(ROLES / "slurm_common" / "vars" / "main.yml")["_slurm_releases"][release]
    assert (set(table["cgroup_keys"]), set(table["cgroup_v1_only"]), set(table["cgroup_v2_only"])) == \
        (keys, v1_only, v2_only)


@pytest.mark.parametrize("release", [man_param(r) for r in RELEASES])
def test_written_keys_are_documented_by_the_release(rendered, release):
    """Every slurm.conf and cgroup.conf key the role writes for the release is in its man pages (Slurm keys
    are case-insensitive)."""
    directory = rendered[f"production-{release}"]
    slurm_keys = {k.lower() for k in man_keys(man_page(release, "slurm.conf"))[0]}
    written = set(read_conf(directory / "slurm.conf")) - {"NodeName", "PartitionName"}
    assert sorted(k for k in written if k.lower() not in slurm_keys) == []
    cgroup_keys, v1_only, _v2_only = man_keys(man_page(release, "cgroup.conf"))
    cgroup = read_conf(directory / "cgroup.conf")
    assert cgroup["CgroupPlugin"] == "cgroup/v2"
    assert sorted(set(cgroup) - cgroup_keys) == [] and sorted(set(cgroup) & v1_only) == []


def test_man_page_parse_finds_version_specific_keys():
    path = Path("/usr/share/man/man5/cgroup.conf.5.gz")
    if not path.exists():
        pytest.skip("cgroup.conf(5) not installed (slurm-client)")
    keys, v1_only, v2_only = man_keys(path)
    assert {"CgroupPlugin", "ConstrainCores", "ConstrainDevices", "ConstrainRAMSpace", "AllowedSwapSpace"} <= keys
    assert {"MemorySwappiness", "ConstrainKmemSpace", "AllowedKmemSpace", "MaxKmemPercent", "MinKmemSpace"} <= v1_only
    assert {"IgnoreSystemd"} <= v2_only


# ---- the preflight refuses what a release or plugin would not take ------------------------------------
REFUSALS = {
    "v1-key-with-v2": ({"slurm_cgroup_config": {"MemorySwappiness": 10}},
                       "CgroupPlugin=cgroup/v2 does not take MemorySwappiness"),
    "gone-in-24.11": ({**release_vars("24.11"), "slurm_cgroup_config": {"CgroupPlugin": "cgroup/v1",
                                                                        "ConstrainKmemSpace": "no"}},
                      "slurm_cgroup_config: Slurm 24.11 does not know ConstrainKmemSpace"),
    "new-in-25.05": ({"slurm_config": {"EpilogTimeout": 60}}, "slurm_config: Slurm 22.05 does not know EpilogTimeout"),
    "too-old": ({"slurm_version": "21.08.8-2", "slurm_site_repository": SITE_REPOSITORY},
                "slurm_version 21.08.8-2 is not a supported release (22.05, 23.02"),
    "not-the-distribution's": ({"slurm_version": "24.11.5-1"},
                               "slurm_version 24.11.5-1 is not what Debian 12 ships (22.05.8-4+deb12u3)"),
    "no-version-for-the-repository": ({"slurm_site_repository": SITE_REPOSITORY},
                                      "slurm_site_repository is set but slurm_version is empty"),
    "validation-partition-twice": ({"slurm_validate_partition": "gpu"},
                                   "slurm_validate_partition gpu is also in slurm_partitions"),
    "no-slurmdbd-password": ({"slurm_dbd_storage_pass": ""},
                             "slurm_dbd_storage_pass is not set: slurmdbd (slurm_accounting_enabled) needs its "
                             "database password, from a vault (there is no default)"),
}
# Passed the preflight: no case above may pass, and these must (refusals: '' for them).
PASSES = {
    "no-password-without-accounting": {"slurm_dbd_storage_pass": "", "slurm_accounting_enabled": False},
}


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> dict[str, str]:
    """Each case's variables through the slurm_common role's preflight, in one ansible-playbook run: case -> the
    message it was refused with ('' when it passed)."""
    tmp = tmp_path_factory.mktemp("refusals")
    facts_play = yaml.safe_load(render_playbook({}, LAB_FACTS))[0]
    playbook = tmp / "refusals.yml"
    playbook.write_text(yaml.safe_dump([facts_play, {
        "name": "Preflight", "hosts": "controller", "gather_facts": True, "gather_subset": ["min"],
        "tasks": [{"name": f"Case {case}",
                   "block": [{"name": "Preflight", "vars": variables,
                              "ansible.builtin.include_role": {"name": "slurm_common", "tasks_from": "preflight"}}],
                   "rescue": [{"name": "Refused", "ansible.builtin.debug": {
                       "msg": f"REFUSED {case}: {{{{ ansible_failed_result.msg }}}}"}}]}
                  for case, variables in {**{case: v for case, (v, _m) in REFUSALS.items()}, **PASSES}.items()]}],
                                       sort_keys=False))
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(lab_inventory(tmp)), str(playbook), *local_args()],
                          capture_output=True, text=True, timeout=300, env=ansible_env(tmp), cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:]
    found = dict(re.findall(r'"msg": "REFUSED ([^:]+): (.*)"', proc.stdout))
    return {case: " ".join(found.get(case, "").split()) for case in [*REFUSALS, *PASSES]}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_preflight_refuses_what_does_not_fit(refusals, case):
    assert REFUSALS[case][1] in refusals[case], refusals[case]


@pytest.mark.parametrize("case", list(PASSES))
def test_preflight_lets_through_what_fits(refusals, case):
    assert refusals[case] == "", refusals[case]


# ---- playbook syntax, both inventories -------------------------------------------------------------
@pytest.mark.parametrize("inventory", ["example", "lab"])
def test_site_syntax(tmp_path, inventory):
    inv = REPO / "inventory" / "example" if inventory == "example" else lab_inventory(tmp_path)
    env = {**os.environ, "ANSIBLE_CONFIG": str(PLAYBOOKS / "ansible.cfg")}
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), str(PLAYBOOKS / "site.yml"),
                           "--syntax-check"], capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr


def test_the_internal_slurm_role_refuses_to_run_alone(tmp_path):
    playbook = tmp_path / "alone.yml"
    playbook.write_text(yaml.safe_dump([{"name": "Alone", "hosts": "controller", "gather_facts": False,
                                         "roles": [{"role": "slurm_common"}]}]))
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(lab_inventory(tmp_path)), str(playbook),
                           *local_args()], capture_output=True, text=True, timeout=120, env=ansible_env(tmp_path),
                          cwd=REPO)
    assert proc.returncode != 0
    assert "the slurm_common role is internal: use slurm_controller or slurm_compute" in proc.stdout
