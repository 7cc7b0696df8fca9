"""The Slurm role's files, rendered by Ansible from the real role templates for the production example
(64 H200 nodes) and the lab, checked by Slurm's own parser (`slurmd -G`, under `unshare -m` with the GPU
device files made), and every key of the production cgroup.conf against the installed cgroup.conf(5).
Also: the playbook's syntax with both inventories, and the internal slurm role's guard.
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

CHECKER = ROLES / "slurm" / "files" / "opsctl-slurm-check"
BIN = Path(sys.executable).parent
CGROUP_MAN = Path("/usr/share/man/man5/cgroup.conf.5.gz")


# ---- rendering with the real role templates ------------------------------------------------------
H200_FACTS = {
    "gpu_count": 8,
    "gpu_model": "NVIDIA H200",
    "gpus": [{"index": i, "name": "NVIDIA H200", "pci_bus_id": f"00000000:{bus}:00.0",
              "cores": "0-55" if i < 4 else "56-111"}
             for i, bus in enumerate(["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"])],
    "hcas": [], "nvme": [], "memory_mb": 2063000, "cpus": 224, "sockets": 2, "cores_per_socket": 56,
    "threads_per_core": 2,
}
LAB_FACTS = {**H200_FACTS, "gpus": [{**g, "cores": ""} for g in H200_FACTS["gpus"]], "memory_mb": 24105,
             "cpus": 2, "sockets": 1, "cores_per_socket": 2, "threads_per_core": 1}


def render_playbook(out: Path, facts: dict) -> str:
    return yaml.safe_dump([
        {"name": "Hardware facts as hw_discovery reports them", "hosts": "controller:gpu_nodes",
         "gather_facts": False,
         "tasks": [{"name": "Set facts", "ansible.builtin.set_fact": {"opsctl_hw": facts}}]},
        {"name": "Render the Slurm files", "hosts": "controller", "gather_facts": False,
         "tasks": [{"name": "Render", "ansible.builtin.include_role": {"name": "slurm", "tasks_from": "render"},
                    "vars": {"slurm_render_dir": str(out)}}]},
    ], sort_keys=False)


def run_render(inventory: Path, out: Path, facts: dict, extra: dict | None = None) -> subprocess.CompletedProcess:
    playbook = out.parent / f"render-{out.name}.yml"
    playbook.write_text(render_playbook(out, facts))
    env = {**os.environ, "ANSIBLE_CONFIG": str(PLAYBOOKS / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROLES),
           "ANSIBLE_FILTER_PLUGINS": str(PLAYBOOKS / "filter_plugins"), "ANSIBLE_NOCOLOR": "1"}
    extra_args = ["-e", "ansible_become=false", "-e", "ansible_connection=local"]
    if extra:
        extra_args += ["-e", yaml.safe_dump(extra, default_flow_style=True).strip()]
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(playbook), *extra_args],
                          capture_output=True, text=True, timeout=300, env=env, cwd=REPO)


def lab_inventory(tmp: Path) -> Path:
    """inventory/lab/ as the lab writes it: the committed group_vars plus a hosts.yml like the lab's."""
    inv = tmp / "lab-inventory"
    shutil.copytree(REPO / "inventory" / "lab" / "group_vars", inv / "group_vars")
    (inv / "hosts.yml").write_text(LAB_HOSTS)
    return inv


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("render")
    out = {}
    for name, inventory, facts in (("production", REPO / "inventory" / "example", H200_FACTS),
                                   ("lab", lab_inventory(tmp), LAB_FACTS)):
        proc = run_render(inventory, tmp / name, facts)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        out[name] = tmp / name
    return out


def read_conf(path: Path) -> dict:
    keys = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            key, _, value = line.partition("=")
            keys[key] = value
    return keys


def test_production_render_has_required_settings(rendered):
    conf = read_conf(rendered["production"] / "slurm.conf")
    assert conf["ProctrackType"] == "proctrack/cgroup"
    assert conf["TaskPlugin"] == "task/cgroup,task/affinity"
    assert conf["PrologFlags"] == "Contain"
    assert conf["PropagateResourceLimitsExcept"] == "MEMLOCK"
    text = (rendered["production"] / "slurm.conf").read_text()
    assert ("NodeName=gpu[001-064] CoresPerSocket=56 RealMemory=1959850 Sockets=2 ThreadsPerCore=2 "
            "Gres=gpu:h200:8 State=UNKNOWN") in text
    gres = (rendered["production"] / "gres.conf").read_text()
    for index in range(8):
        cores = "0-55" if index < 4 else "56-111"
        assert f"NodeName=gpu[001-064] Name=gpu Type=h200 File=/dev/nvidia{index} Cores={cores}\n" in gres
    assert read_conf(rendered["production"] / "cgroup.conf")["CgroupPlugin"] == "cgroup/v2"


def test_lab_render_differs_only_where_the_lab_says(rendered):
    prod, lab = read_conf(rendered["production"] / "slurm.conf"), read_conf(rendered["lab"] / "slurm.conf")
    lab_vars = load_yaml(REPO / "inventory" / "lab" / "group_vars" / "all.yml")
    changed = {k for k in prod.keys() | lab.keys() if prod.get(k) != lab.get(k)}
    assert changed - {"ClusterName", "SlurmctldHost", "NodeName", "PartitionName"} == set(lab_vars["slurm_config"])
    assert read_conf(rendered["lab"] / "cgroup.conf")["CgroupPlugin"] == "cgroup/v1"


def host_is_cgroup_v2_only() -> bool:
    return not Path("/sys/fs/cgroup/unified").exists() and Path("/sys/fs/cgroup/cgroup.controllers").exists()


