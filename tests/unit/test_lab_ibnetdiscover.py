"""The lab fabric's ibnetdiscover (opsctl_lab.fabric, opsctl_lab.hwtools.ibnetdiscover): every line it prints
has a shape the real tool's output has, the fabric it describes is the lab's design (node i's rail-r HCA on
rail<r>-su<s>-leaf port p), and each fabric fault moves exactly what it should."""

import json
import re
from pathlib import Path

import pytest

from opsctl_lab import cluster, fabric_lab
from opsctl_lab import paths as lp
from opsctl_lab.errors import LabError
from opsctl_lab.fabric import (
    FabricState,
    build_rail,
    head_hcas,
    host_hcas,
    leaf_name,
    rail_fabric,
    spine_name,
    switch_desc,
)
from opsctl_lab.hardware import FAULTS, NodeHardware, describe_faults, fault_label, parse_fault
from opsctl_lab.hwtools import ibnetdiscover as tool
from tests.conftest import FIXTURES

IB = FIXTURES / "infiniband"
REAL = (IB / "ibnetdiscover-topograph-ndr-rail-optimised.txt").read_text()
REAL_LONE_CA = (IB / "ibnetdiscover-topograph-gb200-lone-ca.txt").read_text()
NODES = [f"gpu{i:03d}" for i in range(1, 65)]
GENERATED = 1_786_000_000.0


def shape(line: str) -> str:
    """A line with its values taken out: descriptions, GUIDs, numbers and the date."""
    line = re.sub(r"generated on .*", "generated on DATE", line)
    line = re.sub(r'"[^"]*"', '"D"', line)
    line = re.sub(r"0x[0-9a-f]+", "0xH", line)
    line = re.sub(r"\b[0-9a-f]{8,16}\b", "G", line)
    return re.sub(r"\d+", "N", line)


def shapes(text: str) -> set[str]:
    return {shape(line) for line in text.split("\n")}


def hardware(faults: dict[str, list[str]] | None = None, nodes: list[str] = NODES) -> list[NodeHardware]:
    found = []
    for name in nodes:
        hw = NodeHardware(node=name)
        for fault in (faults or {}).get(name, []):
            fault, _, hca = fault.partition(" ")
            hw.inject(fault, hca=hca or None, now=0.0)
        found.append(hw)
    return found


def output(rail: int, nodes: list[NodeHardware], uplinks_down: frozenset[str] = frozenset(),
           start: str = "head") -> str:
    fabric = build_rail(rail, [host_hcas(hw) for hw in nodes], head_hcas(), uplinks_down)
    local = next(n for n in fabric.nodes.values() if n.desc == f"{start} mlx5_{rail}")
    return tool.render(fabric, local.guid, GENERATED)


def links(text: str) -> set[tuple[str, int, str, int]]:
    """(switch, port, remote, remote port) of every switch port line, by node description; and the
    switches' own descriptions, read the way a reader of the real format reads them."""
    found, switch, names = set(), None, {}
    for line in text.splitlines():
        head = re.match(r'Switch\t\d+ "S-([0-9a-f]{16})"\t\t# "([^"]*)"', line)
        if head:
            switch = head.group(2)
            names[head.group(1)] = switch
            continue
        port = re.match(r'\[(\d+)\]\t"[SH]-[0-9a-f]{16}"\[(\d+)\](?:\([0-9a-f]+\) )?\t\t# "([^"]*)"', line)
        if port and switch:
            found.add((switch, int(port.group(1)), port.group(3), int(port.group(2))))
        if not line:
            switch = None
    return found


def hca_ports(text: str) -> dict[str, tuple[str, int]]:
    """`<host> <hca>` -> (its switch, port)."""
    switches = ("MF0;", "Mellanox")  # switches and their aggregation nodes
    return {remote: (switch, port) for switch, port, remote, _ in links(text) if not remote.startswith(switches)}


@pytest.fixture(scope="module")
def healthy() -> dict[int, str]:
    nodes = hardware()
    return {rail: output(rail, nodes) for rail in range(8)}


