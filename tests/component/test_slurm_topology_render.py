"""The slurm roles' topology.conf rendered by Ansible from the real role (slurm_common, `tasks_from: render`, as
tests/component/test_slurm_render.py renders the other files) for the lab inventory: the file `opsctl ib
topology --output` left on the controller comes out byte for byte next to a slurm.conf that names its plugin,
tree on 22.05 and block on 24.11; the same run again changes nothing; a file of the other plugin stops the
run before anything is rendered, naming the line. How a change is applied (reconfigure, or a restart for a
new plugin) is in tests/unit/test_slurm_topology_role.py."""

import re

import pytest

from tests.component.test_slurm_render import LAB_FACTS, lab_inventory, read_conf, release_vars, run_render

TREE = ("# topology.conf for TopologyPlugin=topology/tree, written by `opsctl ib topology` from ibnetdiscover\n"
        "SwitchName=su1-leaf Nodes=gpu[1-2]\nSwitchName=su2-leaf Nodes=gpu3\n"
        "SwitchName=spine1 Switches=su1-leaf,su2-leaf\n")
BLOCK = ("# topology.conf for TopologyPlugin=topology/block, written by `opsctl ib topology` from ibnetdiscover\n"
         "BlockName=su1-leaf Nodes=gpu[1-2]\nBlockName=su2-leaf Nodes=gpu3\nBlockSizes=1\n")


def recap_changed(stdout: str) -> dict[str, int]:
    return {host: int(changed) for host, changed in re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", stdout, re.M)}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("topology")
    (tmp / "tree.conf").write_text(TREE)
    (tmp / "block.conf").write_text(BLOCK)
    return tmp


def renders(sources) -> dict[str, dict]:
    return {"tree-22.05": {"slurm_topology_plugin": "topology/tree",
                           "slurm_topology_source": str(sources / "tree.conf")},
            "block-24.11": {**release_vars("24.11"), "slurm_topology_plugin": "topology/block",
                            "slurm_topology_source": str(sources / "block.conf")}}


def test_the_controllers_file_is_rendered_beside_its_plugin_and_again_changes_nothing(sources, tmp_path):
    inventory = lab_inventory(tmp_path)
    first = run_render(inventory, tmp_path, renders(sources), LAB_FACTS)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    for name, plugin, text in (("tree-22.05", "topology/tree", TREE), ("block-24.11", "topology/block", BLOCK)):
        assert read_conf(tmp_path / name / "slurm.conf")["TopologyPlugin"] == plugin
        assert (tmp_path / name / "topology.conf").read_text() == text
    assert recap_changed(first.stdout)["head"] > 0
    again = run_render(inventory, tmp_path, renders(sources), LAB_FACTS)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert set(recap_changed(again.stdout).values()) == {0}, again.stdout[-2000:]


def test_a_file_of_the_other_plugin_stops_the_run_naming_its_line(sources, tmp_path):
    proc = run_render(lab_inventory(tmp_path), tmp_path, {"wrong": {
        "slurm_topology_plugin": "topology/tree", "slurm_topology_source": str(sources / "block.conf")}}, LAB_FACTS)
    assert proc.returncode != 0
    assert f"{sources / 'block.conf'} on head does not fit topology/tree: line 2: BlockName= is a topology/block key" \
        in proc.stdout
    assert not (tmp_path / "wrong").exists()