needs_slurmd = pytest.mark.skipif(shutil.which("slurmd") is None or shutil.which("unshare") is None
                                  or os.geteuid() != 0, reason="needs slurmd, unshare and root")


def slurmd_check(directory: Path, nodes: list[str], cgroup: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(CHECKER), str(directory / "slurm.conf"), str(directory / "gres.conf"),
                           str(cgroup or directory / "cgroup.conf"), *nodes],
                          capture_output=True, text=True, timeout=120)


def parse_cgroup_for_this_host(directory: Path, tmp: Path) -> Path:
    """The cgroup.conf to parse here. slurmd's cgroup/v2 plugin refuses a hybrid v1/v2 host ("Hybrid mode
    is not supported"), so on such a host the production file is parsed with CgroupPlugin=cgroup/v1;
    its keys are checked against cgroup.conf(5) by test_production_cgroup_keys_are_documented."""
    source = directory / "cgroup.conf"
    if host_is_cgroup_v2_only():
        return source
    target = tmp / f"{directory.name}-cgroup.conf"
    target.write_text(source.read_text().replace("CgroupPlugin=cgroup/v2", "CgroupPlugin=cgroup/v1"))
    return target


@needs_slurmd
@pytest.mark.parametrize("name,nodes", [("production", ["gpu001", "gpu064"]), ("lab", ["gpu1", "gpu3"])])
def test_rendered_slurm_files_pass_slurmd(rendered, tmp_path, name, nodes):
    proc = slurmd_check(rendered[name], nodes, parse_cgroup_for_this_host(rendered[name], tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]


@needs_slurmd
@pytest.mark.parametrize("target,line", [
    ("slurm.conf", "NodeName=gpu001 Bogus=1"),
    ("slurm.conf", "SelectType=select/nonexistent"),
    ("gres.conf", "NodeName=gpu001 Name=gpu Type=h200 Fiel=/dev/nvidia0"),
    ("cgroup.conf", "ConstrainKernelMemory=yes"),
])
def test_broken_line_fails_slurmd(rendered, tmp_path, target, line):
    broken = tmp_path / "broken"
    shutil.copytree(rendered["lab"], broken)
    with open(broken / target, "a") as handle:
        handle.write(line + "\n")
    proc = slurmd_check(broken, ["gpu1"])
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


# ---- cgroup.conf against the installed man page -------------------------------------------------
def cgroup_man_keys() -> tuple[set[str], set[str], set[str]]:
    """(documented keys, keys "Only for cgroup/v1", keys "Only for cgroup/v2") of cgroup.conf(5)."""
    text = gzip.decompress(CGROUP_MAN.read_bytes()).decode(errors="replace")
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


def cgroup_problems(conf: dict, plugin: str) -> list[str]:
    keys, v1_only, v2_only = cgroup_man_keys()
    problems = [f"{k}: not in cgroup.conf(5)" for k in conf if k not in keys]
    wrong = v1_only if plugin == "cgroup/v2" else v2_only
    problems += [f"{k}: documented for the other cgroup version" for k in conf if k in wrong]
    return problems


needs_man = pytest.mark.skipif(not CGROUP_MAN.exists(), reason="cgroup.conf(5) not installed (slurm-client)")


@needs_man
def test_man_page_parse_finds_version_specific_keys():
    keys, v1_only, v2_only = cgroup_man_keys()
    assert {"CgroupPlugin", "ConstrainCores", "ConstrainDevices", "ConstrainRAMSpace", "AllowedSwapSpace"} <= keys
    assert {"MemorySwappiness", "ConstrainKmemSpace", "AllowedKmemSpace", "MaxKmemPercent", "MinKmemSpace"} <= v1_only
    assert {"IgnoreSystemd"} <= v2_only


@needs_man
def test_production_cgroup_keys_are_documented(rendered):
    conf = read_conf(rendered["production"] / "cgroup.conf")
    assert conf["CgroupPlugin"] == "cgroup/v2"
    assert cgroup_problems(conf, "cgroup/v2") == []


@needs_man
def test_cgroup_key_check_rejects_v1_only_and_unknown_keys():
    conf = {"CgroupPlugin": "cgroup/v2", "MemorySwappiness": "10", "ConstrainKernelMemory": "yes"}
    assert cgroup_problems(conf, "cgroup/v2") == ["ConstrainKernelMemory: not in cgroup.conf(5)",
                                                  "MemorySwappiness: documented for the other cgroup version"]


@needs_man
def test_role_lists_the_man_pages_version_specific_keys():
    """The role's preflight lists must be exactly what the installed man page documents."""
    _keys, v1_only, v2_only = cgroup_man_keys()
    role_vars = load_yaml(ROLES / "slurm" / "vars" / "main.yml")
    assert set(role_vars["_slurm_cgroup_v1_only_keys"]) == v1_only
    assert set(role_vars["_slurm_cgroup_v2_only_keys"]) == v2_only


def test_role_refuses_v1_only_key_with_cgroup_v2(tmp_path):
    proc = run_render(REPO / "inventory" / "example", tmp_path / "v1key", H200_FACTS,
                      extra={"slurm_cgroup_config": {"MemorySwappiness": 10}})
    assert proc.returncode != 0
    assert "CgroupPlugin=cgroup/v2 does not take MemorySwappiness" in proc.stdout


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
                                         "roles": [{"role": "slurm"}]}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(PLAYBOOKS / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROLES),
           "ANSIBLE_NOCOLOR": "1"}
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(lab_inventory(tmp_path)), str(playbook),
                           "-e", "ansible_connection=local", "-e", "ansible_become=false"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert proc.returncode != 0
    assert "the slurm role is internal: use slurm_controller or slurm_compute" in proc.stdout
