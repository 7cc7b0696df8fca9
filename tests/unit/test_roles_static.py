"""Static checks of the provisioning roles, read as files (no Ansible run, no machine):

- every role's meta/argument_specs.yml matches defaults/main.yml (keys, types and default values);
- every task and handler names its module by FQCN (or is a module of playbooks/library);
- services restart only in handlers;
- the hostlist filter and the hardware module's parsers;
- both inventories use the same groups;
- only the plays tagged `slurm` read slurm_config (so a `--tags slurm` run shows all it changes);
- the opsctl timer's service runs `opsctl health` with options the CLI has (--changes-only among them).
- site.yml's first play runs every role's preflight.yml, and a preflight file changes no host;
- a tagged run checks every role its tags reach.
Rendering the Slurm files and checking them with slurmd: tests/component/test_slurm_render.py.
"""

import functools
import importlib.util
import re
import sys
from pathlib import Path

import click
import pytest
import yaml
from ansible.playbook.block import Block
from ansible.playbook.task import Task

from opsctl.cli import main
from opsctl.slurm.hostlist import hostlist_expression

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = REPO / "playbooks"
ROLES = PLAYBOOKS / "roles"
ROLE_NAMES = sorted(p.name for p in ROLES.iterdir() if (p / "meta" / "argument_specs.yml").exists())


def load_yaml(path: Path):
    return yaml.safe_load(path.read_text())


# ---- argument specs ---------------------------------------------------------------------------
SPEC_TYPES = {"str": str, "int": int, "bool": bool, "list": list, "dict": dict}


def spec_problems(defaults: dict, spec: dict) -> list[str]:
    """What differs between a role's defaults and its `main` argument spec."""
    options = spec["argument_specs"]["main"]["options"]
    problems = []
    # A required option has no default by design (a secret such as a password): only in argument_specs.
    required = {k for k, o in options.items() if o.get("required") and "default" not in o}
    for key in sorted((set(defaults) ^ set(options)) - (required - set(defaults))):
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


def entry_point_drift(spec: dict) -> list[str]:
    """Options of an entry point other than main (tasks_from) that main also has, with another type, default,
    element type or requirement (a description may be shorter)."""
    entries = spec["argument_specs"]
    main_options = entries["main"]["options"]

    def kind(option: dict) -> dict:
        return {k: v for k, v in option.items() if k != "description"}

    return [f"{entry}: {key}" for entry, body in entries.items() if entry != "main"
            for key, option in (body.get("options") or {}).items()
            if key in main_options and kind(option) != kind(main_options[key])]


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_entry_points_spell_options_as_main_does(role):
    assert entry_point_drift(load_yaml(ROLES / role / "meta" / "argument_specs.yml")) == []


def test_entry_point_drift_is_caught():
    option = {"description": "x", "type": "int", "default": 1}
    spec = {"argument_specs": {"main": {"options": {"a": option, "c": option}},
                               "preflight": {"options": {"a": {**option, "default": 2}, "b": option,
                                                         "c": {**option, "description": "shorter"}}}}}
    assert entry_point_drift(spec) == ["preflight: a"]


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
    required = {"argument_specs": {"main": {"options": {"p": {"description": "x", "type": "str", "required": True}}}}}
    assert spec_problems({}, required) == []
    assert spec_problems({"p": "secret"}, required) == ["p: argument_specs default None != defaults 'secret'"]
    assert "c: only in defaults/main.yml" in problems


# ---- FQCN -------------------------------------------------------------------------------------
def task_keywords() -> set[str]:
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
    """A task outside handlers/ never restarts or reloads a service (state: restarted/reloaded)."""
    offenders = []
    for role in ROLES.iterdir():
        for path in (role / "tasks").glob("*.yml"):
            for task in iter_tasks(load_yaml(path)):
                args = task.get("ansible.builtin.systemd_service") or task.get("ansible.builtin.service") or {}
                state = str(args.get("state", "")) if isinstance(args, dict) else ""
                if "restarted" in state or "reloaded" in state:
                    offenders.append(f"{path.relative_to(REPO)}: {task.get('name')}")
    assert offenders == []