def test_every_line_has_a_shape_of_the_real_tools_output(healthy):
    real = shapes(REAL)
    for rail, text in healthy.items():
        assert shapes(text) <= real, (rail, sorted(shapes(text) - real))
    # and the shapes that matter are there: switch, CA, their links both ways, the header
    assert len(shapes(healthy[3])) >= 12


def test_the_shape_check_catches_a_line_the_real_tool_never_prints(healthy):
    bad = healthy[0].replace("\tlid", " lid", 1).replace(" 4xNDR", "  4xNDR", 1)
    assert not shapes(bad) <= shapes(REAL)


def test_each_rail_is_the_designed_rail_optimised_fabric(healthy):
    for rail, text in healthy.items():
        ports = hca_ports(text)
        for i, node in enumerate(NODES, start=1):
            su, port = (i - 1) // 32 + 1, (i - 1) % 32 + 1
            assert ports[f"{node} mlx5_{rail}"] == (switch_desc(leaf_name(rail, su)), port)
        assert not [name for name in ports if name.endswith(f"mlx5_{(rail + 1) % 8}")]  # its rail only
        assert ports[f"head mlx5_{rail}"] == (switch_desc(spine_name(rail, 1)), 64)
        up = {(s, p, r, rp) for s, p, r, rp in links(text) if "leaf" in s and "spine" in r}
        for su in (1, 2):
            for k in (1, 2):
                mine = sorted((p, rp) for s, p, r, rp in up
                              if s == switch_desc(leaf_name(rail, su)) and r == switch_desc(spine_name(rail, k)))
                assert mine == [(33 + 16 * (k - 1) + j, 16 * (su - 1) + 1 + j) for j in range(16)]


def test_switches_come_first_in_reverse_discovery_order_the_local_port_last(healthy):
    text = output(3, hardware(), start="gpu010")
    switches = re.findall(r'^Switch\t65 "S-[0-9a-f]+"\t\t# "MF0;([^:]+):MQM9700/U1"', text, re.M)
    assert switches == ["rail3-su2-leaf", "rail3-spine2", "rail3-spine1", "rail3-su1-leaf"]  # as the capture
    cas = re.findall(r'^Ca\t1 "H-[0-9a-f]+"\t\t# "([^"]*)"', text, re.M)
    # its leaf's CAs by port, reversed, then the local one: as the capture's c02, c01, c08
    assert cas[-3:] == ["gpu002 mlx5_3", "gpu001 mlx5_3", "gpu010 mlx5_3"] and len(cas) == 64 + 1 + 4
    local = re.search(r"# Initiated from node ([0-9a-f]{16}) port ([0-9a-f]{16})", text)
    assert local.group(1) == local.group(2) == f"{host_hcas(NodeHardware(node='gpu010'))[3].guid:016x}"


def moved(before: str, after: str) -> tuple[set, set]:
    return links(before) - links(after), links(after) - links(before)


LEAF = {(r, s): switch_desc(leaf_name(r, s)) for r in range(8) for s in (1, 2)}
SPINE2 = {r: switch_desc(spine_name(r, 2)) for r in range(8)}


def test_recable_leaf_moves_that_hca_to_the_other_units_leaf(healthy):
    nodes = hardware({"gpu010": ["recable-leaf:3"]})
    after = {rail: output(rail, nodes) for rail in range(8)}
    gone, new = moved(healthy[3], after[3])
    # a full leaf: the cable takes its last up-link port, whose spine cable was pulled
    assert gone == {(LEAF[3, 1], 10, "gpu010 mlx5_3", 1), (LEAF[3, 2], 64, SPINE2[3], 32),
                    (SPINE2[3], 32, LEAF[3, 2], 64)}
    assert new == {(LEAF[3, 2], 64, "gpu010 mlx5_3", 1)}
    assert all(after[r] == healthy[r] for r in range(8) if r != 3)


def test_recable_leaf_takes_a_free_down_port_where_there_is_one():
    nodes = hardware({"gpu010": ["recable-leaf:5"]}, nodes=NODES[:40])
    gone, new = moved(output(5, hardware(nodes=NODES[:40])), output(5, nodes))
    assert gone == {(LEAF[5, 1], 10, "gpu010 mlx5_5", 1)}
    assert new == {(LEAF[5, 2], 9, "gpu010 mlx5_5", 1)}  # gpu033..gpu040 on ports 1-8


