"""`opsctl ib topology` through the CLI with a FakeSlurm over the lab contract's fabric (tests/unit/
test_topology_fabric.py's RailFabric, in ibnetdiscover's exact format): topology.conf written and the fabric
accepted, then --check after each lab fault: recable-rail and recable-leaf drain the node (opsctl:ib-cabling),
uplink-down is a warning only; the design file, the breaker, ownership, dry runs and the live ibnetdiscover
runs per rail."""

import json
import subprocess

import pytest
from click.testing import CliRunner

from opsctl.cli import main
from opsctl.clients import Clients
from opsctl.config import parse_config
from opsctl.errors import SourceUnavailable
from opsctl.topology.run import topology
from tests.unit.fakes import FakeSlurm, gpu_nodes, node
from tests.unit.test_topology_fabric import NODES, RailFabric


class Site:
    def __init__(self, tmp_path, slurm=None):
        self.tmp = tmp_path
        self.config = parse_config({}, "t", env={"OPSCTL_STATE_DIR": str(tmp_path / "state"),
                                                 "OPSCTL_AUDIT_LOG": str(tmp_path / "audit.jsonl")})
        self.slurm = slurm or FakeSlurm(gpu_nodes(64))
        self.lab = RailFabric()
        self.conf = tmp_path / "topology.conf"

    def write(self, lab=None):
        directory = self.tmp / "ibnetdiscover"
        directory.mkdir(exist_ok=True)
        for hca, text in (lab or self.lab).outputs().items():
            (directory / f"{hca}.txt").write_text(text)
        return str(directory)

    def run(self, *args):
        result = CliRunner().invoke(main, ["ib", "topology", "--input", self.write(), *args],
                                    obj=Clients(config=self.config, slurm=self.slurm))
        self.output = result.output
        return result.exit_code

    def accept(self):
        assert self.run("--output", str(self.conf)) == 0, self.output

    def check(self, *args):
        code = self.run("--check", "--json", *args)
        return code, json.loads(self.output)

    def audit(self):
        path = self.config.audit_log
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def site(tmp_path):
    return Site(tmp_path)


def test_output_writes_topology_conf_with_every_node_and_accepts_the_fabric(site):
    site.accept()
    lines = site.conf.read_text().splitlines()
    assert [line for line in lines if not line.startswith("#")] == [
        "SwitchName=su1-leaf Nodes=gpu[001-032]", "SwitchName=su2-leaf Nodes=gpu[033-064]",
        "SwitchName=spine1 Switches=su1-leaf,su2-leaf"]
    record = json.loads((site.tmp / "state" / "fabric.json").read_text())
    assert len(record["hcas"]) == 512 and record["output"] == str(site.conf)
    assert "wrote" in site.output and "accepted" in site.output


def test_block_format_and_stdout_without_output(site):
    assert site.run("--format", "block") == 0
    assert "BlockName=su1-leaf Nodes=gpu[001-032]" in site.output and "BlockSizes=32,64" in site.output
    assert not (site.tmp / "state" / "fabric.json").exists()


def test_no_change_after_accepting_exits_0(site):
    site.accept()
    code, doc = site.check()
    assert (code, doc["drift"], doc["done"]) == (0, [], [])
    assert doc["baseline"].startswith("the fabric accepted ")


def test_recable_rail_drains_the_node_and_names_node_and_rail(site):
    site.accept()
    site.lab.recable_rail("gpu010", 3)
    code = site.run("--check")
    assert code == 1
    assert ("drain cross-rail: gpu010 mlx5_3 (rail 3) is on rail4-su1-leaf port 65, was rail3-su1-leaf port 10: "
            "a leaf of rail 4 (mlx5_4), not of rail 3 (mlx5_3)") in site.output
    reason = site.slurm.nodes()["gpu010"].reason
    assert reason == "opsctl:ib-cabling mlx5_3 cross-rail rail4-su1-leaf"
    assert [c[:2] for c in site.slurm.calls] == [("drain", ("gpu010",))]
    assert [(r["event"], r["node"], r["checks"]) for r in site.audit()] == [("drain", "gpu010", ["ib-cabling"])]


def test_recable_rail_in_json(site):
    site.accept()
    site.lab.recable_rail("gpu010", 3)
    code, doc = site.check()
    assert code == 1
    assert [(d["kind"], d["node"], d["hca"], d["rail"], d["action"]) for d in doc["drift"]] == [
        ("cross-rail", "gpu010", "mlx5_3", "rail 3", "drain")]
    assert doc["drained"] == ["gpu010"] and doc["done"] == [
        "drain gpu010: opsctl:ib-cabling mlx5_3 cross-rail rail4-su1-leaf"]


def test_recable_leaf_drains_the_node_that_left_its_leaf_group(site):
    site.accept()
    site.lab.recable_leaf("gpu010", 3)
    code, doc = site.check()
    assert code == 1
    assert [(d["kind"], d["node"], d["hca"], d["switch"]) for d in doc["drift"]] == [
        ("left-leaf-group", "gpu010", "mlx5_3", "rail3-su2-leaf")]
    assert site.slurm.nodes()["gpu010"].reason == "opsctl:ib-cabling mlx5_3 left-leaf-group rail3-su2-leaf"


def test_uplink_down_is_a_warning_only(site):
    site.accept()
    site.lab.uplink_down("rail2-su1-leaf")
    code, doc = site.check()
    assert code == 1
    assert [(d["kind"], d["switch"], d["action"]) for d in doc["drift"]] == [
        ("fewer-uplinks", "rail2-su1-leaf", "warn")]
    assert "31 up-links, was 32" in doc["drift"][0]["detail"]
    assert site.slurm.calls == [] and doc["done"] == []


