"""Static checks of the provisioning roles: no machines needed.

- every role's meta/argument_specs.yml matches defaults/main.yml (keys, types and default values);
- every task and handler names its module by FQCN (or is a module of playbooks/library);
- slurm.conf and gres.conf rendered by the real role templates, for the production example (64 H200
  nodes) and the lab, pass `slurmd -G`, run under `unshare -m` with the GPU device files made;
  a broken line fails the same check;
- every key of the production cgroup.conf is documented in the installed cgroup.conf(5), and keys
  documented "Only for cgroup/v1" are refused by the role's preflight.
"""

import base64
import gzip
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = REPO / "playbooks"
ROLES = PLAYBOOKS / "roles"
CHECKER = ROLES / "slurm" / "files" / "opsctl-slurm-check"
BIN = Path(sys.executable).parent
CGROUP_MAN = Path("/usr/share/man/man5/cgroup.conf.5.gz")
ROLE_NAMES = sorted(p.name for p in ROLES.iterdir() if (p / "meta" / "argument_specs.yml").exists())


def load_yaml(path: Path):
    return yaml.safe_load(path.read_text())


# ---- argument specs ---------------------------------------------------------------------------
SPEC_TYPES = {"str": str, "int": int, "bool": bool, "list": list, "dict": dict}


def spec_problems(defaults: dict, spec: dict) -> list[str]:
    """What differs between a role's defaults and its `main` argument spec."""
    options = spec["argument_specs"]["main"]["options"]
    problems = []
    for key in sorted(set(defaults) ^ set(options)):
        where = "defaults/main.yml" if key in defaults else "argument_specs"
        problems.append(f"{key}: only in {where}")
    for key in sorted(set(defaults) & set(options)):
        option = options[key]
        if not option.get("description"):
            problems.append(f"{key}: no description")
        kind = option.get("type")
        if kind not in SPEC_TYPES:
            problems.append(f"{key}: type {kind!r} is not one of {sorted(SPEC_TYPES)}")
            continue
        if not isinstance(defaults[key], SPEC_TYPES[kind]) or (kind == "int" and isinstance(defaults[key], bool)):
            problems.append(f"{key}: default {defaults[key]!r} is not a {kind}")
        if kind == "list" and "elements" not in option:
            problems.append(f"{key}: list without elements")
        if option.get("default") != defaults[key]:
            problems.append(f"{key}: argument_specs default {option.get('default')!r} != defaults {defaults[key]!r}")
    return problems


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_argument_specs_match_defaults(role):
    defaults_file = ROLES / role / "defaults" / "main.yml"
    defaults = load_yaml(defaults_file) if defaults_file.exists() else {}
    assert spec_problems(defaults or {}, load_yaml(ROLES / role / "meta" / "argument_specs.yml")) == []


def test_every_role_has_defaults_and_argument_specs():
    roles = sorted(p.name for p in ROLES.iterdir() if p.is_dir())
    assert roles == ROLE_NAMES
    assert {"common", "nvidia", "hw_discovery", "munge", "slurm_controller", "slurm_compute", "dcgm_exporter",
            "node_exporter", "prometheus", "opsctl"} <= set(roles)


def test_spec_check_catches_drift():
    spec = {"argument_specs": {"main": {"options": {
        "a": {"description": "x", "type": "int", "default": 1},
        "b": {"description": "x", "type": "str", "default": "y"},
    }}}}
    problems = spec_problems({"a": 2, "c": True}, spec)
    assert "a: argument_specs default 1 != defaults 2" in problems
    assert "b: only in argument_specs" in problems
    assert "c: only in defaults/main.yml" in problems


# ---- FQCN -------------------------------------------------------------------------------------
def task_keywords() -> set[str]:
    from ansible.playbook.block import Block
    from ansible.playbook.task import Task

    return set(Task.fattributes) | set(Block.fattributes) | {"local_action", "action", "args", "block", "rescue",
                                                             "always", "listen", "notify", "vars"}


def iter_tasks(items):
    for item in items or []:
        if not isinstance(item, dict):
            continue
        if "block" in item:
            for part in ("block", "rescue", "always"):
                yield from iter_tasks(item.get(part))
        else:
            yield item


def module_of(task: dict, keywords: set[str]) -> str | None:
    candidates = [k for k in task if k not in keywords and not k.startswith("with_")]
    return candidates[0] if candidates else None