def test_recable_rail_moves_that_hca_to_the_next_rails_leaf(healthy):
    nodes = hardware({"gpu010": ["recable-rail:3"]})
    after = {rail: output(rail, nodes) for rail in range(8)}
    assert moved(healthy[3], after[3]) == ({(LEAF[3, 1], 10, "gpu010 mlx5_3", 1)}, set())
    gone, new = moved(healthy[4], after[4])
    assert gone == {(LEAF[4, 1], 64, SPINE2[4], 16), (SPINE2[4], 16, LEAF[4, 1], 64)}
    assert new == {(LEAF[4, 1], 64, "gpu010 mlx5_3", 1)}
    assert hca_ports(after[4])["gpu010 mlx5_4"] == (LEAF[4, 1], 10)  # its own rail-4 HCA stays
    assert all(after[r] == healthy[r] for r in range(8) if r not in (3, 4))


def test_recable_rail_of_rail_7_goes_to_rail_0():
    after = output(0, hardware({"gpu040": ["recable-rail:7"]}))
    assert hca_ports(after)["gpu040 mlx5_7"] == (LEAF[0, 2], 64)


def test_uplink_down_takes_one_up_link_of_that_leaf_only(healthy):
    nodes = hardware()
    after = {rail: output(rail, nodes, frozenset({"rail3-su1-leaf"})) for rail in range(8)}
    assert moved(healthy[3], after[3]) == ({(LEAF[3, 1], 64, SPINE2[3], 16), (SPINE2[3], 16, LEAF[3, 1], 64)}, set())
    assert all(after[r] == healthy[r] for r in range(8) if r != 3)


def test_a_port_that_is_down_is_not_on_the_fabric_and_alone_finds_only_itself(healthy):
    nodes = hardware({"gpu010": ["ib-down 3"]})
    assert moved(healthy[3], output(3, nodes)) == ({(LEAF[3, 1], 10, "gpu010 mlx5_3", 1)}, set())
    fabric = build_rail(3, [host_hcas(hw) for hw in nodes], head_hcas())
    mine = host_hcas(nodes[9])[3]
    fabric.add(tool.FabricNode("ca", mine.guid, "gpu010 mlx5_3", mine.lid, 1, 0x1021, mine.guid))
    alone = tool.render(fabric, mine.guid, GENERATED)
    assert [shape(line) for line in alone.splitlines()] == [shape(line) for line in REAL_LONE_CA.splitlines()]


def test_hcas_are_named_and_numbered_as_their_sysfs_tree_has_them(healthy):
    hw = NodeHardware(node="gpu007")
    mine = host_hcas(hw)[2]
    line = next(line for line in healthy[2].splitlines() if line.startswith("Ca") and '"gpu007 mlx5_2"' in line)
    assert f'"H-{mine.guid:016x}"' in line
    assert f'"gpu007 mlx5_2" lid {mine.lid} 4xNDR' in healthy[2]
    hw.inject("sm-down")
    assert host_hcas(hw)[2].lid == 0  # no subnet manager: no LID, as ibstat shows


def test_the_options_are_the_real_tools():
    assert tool.parse_args(["-C", "mlx5_3", "-P", "1"]) == ({"-C": "mlx5_3", "-P": "1"}, [])
    assert tool.parse_args(["--Ca=mlx5_3", "out.txt", "--Port", "1"]) == ({"--Ca": "mlx5_3", "--Port": "1"},
                                                                          ["out.txt"])
    with pytest.raises(tool.UsageError, match=r"^ibnetdiscover: invalid option -- 'x'$"):
        tool.parse_args(["-x"])
    with pytest.raises(tool.UsageError, match=r"^ibnetdiscover: unrecognized option '--bogus'$"):
        tool.parse_args(["--bogus"])
    with pytest.raises(tool.UsageError, match=r"^ibnetdiscover: option requires an argument -- 'C'$"):
        tool.parse_args(["-C"])
    assert tool.usage().startswith("\nUsage: ibnetdiscover [options] [topology-file]\n\nOptions:\n  --full, -f")
    assert "  --Ca, -C <ca>           Ca name to use\n" in tool.usage()  # ibdiag_show_usage's column 24