def test_without_an_accepted_fabric_the_live_fabric_still_shows_a_cross_cabled_hca(site):
    site.lab.recable_rail("gpu010", 3)
    code, doc = site.check()
    assert code == 1 and doc["baseline"] == "" and "no accepted fabric" in doc["warnings"][0]
    assert [d["kind"] for d in doc["drift"]] == ["cross-rail"]


def test_a_design_file_instead_of_the_accepted_fabric(site, tmp_path):
    assert site.run("--json") == 0
    design = tmp_path / "design.json"
    design.write_text(json.dumps(json.loads(site.output)["fabric"]))
    site.lab.uplink_down("rail5-su2-leaf")
    code, doc = site.check("--design", str(design))
    assert code == 1 and doc["baseline"] == f"the design {design}"
    assert [d["kind"] for d in doc["drift"]] == ["fewer-uplinks"]


def test_a_design_as_ibnetdiscover_output(site, tmp_path):
    design = tmp_path / "design"
    design.mkdir()
    for hca, text in RailFabric().outputs().items():
        (design / f"{hca}.txt").write_text(text)
    site.lab.recable_leaf("gpu040", 6)
    code, doc = site.check("--design", str(design))
    assert code == 1 and [(d["kind"], d["node"]) for d in doc["drift"]] == [("left-leaf-group", "gpu040")]


def test_a_missing_link_and_a_moved_port_are_warnings(site):
    site.accept()
    leaf = next(s for s in site.lab.switches.values() if s.name == "rail1-su1-leaf")
    guid = leaf.ports.pop(5)[0]  # gpu005 mlx5_1: its cable gone
    site.lab.hca_port.pop(guid)
    site.lab.plug("gpu006", 1, leaf.guid, 65)  # gpu006 mlx5_1: another port of its own leaf
    code, doc = site.check()
    assert code == 1 and site.slurm.calls == []
    assert [(d["kind"], d["node"], d["action"]) for d in doc["drift"]] == [
        ("missing-link", "gpu005", "warn"), ("moved-port", "gpu006", "warn")]


def test_a_persons_drain_is_never_touched(tmp_path):
    site = Site(tmp_path, FakeSlurm(gpu_nodes(64, gpu010=node("gpu010", flags=("DRAIN",), reason="ticket-7 psu"))))
    site.accept()
    site.lab.recable_rail("gpu010", 3)
    code, doc = site.check()
    assert code == 1 and site.slurm.calls == []
    assert doc["refused"]["gpu010"].startswith("not-owned")


def test_dry_run_says_what_it_would_drain(site):
    site.accept()
    site.lab.recable_rail("gpu010", 3)
    code, doc = site.check("--dry-run")
    assert code == 1 and site.slurm.calls == []
    assert doc["would"] == ["drain gpu010: opsctl:ib-cabling mlx5_3 cross-rail rail4-su1-leaf"]


def test_many_nodes_drifting_at_once_drain_none(site):
    site.accept()
    for name in NODES[:20]:
        site.lab.swap_rails(name, 0, 1)
    code, doc = site.check()
    assert code == 4 and site.slurm.calls == []
    assert "circuit breaker: 20 of 64" in doc["stop"]


def test_usage_errors(site):
    assert site.run("--output", str(site.conf), "--check") == 2
    assert site.run("--output", str(site.conf), "--format", "both") == 2
    assert site.run("--dry-run") == 2


def test_a_rail_without_its_file_is_unreadable(site, tmp_path):
    directory = site.write()
    (tmp_path / "ibnetdiscover" / "mlx5_7.txt").unlink()
    result = CliRunner().invoke(main, ["ib", "topology", "--input", directory],
                                obj=Clients(config=site.config, slurm=site.slurm))
    assert result.exit_code == 3 and "no mlx5_7.txt" in result.output


def test_a_slurm_node_missing_from_the_fabric_is_a_warning(tmp_path):
    site = Site(tmp_path, FakeSlurm(gpu_nodes(65)))
    assert site.run("--output", str(site.conf)) == 0
    assert "gpu065: no HCA on the fabric" in site.output


def test_one_fabric_file_works_as_input(site, tmp_path):
    one = tmp_path / "fabric.txt"
    one.write_text(RailFabric().one_output())
    result = CliRunner().invoke(main, ["ib", "topology", "--input", str(one), "--format", "block"],
                                obj=Clients(config=site.config, slurm=site.slurm))
    assert result.exit_code == 0 and "BlockName=su2-leaf Nodes=gpu[033-064]" in result.output


def test_live_runs_ibnetdiscover_once_per_rail(site):
    outputs, argvs = site.lab.outputs(), []

    def run(argv, **_):
        argvs.append(argv)
        return subprocess.CompletedProcess(argv, 0, outputs[argv[2]], "")

    result = topology(Clients(config=site.config, slurm=site.slurm), None, None, ["tree"], False, None, False, run=run)
    assert argvs == [["ibnetdiscover", "-C", f"mlx5_{r}", "-P", "1"] for r in range(8)]
    assert len(result.fabric.nodes) == 64


def test_live_rail_that_fails_stops_the_run(site):
    def run(argv, **_):
        return subprocess.CompletedProcess(argv, 1, "", "ibnetdiscover: iberror: discover failed")

    with pytest.raises(SourceUnavailable, match="ibnetdiscover -C mlx5_0 -P 1: exit 1: .*discover failed"):
        topology(Clients(config=site.config, slurm=site.slurm), None, None, ["tree"], False, None, False, run=run)