def non_fqcn(files) -> list[str]:
    keywords = task_keywords()
    local = {p.stem for p in (PLAYBOOKS / "library").glob("*.py")}
    bad = []
    for path in files:
        doc = load_yaml(path) or []
        tasks = []
        for entry in doc:
            if "hosts" in entry:  # a play
                for part in ("pre_tasks", "tasks", "post_tasks", "handlers"):
                    tasks.extend(iter_tasks(entry.get(part)))
            else:
                tasks.extend(iter_tasks([entry]))
        for task in tasks:
            module = module_of(task, keywords)
            if module is None or not (module.startswith("ansible.builtin.") or module in local):
                bad.append(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}: "
                           f"{task.get('name')!r} uses {module!r}")
    return bad


def ansible_task_files():
    files = [PLAYBOOKS / "site.yml"]
    for role in ROLES.iterdir():
        for sub in ("tasks", "handlers"):
            files.extend(sorted((role / sub).glob("*.yml")))
    return files


def test_every_module_is_fqcn():
    assert non_fqcn(ansible_task_files()) == []


def test_fqcn_check_catches_short_names(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("- name: Short\n  copy:\n    src: a\n    dest: b\n- name: Fine\n  ansible.builtin.copy:\n"
                   "    src: a\n    dest: b\n")
    assert non_fqcn([bad]) == [f"{bad}: 'Short' uses 'copy'"]


def test_restarts_only_in_handlers():
    """A task outside handlers/ never restarts or reloads a service (state: restarted/reloaded), except
    munge's key-driven restart, which the role documents (restart only when the key changed)."""
    offenders = []
    for role in ROLES.iterdir():
        for path in (role / "tasks").glob("*.yml"):
            for task in iter_tasks(load_yaml(path)):
                args = task.get("ansible.builtin.systemd_service") or task.get("ansible.builtin.service") or {}
                state = str(args.get("state", "")) if isinstance(args, dict) else ""
                if ("restarted" in state or "reloaded" in state) and role.name != "munge":
                    offenders.append(f"{path.relative_to(REPO)}: {task.get('name')}")
    assert offenders == []


# ---- filters and the hardware module -----------------------------------------------------------
def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hostlist_expression():
    hostlist = load_module(PLAYBOOKS / "filter_plugins" / "slurm_hostlist.py", "slurm_hostlist").hostlist_expression
    assert hostlist([f"gpu{i:03d}" for i in range(1, 65)]) == ["gpu[001-064]"]
    assert hostlist(["gpu1", "gpu2", "gpu3"]) == ["gpu[1-3]"]
    assert hostlist(["gpu001", "gpu002", "gpu010", "head"]) == ["gpu[001-002,010]", "head"]
    assert hostlist(["gpu7"]) == ["gpu7"]
    assert hostlist(["gpu9", "gpu10"]) == ["gpu9", "gpu10"]  # different widths never share a range


def test_hw_facts_parsers():
    hw = load_module(PLAYBOOKS / "library" / "opsctl_hw_facts.py", "opsctl_hw_facts")
    topo = "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n" \
           "GPU0\t X \tNV18\tPIX\t0-55,112-167\t0\t\tN/A\n" \
           "GPU1\tNV18\t X \tSYS\t56-111,168-223\t1\t\tN/A\n" \
           "NIC0\tPIX\tSYS\t X \t\t\t\t\n"
    assert hw.parse_topo_affinity(topo) == {0: "0-55,112-167", 1: "56-111,168-223"}
    assert hw.parse_cpu_list("0-3,8") == [0, 1, 2, 3, 8]
    assert hw.parse_cpu_list("N/A") == []
    assert hw.core_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


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
LAB_HOSTS = """all:
  children:
    cluster:
      children:
        controller:
          hosts:
            head: {ansible_host: 10.213.0.10}
        gpu_nodes:
          hosts:
            gpu1: {ansible_host: 10.213.0.11}
            gpu2: {ansible_host: 10.213.0.12}
            gpu3: {ansible_host: 10.213.0.13}
"""


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


def test_inventories_differ_only_in_variables():
    """Both inventories use the same groups, so site.yml runs the same tasks on each."""
    example = load_yaml(REPO / "inventory" / "example" / "hosts.yml")["all"]["children"]["cluster"]["children"]
    lab = yaml.safe_load(LAB_HOSTS)["all"]["children"]["cluster"]["children"]
    assert {"controller", "gpu_nodes"} <= set(example) and set(lab) <= set(example)
    for inv in ("example", "lab"):
        for path in (REPO / "inventory" / inv / "group_vars").glob("*.yml"):
            assert path.stem in {"all", "cluster", "controller", "gpu_nodes", "storage"}, path