# ---- the opsctl timer's service ----------------------------------------------------------------
def test_the_timer_service_runs_health_with_options_that_exist_and_logs_changes_only():
    """The unit's ExecStart names `opsctl health` options that the CLI has, --changes-only among them, so
    the journal gets one summary line a run and the changes, not the table every minute."""
    unit = (ROLES / "opsctl" / "templates" / "opsctl-health.service.j2").read_text()
    starts = [line.split("/bin/opsctl ", 1)[1].split() for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert [command for command, *_ in starts] == ["health", "remediate"]  # the ladder after the health run
    for command, *args in starts:
        found = main.get_command(click.Context(main), command)
        assert found is not None and set(args) <= {opt for param in found.params for opt in param.opts}
    assert "--changes-only" in starts[0] and "--drain" in starts[0]
    assert "{% if opsctl_remediate_enabled %}" in unit.split(" remediate")[0]


# ---- filters and the hardware module -----------------------------------------------------------
def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hostlist_expression():
    plugin = load_module(PLAYBOOKS / "filter_plugins" / "slurm_hostlist.py", "slurm_hostlist")
    hostlist = plugin.FilterModule().filters()["hostlist_expression"]
    # One implementation for opsctl, the lab and the playbooks: the filter runs opsctl's own file.
    assert hostlist.__code__.co_filename == hostlist_expression.__code__.co_filename
    assert hostlist([f"gpu{i:03d}" for i in range(1, 65)]) == ["gpu[001-064]"]
    assert hostlist(["gpu1", "gpu2", "gpu3"]) == ["gpu[1-3]"]
    assert hostlist(["gpu001", "gpu002", "gpu010", "head"]) == ["gpu[001-002,010]", "head"]
    assert hostlist(["gpu7"]) == ["gpu7"]
    assert hostlist(["gpu9", "gpu10"]) == ["gpu9", "gpu10"]  # different widths never share a range
    assert hostlist(range(17001, 17065)) == ["[17001-17064]"]  # slurm.conf Port= ranges


def load_ansible_module(name: str):
    """A module of playbooks/library, with the files of playbooks/module_utils importable as
    ansible.module_utils.<name>, as AnsiballZ bundles them with the module."""
    for path in sorted((PLAYBOOKS / "module_utils").glob("*.py")):
        qualified = f"ansible.module_utils.{path.stem}"
        if qualified not in sys.modules:
            spec = importlib.util.spec_from_file_location(qualified, path)
            sys.modules[qualified] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(sys.modules[qualified])
    return load_module(PLAYBOOKS / "library" / f"{name}.py", name)


# Loaded at import: Ansible's module_utils ask ldconfig for libraries once, which a unit test may not run.
HW_FACTS = load_ansible_module("opsctl_hw_facts")


def test_hw_facts_reads_minor_numbers_of_the_real_capture():
    """`nvidia-smi -q` of a real H200 (tests/fixtures/SOURCES.md): one GPU, bus 00000000:83:00.0, minor 0."""
    text = (REPO / "tests" / "fixtures" / "gpu" / "nvidia-smi_q_and_query-gpu_csv_H200_1gpu.txt").read_text()
    assert HW_FACTS.parse_q_minors(text) == {"00000000:83:00.0": 0}
    two = "GPU 00000000:18:00.0\n    Minor Number              : 7\nGPU 00000000:2A:00.0\n    Minor Number   : 6\n"
    assert HW_FACTS.parse_q_minors(two) == {"00000000:18:00.0": 7, "00000000:2A:00.0": 6}
    assert HW_FACTS._bus_key("0000:18:00.0") == HW_FACTS._bus_key("00000000:18:00.0")


def test_hw_facts_parsers():
    hw = HW_FACTS
    topo = "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n" \
           "GPU0\t X \tNV18\tPIX\t0-55,112-167\t0\t\tN/A\n" \
           "GPU1\tNV18\t X \tSYS\t56-111,168-223\t1\t\tN/A\n" \
           "NIC0\tPIX\tSYS\t X \t\t\t\t\n"
    assert hw.parse_topo_affinity(topo) == {0: "0-55,112-167", 1: "56-111,168-223"}
    assert hw.parse_cpu_list("0-3,8") == [0, 1, 2, 3, 8]
    assert hw.parse_cpu_list("N/A") == []
    assert hw.core_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


# A lab inventory of the head and three GPU machines, for the component tests that render roles for it.
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


def lab_hosts() -> str:
    """The lab's inventory as `opsctl lab machines up` writes it (three GPU machines)."""
    from opsctl_lab.machines import inventory
    from opsctl_lab.machines.settings import Settings, machine_names

    settings = Settings(net=0, state_dir=Path("/nonexistent"), inventory_dir=Path("/nonexistent"),
                        apt_cache_dir=Path("/nonexistent"))
    return inventory.render(settings, machine_names(3))


def test_inventories_differ_only_in_variables():
    """Both inventories use the same groups, so site.yml runs the same tasks on each."""
    example = load_yaml(REPO / "inventory" / "example" / "hosts.yml")["all"]["children"]["cluster"]["children"]
    lab = yaml.safe_load(lab_hosts())["all"]["children"]["cluster"]["children"]
    assert {"controller", "gpu_nodes", "storage"} <= set(lab) and set(lab) <= set(example)
    for inv in ("example", "lab"):
        for path in (REPO / "inventory" / inv / "group_vars").glob("*.yml"):
            assert path.stem in {"all", "cluster", "controller", "gpu_nodes", "storage"}, path
    # The lab's second inventory source (vendor-repos.yml): repository URLs and keys only, each a variable
    # that a role documents in its defaults, so production sets the same ones to the vendors' own.
    from opsctl_lab.machines import vendor_server as serve
    from opsctl_lab.machines.settings import Settings
    from opsctl_lab.vendor_repos import build

    settings = Settings(net=0, state_dir=Path("/nonexistent"), inventory_dir=Path("/nonexistent"),
                        apt_cache_dir=Path("/nonexistent"))
    lab_vars = serve.vendor_vars(settings, build.Built(Path("/nonexistent"), "F" * 40))
    defaults = {key for path in ROLES.glob("*/defaults/main.yml") for key in (load_yaml(path) or {})}
    assert lab_vars and set(lab_vars) <= defaults, sorted(set(lab_vars) - defaults)
    repository = re.compile(r"_(repo|apt)_(url|key_url|key_fingerprint|repository)$")
    assert all(repository.search(name) for name in lab_vars), sorted(lab_vars)


def test_every_acting_opsctl_rollout_call_asks_again_while_another_opsctl_holds_the_lock():
    """opsctl's run lock never waits: the rollout's drain, reboot and resume on the head meet the health
    timer, and the reboots of one batch's nodes (one command per node) meet each other. Each asks again."""
    calls = []
    for path in sorted((ROLES / "nvidia" / "tasks").glob("*.yml")):
        for task in load_yaml(path) or []:
            command = task.get("ansible.builtin.command")
            argv = command.get("argv") if isinstance(command, dict) else None
            if isinstance(argv, list) and argv[1:2] == ["rollout"]:
                calls.append((path.name, argv[2], task))
    assert sorted(verb for _, verb, _ in calls) == ["drain", "reboot", "resume"], calls
    for name, verb, task in calls:
        assert "another acting opsctl holds" in task.get("until", "") and task.get("retries", 0) >= 5, (name, verb)


def test_the_holds_play_is_last_and_runs_with_every_tag():
    """apt drops the hold of a package it moves (--allow-change-held-packages): a tagged run that moves one
    (the driver's rollout, `--tags nvidia`) must end with the holds play too, or the new build stays unheld."""
    plays = load_yaml(PLAYBOOKS / "site.yml")
    assert plays[-1]["name"] == "Hold pinned packages" and plays[-1]["tags"] == ["always"], plays[-1]


def test_only_the_slurm_plays_read_slurm_config():
    """tests/integration/provision/test_provision_3_slurm.py changes one slurm_config setting in a
    `--tags slurm` run and asserts every file and handler that changes: that is the whole effect only
    while no role outside the slurm plays of site.yml reads slurm_config."""
    plays = load_yaml(PLAYBOOKS / "site.yml")
    slurm_roles = {role["role"] for play in plays if "slurm" in play.get("tags", []) for role in play.get("roles", [])}
    slurm_roles.add("slurm_common")  # the internal role the slurm_* roles import
    readers = {path.relative_to(ROLES).parts[0] for path in ROLES.rglob("*")
               if path.is_file() and "slurm_config" in path.read_text(errors="replace")}
    assert readers and readers <= slurm_roles, sorted(readers - slurm_roles)


# ---- preflight: every role's inventory checks, before any host changes -----------------------------
# What a preflight file may do: check, load variables, and run read-only commands on the control host.
# getent only reads the node's account database (nfs_client: the home of the account Ansible logs in as).
PREFLIGHT_MODULES = {"ansible.builtin.assert", "ansible.builtin.import_tasks", "ansible.builtin.include_vars",
                     "ansible.builtin.set_fact", "ansible.builtin.command", "ansible.builtin.getent"}


def preflight_problems(tasks_dir: Path, name: str = "preflight.yml") -> list[str]:
    """Tasks of tasks_dir/name (and the files it imports) that could change a host."""
    problems = []
    for task in load_yaml(tasks_dir / name) or []:
        module = next((k for k in task if k.startswith("ansible.")), "")
        if module not in PREFLIGHT_MODULES:
            problems.append(f"{name}: {task.get('name')}: {module or 'no module'}")
        elif module == "ansible.builtin.import_tasks":
            problems += preflight_problems(tasks_dir, task[module])
        elif module == "ansible.builtin.command" and not (
                task.get("delegate_to") == "localhost" and task.get("changed_when") is False):
            problems.append(f"{name}: {task.get('name')}: a command not on the control host, or not read-only")
    return problems


def test_the_preflight_play_runs_every_roles_preflight_first():
    """site.yml's first play only reaches the hosts (an unreachable one is left out of the run, not fatal to
    it); the second stops every host on one's failure, gathers facts and checks the platform in every run,
    and includes tasks/preflight.yml of every role that has one; no role names its checks otherwise
    (validate.yml); and a preflight file changes no host."""
    plays = load_yaml(PLAYBOOKS / "site.yml")
    reach, first = plays[0], plays[1]
    assert reach["name"] == "Reachability" and reach["tags"] == ["always"] and "any_errors_fatal" not in reach
    assert [next(k for k in task if k.startswith("ansible.")) for task in reach["tasks"]] == ["ansible.builtin.ping"]
    assert first["name"] == "Preflight" and first["any_errors_fatal"] is True
    assert [task["tags"] for task in first["tasks"][:2]] == [["always"], ["always"]]
    assert first["tasks"][1]["ansible.builtin.include_role"]["name"] == "common"
    included = {task["ansible.builtin.include_role"]["name"] for task in first["tasks"]
                if task.get("ansible.builtin.include_role", {}).get("tasks_from") == "preflight"}
    with_preflight = {path.parents[1].name for path in ROLES.glob("*/tasks/preflight.yml")}
    assert {"nfs_client", "lustre_client", "grafana", "alertmanager", "opsctl", "slurm_common"} <= with_preflight
    assert included == with_preflight
    assert not sorted(ROLES.glob("*/tasks/validate.yml"))
    for role in sorted(with_preflight):
        assert preflight_problems(ROLES / role / "tasks") == [], role


def all_tags(node) -> set[str]:
    """Every tag anywhere in a task file's YAML: on tasks, blocks and include `apply`s."""
    if isinstance(node, list):
        return set().union(*map(all_tags, node))
    if not isinstance(node, dict):
        return set()
    tags = node.get("tags", [])
    return set([tags] if isinstance(tags, str) else tags).union(*map(all_tags, node.values()))


@functools.cache  # the role files are read once per test session, not once per role and play
def role_tags(role: str) -> frozenset[str]:
    """The tags in the tasks of a role (`always` aside)."""
    return frozenset(set().union(*(all_tags(load_yaml(path)) for path in (ROLES / role / "tasks").glob("*.yml")))
                     - {"always"})


@functools.cache
def roles_included_by(role: str) -> frozenset[str]:
    tasks = [task for path in (ROLES / role / "tasks").glob("*.yml") for task in iter_tasks(load_yaml(path) or [])]
    keys = ("ansible.builtin.include_role", "ansible.builtin.import_role")
    return frozenset(task[key]["name"] for task in tasks for key in keys if key in task)


def tags_that_reach(role: str, plays: list[dict]) -> set[str]:
    """Every tag under which a task of `role` can run: the tags of the plays that run it, or run a role that
    includes it (at any depth), and the tags inside all those roles."""
    reaching = {role}
    while True:
        more = {name for name in ROLE_NAMES if roles_included_by(name) & reaching} - reaching
        if not more:
            break
        reaching |= more
    tags = set().union(*(role_tags(name) for name in reaching))
    for play in plays:
        includes = [task["ansible.builtin.include_role"] for task in play.get("tasks", [])
                    if "ansible.builtin.include_role" in task]
        in_play = {entry["role"] for entry in play.get("roles", [])} | {
            include["name"] for include in includes if include.get("tasks_from") != "preflight"}
        if in_play & reaching:
            tags |= set(play.get("tags", [])) - {"always"}
    return tags


def test_a_tagged_run_checks_every_role_its_tags_reach():
    """The preflight play checks a role in a tagged run when the run's tags reach one of that role's tasks (the
    play that runs it, a role that includes it, a tag inside them): its include carries exactly those tags, and
    applies them to the tasks it brings in. Only the platform check (common) runs in every run."""
    plays = load_yaml(PLAYBOOKS / "site.yml")
    checks = {task["ansible.builtin.include_role"]["name"]: task for task in plays[1]["tasks"]
              if task.get("ansible.builtin.include_role", {}).get("tasks_from") == "preflight"}
    assert checks["common"]["tags"] == ["always"]
    for role, task in sorted(checks.items()):
        assert task["ansible.builtin.include_role"]["apply"]["tags"] == task["tags"], role
        if role != "common":
            assert sorted(task["tags"]) == sorted(tags_that_reach(role, plays)), role
    assert {"ib_precheck", "prometheus_configure", "grafana"} <= tags_that_reach("opsctl", plays)


def test_a_role_skips_the_checks_the_preflight_play_ran():
    """A role runs its preflight.yml again in its own play only where site.yml's preflight play did not (the
    role alone): preflight.yml ends by remembering it passed, and the role's include of it is conditional on
    that. Checks that load or register what the role's tasks use carry every tag that reaches the role."""
    plays = load_yaml(PLAYBOOKS / "site.yml")
    with_main_include = 0
    for path in sorted(ROLES.glob("*/tasks/preflight.yml")):
        role = path.parents[1].name
        flag = f"_{role}_preflight_passed"
        includes = [task for task in iter_tasks(load_yaml(ROLES / role / "tasks" / "main.yml") or [])
                    if (task.get("ansible.builtin.include_tasks") or {}).get("file") == "preflight.yml"]
        if role == "opsctl":  # its checks run on the control host, in the preflight play only
            assert includes == [], role
            continue
        assert (load_yaml(path) or [])[-1].get("ansible.builtin.set_fact") == {flag: True}, role
        assert len(includes) == 1 and includes[0]["when"] == f"not ({flag} | default(false))", role
        include = includes[0]
        assert include["ansible.builtin.include_tasks"]["apply"]["tags"] == include.get("tags", ["always"]), role
        assert set(include.get("tags", [])) <= tags_that_reach(role, plays), role
        if role in ("nvidia", "lustre_client", "nfs_client", "nfs_server"):  # what they load, the role's tasks use
            assert sorted(include["tags"]) == sorted(tags_that_reach(role, plays)), role
        with_main_include += 1
    assert with_main_include == 8
    assert {"slurm_configure", "hw_quarantine", "slurm_controller"} <= tags_that_reach("slurm_common", plays)


def test_preflight_problems_names_a_task_that_changes_a_host(tmp_path):
    (tmp_path / "preflight.yml").write_text(yaml.safe_dump([
        {"name": "Check", "ansible.builtin.assert": {"that": True}},
        {"name": "More", "ansible.builtin.import_tasks": "more.yml"}]))
    (tmp_path / "more.yml").write_text(yaml.safe_dump([
        {"name": "Write", "ansible.builtin.copy": {"content": "x", "dest": "/x"}},
        {"name": "Run", "ansible.builtin.command": "true", "changed_when": False}]))
    assert preflight_problems(tmp_path) == [
        "more.yml: Write: ansible.builtin.copy",
        "more.yml: Run: a command not on the control host, or not read-only"]


# ---- the nvidia role's persistence daemon -------------------------------------------------------
def test_the_persistence_drop_in_runs_the_packaged_command_without_no_persistence_mode():
    """Each platform's drop-in command is the packaged unit's (quoted in the vars file's comment) less
    --no-persistence-mode, and a changed drop-in restarts the daemon through a handler."""
    nvidia = ROLES / "nvidia"
    platforms = {}
    for path in sorted((nvidia / "vars").glob("*.yml")):
        command = ((load_yaml(path) or {}).get("_nvidia_platform") or {}).get("persistenced_exec_start")
        if command:
            text = path.read_text().replace("\n  # ", " ")
            start = text.index('"/usr/bin/nvidia-persistenced ') + 1
            platforms[path.stem] = (text[start:text.index('"', start)].split(), command.split())
    assert set(platforms) == {"ubuntu-22.04", "ubuntu-24.04"}
    for name, (packaged, command) in platforms.items():
        assert "--no-persistence-mode" in packaged, name
        assert command == [arg for arg in packaged if arg != "--no-persistence-mode"], name
    template = (nvidia / "templates" / "nvidia-persistenced-persistence-mode.conf.j2").read_text()
    assert "[Service]\nExecStart=\nExecStart={{ _nvidia_platform.persistenced_exec_start }}\n" in template
    notified = {t["notify"] for t in iter_tasks(load_yaml(nvidia / "tasks" / "persistence.yml")) if "notify" in t}
    restarts = [h["ansible.builtin.systemd_service"] for h in load_yaml(nvidia / "handlers" / "main.yml")
                if h.get("listen") in notified and "ansible.builtin.systemd_service" in h]
    assert restarts == [{"name": "nvidia-persistenced", "state": "restarted", "daemon_reload": True}]


def test_facts_are_gathered_again_right_after_the_driver_reboot():
    """The fact cache keeps the pre-reboot kernel; lustre_client names its prebuilt modules package after
    ansible_facts.kernel, so the reboot handler is followed at once by a fresh gathering, under the
    same conditions."""
    handlers = load_yaml(ROLES / "nvidia" / "handlers" / "main.yml")
    names = [h["name"] for h in handlers]
    reboot = names.index("Reboot for the NVIDIA driver")
    gather = handlers[reboot + 1]
    assert "ansible.builtin.setup" in gather and gather["listen"] == handlers[reboot]["listen"]
    assert gather["when"] == handlers[reboot]["when"]
    # The rollout's reboot through Slurm (a handler of its own) ends with the same gathering.
    through_slurm = load_yaml(ROLES / "nvidia" / "tasks" / "reboot_through_slurm.yml")
    assert "ansible.builtin.setup" in through_slurm[-1]
    assert any(h.get("ansible.builtin.include_tasks") == "reboot_through_slurm.yml" for h in handlers)
    assert "kernel" in str(load_yaml(ROLES / "lustre_client" / "vars" / "main.yml")["_lustre_client_packages"])
