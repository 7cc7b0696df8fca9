"""The slurm roles' topology.conf (slurm_common: slurm_topology_plugin, slurm_topology_source), as Ansible
templates the role's own YAML (its defaults and vars, Ansible's filters and tests, in this process):

- TopologyPlugin reaches slurm.conf's keys only when a plugin is set, and a change of it restarts the daemons
  (a plugin: filter_plugins/slurm_conf_changes.py), while a change of topology.conf alone is reconfigured
  (topology.conf(5): re-read by `scontrol reconfigure`), through the handlers every slurm.conf change takes;
- the file `opsctl ib topology --output` writes fits its plugin and not the other one
  (filter_plugins/slurm_topology.py), and the role refuses a missing file, a file of the other plugin,
  topology/block before Slurm 24.05 and a TopologyPlugin in slurm_config, each with a message that says what
  to do;
- the file is read and checked before any Slurm file is written.
The role rendered for real, twice (the second run changes nothing): tests/component/test_slurm_topology_render.py.
"""

import base64
from pathlib import Path

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import filter_loader
from ansible.template import Templar, trust_as_template

from opsctl.topology.render import render_block, render_tree
from tests.unit.test_node_config_reaches_node import load
from tests.unit.test_roles_static import PLAYBOOKS, ROLES, load_module, load_yaml
from tests.unit.test_topology_lab import lab_fabric

ROLE = ROLES / "slurm_common"
TOPOLOGY = load_module(PLAYBOOKS / "filter_plugins" / "slurm_topology.py", "slurm_topology")
CHANGES = load_module(PLAYBOOKS / "filter_plugins" / "slurm_conf_changes.py", "slurm_conf_changes")
RESTART_KEYS = load_yaml(ROLE / "vars" / "main.yml")["_slurm_restart_keys"]
filter_loader.add_directory(str(PLAYBOOKS / "filter_plugins"))
NODES = [f"gpu{i:03d}" for i in range(1, 65)]
RELEASE = {"22.05": "22.05.8-4+deb12u3", "24.11": "24.11.5-4+deb13u1"}


@pytest.fixture(scope="module")
def written() -> dict[str, str]:
    """topology.conf of each plugin as `opsctl ib topology --output` writes it for the lab's fabric."""
    fabric = lab_fabric()
    return {"topology/tree": render_tree(fabric, "ibnetdiscover"),
            "topology/block": render_block(fabric, "ibnetdiscover")}


def templar(release: str = "22.05", **site) -> Templar:
    """slurm_common's variables on the controller: defaults, the site's, the role's vars."""
    variables = dict(load(ROLE / "defaults" / "main.yml"))
    variables |= site
    variables |= load(ROLE / "vars" / "main.yml")
    variables |= {"inventory_hostname": "head01", "groups": {"controller": ["head01"], "gpu_nodes": NODES},
                  "_slurm_platform": {"distribution_version": RELEASE[release]}, "hostvars": {}}
    return Templar(loader=DataLoader(), variables=variables)


def render(expression: str, release: str = "22.05", **site):
    return templar(release, **site).template(trust_as_template(expression))


def tasks(name: str) -> list[dict]:
    return load(ROLE / "tasks" / name)


def task(name: str, file: str) -> dict:
    return next(t for t in tasks(file) if t["name"] == name)


def refused(assertion: dict, release: str = "22.05", **site) -> str | None:
    """The assert's fail_msg when its conditions fail for these variables, else None."""
    that = assertion["ansible.builtin.assert"]["that"]
    conditions = that if isinstance(that, list) else [that]
    variables = {**site, **assertion.get("vars", {})}
    if all(render("{{ " + condition + " }}", release, **variables) for condition in conditions):
        return None
    return " ".join(render(assertion["ansible.builtin.assert"]["fail_msg"], release, **variables).split())


# ---- the file against its plugin ------------------------------------------------------------------------------
def test_each_file_opsctl_writes_fits_its_own_plugin_and_names_all_64_nodes(written):
    for plugin, text in written.items():
        assert TOPOLOGY.slurm_topology_problems(text, plugin) == [], plugin
        assert TOPOLOGY.slurm_topology_nodes(text) == NODES