def test_the_local_port_is_chosen_as_libibumad_does():
    hw = NodeHardware(node="gpu001")
    hw.inject("ib-down", hca=0)
    hcas = host_hcas(hw)
    assert tool.choose_port(hcas, None, 0).hca == "mlx5_1"  # the first active port
    assert tool.choose_port(hcas, "mlx5_0", 1).hca == "mlx5_0"  # named: that one, even down
    assert tool.choose_port(hcas, "mlx5_9", 1) is None and tool.choose_port(hcas, "mlx5_3", 2) is None
    hw.inject("recable-rail:6")
    assert tool.rail_of(tool.choose_port(host_hcas(hw), "mlx5_6", 1)) == 7


def test_the_new_faults_parse_and_are_listed():
    assert parse_fault("recable-leaf:3") == (FAULTS["recable-leaf"], 3)
    assert parse_fault("recable-rail:0") == (FAULTS["recable-rail"], 0)
    assert parse_fault("uplink-down:rail3-su1-leaf") == (FAULTS["uplink-down"], None)
    for bad in ("recable-leaf", "recable-leaf:8", "recable-rail:x", "uplink-down"):
        with pytest.raises(LabError):
            parse_fault(bad)
    hw = NodeHardware(node="gpu010")
    assert fault_label(hw.inject("recable-rail:3")) == "recable-rail:3"
    assert hw.recabled("recable-rail") == {3} and hw.recabled("recable-leaf") == set()
    with pytest.raises(LabError, match="fault of the fabric"):
        hw.inject("uplink-down:rail3-su1-leaf")
    listed = describe_faults()
    for name in ("recable-leaf:<rail>", "recable-rail:<rail>", "uplink-down:<leaf>"):
        assert name in listed
    hw.reboot(now=1.0)
    assert hw.recabled("recable-rail") == {3}  # a cable outlives a reboot


def test_the_fabric_state_takes_its_own_faults_only(tmp_path):
    state = FabricState(nodes=NODES, state_pattern=str(tmp_path / "{node}.json"))
    assert state.inject("uplink-down:rail7-su2-leaf") == "uplink-down:rail7-su2-leaf"
    for bad, why in (("uplink-down:rail8-su1-leaf", "no leaf"), ("uplink-down:rail1-su3-leaf", "no leaf"),
                     ("ib-slow", "not a fault of the fabric")):
        with pytest.raises(LabError, match=why):
            state.inject(bad)
    state.save(tmp_path / "fabric.json")
    assert FabricState.load(tmp_path / "fabric.json").uplinks_down() == {"rail7-su2-leaf"}
    with pytest.raises(LabError, match="holds at most 96"):
        build_rail(0, [host_hcas(NodeHardware(node=f"n{i}")) for i in range(97)], None)


def test_rail_fabric_reads_each_nodes_state_file(tmp_path):
    state = FabricState(nodes=NODES[:4], state_pattern=str(tmp_path / "{node}.json"))
    hw = NodeHardware(node="gpu002")
    hw.inject("recable-leaf:1")
    hw.save(tmp_path / "gpu002.json")
    ports = hca_ports(tool.render(rail_fabric(state, 1), head_hcas()[1].guid, GENERATED))
    assert ports["gpu002 mlx5_1"] == (LEAF[1, 2], 1) and ports["gpu001 mlx5_1"] == (LEAF[1, 1], 1)