def test_a_file_of_the_other_plugin_is_refused_naming_its_lines(written):
    problems = TOPOLOGY.slurm_topology_problems(written["topology/block"], "topology/tree")
    blocks = [n for n, line in enumerate(written["topology/block"].splitlines(), 1) if line.startswith("BlockName")]
    assert f"line {blocks[0]}: BlockName= is a topology/block key, not one of topology/tree (SwitchName, " \
           "Switches, Nodes, LinkSpeed)" in problems
    assert "no SwitchName= line: an empty topology for topology/tree" in problems
    assert any("Switches= is a topology/tree key" in p for p in
               TOPOLOGY.slurm_topology_problems(written["topology/tree"], "topology/block"))


@pytest.mark.parametrize(("text", "problem"), [
    ("# nothing yet\n", "no SwitchName= line: an empty topology for topology/tree"),
    ("SwitchName=s1 Nodes=\n", "line 1: Nodes= has no value"),
    ("Nodes=gpu001 SwitchName=s1\n", "line 1: starts with Nodes=, not SwitchName="),
    ("SwitchName=s1 Nodes=gpu001 Speed=100\n", "line 1: 'Speed' is not a topology/tree key (SwitchName, "
                                               "Switches, Nodes, LinkSpeed)"),
])
def test_what_slurmctld_would_refuse_is_named(text, problem):
    assert problem in TOPOLOGY.slurm_topology_problems(text, "topology/tree")


def test_keys_are_case_insensitive_and_comments_are_no_settings():
    text = "# written by hand\nswitchname=s1 nodes=gpu[001-002],gpu010 # leaf\n\nSWITCHNAME=s2 SWITCHES=s1\n"
    assert TOPOLOGY.slurm_topology_problems(text, "topology/tree") == []
    assert TOPOLOGY.slurm_topology_nodes(text) == ["gpu001", "gpu002", "gpu010"]
    assert TOPOLOGY.slurm_topology_problems("BlockSizes=32\nBlockName=b1 Nodes=gpu[001-032]\n", "topology/block") == []


# ---- slurm.conf and the handlers ---------------------------------------------------------------------------
def test_topology_plugin_reaches_slurm_conf_only_when_set():
    assert "TopologyPlugin" not in render("{{ _slurm_config }}")
    assert render("{{ _slurm_config }}", slurm_topology_plugin="topology/tree")["TopologyPlugin"] == "topology/tree"


INSTALLED = "ClusterName=lab\nSlurmctldHost=head\nSelectType=select/cons_tres\nNodeName=gpu[001-064] CPUs=8\n"


def test_a_plugin_change_restarts_and_a_topology_conf_change_is_reconfigured():
    with_plugin = INSTALLED + "TopologyPlugin=topology/block\n"
    assert CHANGES.slurm_conf_restart_reasons(INSTALLED, with_plugin, RESTART_KEYS) == ["TopologyPlugin changed"]
    assert CHANGES.slurm_conf_restart_reasons(with_plugin, with_plugin.replace("block", "tree"), RESTART_KEYS) == [
        "TopologyPlugin changed"]
    # topology.conf changed, nothing else: no reason, so the handlers reconfigure.
    decide = task("Decide between a restart and a reconfigure", "configure.yml")["ansible.builtin.set_fact"]
    unchanged, changed = {"changed": False}, {"changed": True}
    results = {"_slurm_common_cgroup_conf_file": unchanged, "_slurm_common_gres_conf_file": unchanged,
               "_slurm_common_conf_file": unchanged, "_slurm_common_topology_conf_file": changed,
               "_slurm_common_conf_installed": {"content": base64.b64encode(with_plugin.encode()).decode()}}
    reasons = render(decide["_slurm_common_restart_reasons"], **results)
    assert reasons == []
    assert render("{{ _slurm_common_restart }}", _slurm_common_restart_reasons=reasons) is False
    assert render("{{ _slurm_common_restart }}", _slurm_common_restart_reasons=["gres.conf changed"]) is True


def test_topology_conf_takes_the_path_of_every_slurm_conf_change():
    install = task("Install topology.conf", "configure.yml")
    assert install["notify"] == "slurm config changed"
    assert install["register"] == "_slurm_common_topology_conf_file"
    assert install["ansible.builtin.copy"]["dest"] == "{{ slurm_config_dir }}/topology.conf"
    handlers = load(ROLE / "handlers" / "main.yml")
    reconfigure = next(h for h in handlers if h["name"] == "Reconfigure Slurm")
    assert reconfigure["listen"] == "slurm config changed" and reconfigure["when"] == "not _slurm_common_restart"
    argv = render(reconfigure["ansible.builtin.command"]["argv"], ansible_check_mode=False)
    assert argv == ["scontrol", "reconfigure"]


def test_the_file_is_read_and_checked_before_any_slurm_file_is_written():
    names = [t["name"] for t in tasks("configure.yml")]
    first_write = names.index("Template cgroup.conf")
    assert names.index("Read and check the topology.conf of the topology plugin") < first_write
    assert names.index("Install topology.conf") < names.index("Template slurm.conf")
    reading = tasks("topology.yml")
    assert {next(k for k in t if k.startswith("ansible.")) for t in reading} == {
        "ansible.builtin.slurp", "ansible.builtin.assert", "ansible.builtin.debug"}
    for file in ("configure.yml", "render.yml"):
        imported = task("Read and check the topology.conf of the topology plugin", file)
        assert imported["when"] == "slurm_topology_plugin | length > 0"


# ---- refusals --------------------------------------------------------------------------------------------------
def preflight() -> dict:
    return task("Assert the topology plugin fits the Slurm release and comes with its file", "preflight.yml")


def test_the_preflight_takes_each_plugin_where_slurm_has_it():
    assert refused(preflight()) is None
    assert refused(preflight(), slurm_topology_plugin="topology/tree") is None
    assert refused(preflight(), "24.11", slurm_topology_plugin="topology/block") is None
    message = refused(preflight(), "22.05", slurm_topology_plugin="topology/block")
    assert message and "topology/block Slurm 24.05 or later (this is 22.05)" in message


@pytest.mark.parametrize("site", [
    {"slurm_topology_plugin": "topology/torus"},
    {"slurm_topology_plugin": "topology/tree", "slurm_config": {"TopologyPlugin": "topology/tree"}},
    {"slurm_config": {"TopologyPlugin": "topology/tree"}},
    {"slurm_topology_plugin": "topology/tree", "slurm_topology_source": "topology.conf"},
])
def test_the_preflight_refuses(site):
    message = refused(preflight(), **site)
    assert message and message.startswith("head01: slurm_topology_plugin")


def check() -> dict:
    return task("Assert the controller has a topology.conf for the topology plugin", "topology.yml")


def source(text: str) -> dict:
    return {"content": base64.b64encode(text.encode()).decode(), "encoding": "base64"}


def test_a_missing_file_names_the_command_that_writes_it():
    missing = {"failed": True, "msg": "file not found: /etc/opsctl/topology.conf"}
    message = refused(check(), "24.11", slurm_topology_plugin="topology/block", _slurm_common_topology_source=missing)
    assert message == ("slurm_topology_plugin is topology/block but head01 has no /etc/opsctl/topology.conf (file not "
                       "found: /etc/opsctl/topology.conf): run `opsctl ib topology --format block --output "
                       "/etc/opsctl/topology.conf` there first (docs/infiniband.md, \"Topology\")")


def test_a_file_of_the_other_plugin_stops_the_run(written):
    assert refused(check(), slurm_topology_plugin="topology/tree",
                   _slurm_common_topology_source=source(written["topology/tree"])) is None
    message = refused(check(), slurm_topology_plugin="topology/tree",
                      _slurm_common_topology_source=source(written["topology/block"]))
    assert message and message.startswith("/etc/opsctl/topology.conf on head01 does not fit topology/tree: line ")


def test_nodes_the_topology_leaves_out_are_named(written):
    say = task("Say which Slurm nodes the topology leaves out", "topology.yml")
    variables = {"slurm_topology_plugin": "topology/tree", **say["vars"]}
    assert render("{{ " + say["when"] + " }}", _slurm_common_topology_source=source(written["topology/tree"]),
                  **variables) is False
    short = written["topology/tree"].replace("gpu[033-064]", "gpu[033-062]")
    assert render("{{ " + say["when"] + " }}", _slurm_common_topology_source=source(short), **variables) is True
    message = " ".join(render(say["ansible.builtin.debug"]["msg"], _slurm_common_topology_source=source(short),
                              **variables).split())
    assert message.startswith("/etc/opsctl/topology.conf leaves out gpu[063-064]: run `opsctl ib topology --format "
                              "tree --output /etc/opsctl/topology.conf` on head01")


def test_the_inventories_leave_topology_plugin_to_the_role():
    for inventory in ("example", "lab"):
        for path in (Path(ROLES).parents[1] / "inventory" / inventory / "group_vars").glob("*.yml"):
            assert "TopologyPlugin" not in path.read_text(), path