@pytest.fixture
def lab(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCTL_LAB_DIR", str(tmp_path))
    paths = lp.LabPaths(tmp_path)
    paths.state_file.write_text(json.dumps({"nodes": 64, "scrape_interval": 5, "slot": 0}))
    fabric_lab.write_fabric(paths, 64)
    return paths


def test_the_simulated_lab_injects_and_clears_a_fault_of_the_fabric(lab, capsys):
    cluster.inject("fabric", "uplink-down:rail3-su1-leaf")
    assert FabricState.load(lab.fabric).faults == ["uplink-down:rail3-su1-leaf"]
    assert "injected uplink-down:rail3-su1-leaf on the fabric" in capsys.readouterr().out
    fabric_lab.write_fabric(lab, 64)  # `lab up` again: the fault stays
    assert fabric_lab.faults(lab) == ["uplink-down:rail3-su1-leaf"]
    for node, fault in (("gpu001", "uplink-down:rail3-su1-leaf"), ("fabric", "ib-slow"), ("all", "uplink-down:x")):
        with pytest.raises(LabError):
            cluster.inject(node, fault)
    cluster.clear("fabric")
    assert fabric_lab.faults(lab) == []
    state = FabricState.load(lab.fabric)
    assert (state.nodes[0], state.nodes[-1], state.head) == ("gpu001", "gpu064", "head")
    assert state.state_pattern.format(node="gpu010") == str(lab.hardware("gpu010"))


def test_the_lab_config_points_ib_ibnetdiscover_at_the_heads_tool(lab, monkeypatch):
    monkeypatch.setattr(cluster.prometheus_lab, "write_node_tool", lambda paths, name: paths.root / "bin" / name)
    cluster._write_opsctl_config(lab, 5)
    import yaml

    tool_path = Path(yaml.safe_load(lab.opsctl_config.read_text())["ib"]["ibnetdiscover"])
    assert tool_path == lab.root / "bin" / "ibnetdiscover"
    text = tool_path.read_text()
    assert f"OPSCTL_HW_FABRIC={lab.fabric}" in text and "OPSCTL_HW_NODE=head" in text
    assert "-m opsctl_lab.hwtools.ibnetdiscover" in text


def test_the_machines_fabric_is_bound_into_the_gpu_machines_and_the_head(tmp_path):
    from opsctl_lab.machines import fabric_cabling
    from opsctl_lab.machines.settings import Settings

    settings = Settings(net=7, state_dir=tmp_path, inventory_dir=tmp_path, apt_cache_dir=tmp_path)
    bind = [f"--bind={tmp_path / 'fabric'}:/var/lib/opsctl-hw/fabric"]
    assert [fabric_cabling.nspawn_args(settings, n) for n in ("head", "stor1", "gpu3")] == [bind, [], bind]
    state = fabric_cabling.write_fabric(settings, ["head", "stor1", "gpu1", "gpu2"])
    assert (state.nodes, state.head) == (["gpu1", "gpu2"], "head")
    assert state.state_pattern == "/var/lib/opsctl-hw/fabric/nodes/{node}.json"


def test_the_machines_inject_and_clear_the_fabrics_own_faults_on_the_host(tmp_path):
    from opsctl_lab.machines import fabric_cabling, labstate, lifecycle
    from opsctl_lab.machines.settings import Settings

    settings = Settings(net=7, state_dir=tmp_path, inventory_dir=tmp_path, apt_cache_dir=tmp_path)
    fabric_cabling.write_fabric(settings, ["head", "gpu1", "gpu2"])
    said: list[str] = []
    lifecycle.inject("fabric", "uplink-down:rail2-su1-leaf", echo=said.append, settings=settings)
    assert fabric_cabling.faults(settings) == ["uplink-down:rail2-su1-leaf"]
    assert labstate.faults(settings, [])["fabric"] == ["uplink-down:rail2-su1-leaf"]
    for machine, fault in (("gpu1", "uplink-down:rail2-su1-leaf"), ("fabric", "ib-down")):
        with pytest.raises(LabError):
            lifecycle.inject(machine, fault, settings=settings)
    fabric_cabling.write_fabric(settings, ["head", "gpu1", "gpu2", "gpu3"])  # `up` again: the fault stays
    lifecycle.clear("fabric", echo=said.append, settings=settings)
    assert fabric_cabling.faults(settings) == []
    assert said == ["injected uplink-down:rail2-su1-leaf on the fabric", "fabric: cleared uplink-down:rail2-su1-leaf"]
