"""opsctl.topology.ibnetdiscover over real `ibnetdiscover` outputs (tests/fixtures/infiniband/, SOURCES.md there):
NVIDIA topograph's capture of an NDR cluster, a GB200 tray's lone HCA, and rdma-core's own man page example;
and the fabric the real NDR capture makes."""

from pathlib import Path

import pytest

from opsctl.errors import SourceUnavailable
from opsctl.topology.drift import CROSS_RAIL, own_drift
from opsctl.topology.fabric import build_fabric
from opsctl.topology.ibnetdiscover import CA, SWITCH, Link, process_ibnetdiscover_output

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "infiniband"
NDR = "ibnetdiscover-topograph-ndr-rail-optimised.txt"


def parse(name):
    return process_ibnetdiscover_output((FIXTURES / name).read_text(), name)


def dgx_hosts(subnet):
    return {n.description.split()[0] for n in subnet.nodes.values() if n.kind == CA and "-dgx-" in n.description}


def test_the_ndr_capture_has_its_switches_cas_and_every_link_once():
    subnet = parse(NDR)
    kinds = [n.kind for n in subnet.nodes.values()]
    assert (kinds.count(SWITCH), kinds.count(CA), len(subnet.links)) == (40, 582, 1114)
    assert {link.rate for link in subnet.links} == {"4xNDR"}
    leaf = subnet.nodes["2c5eab0300b87b40"]
    assert (leaf.kind, leaf.ports, leaf.lid, leaf.description) == (
        SWITCH, 65, 73, "MF0;A09-P1-IBLEAF-04-04:MQM9701/U1")
    assert Link("2c5eab0300b87b40", 1, "e09d7303007a4bd8", 1, "4x", "NDR") in subnet.links
    assert subnet.nodes["e09d7303007a4bd8"].description == "a08-p1-dgx-04-c01 mlx5_5"


def test_the_ndr_capture_makes_eight_scalable_units_and_names_its_swapped_rails():
    subnet = parse(NDR)
    fabric = build_fabric([subnet], dgx_hosts(subnet))
    assert len(fabric.leaf_groups()) == 8 and len(fabric.nodes) == 119
    assert [g.name for g in fabric.groups.values() if g.level == 1] == ["P1-IBSPINE"]
    assert fabric.others == 116  # aggregation nodes, HCAs without a description, management hosts
    # b08-p1-dgx-08-c01's HCA-5 and HCA-6 are cabled to each other's leaf in the real fabric.
    assert [(d.kind, d.node, d.hca, d.switch) for d in own_drift(fabric, ())] == [
        (CROSS_RAIL, "b08-p1-dgx-08-c01", "HCA-5", "B09-P1-IBLEAF-04-08"),
        (CROSS_RAIL, "b08-p1-dgx-08-c01", "HCA-6", "B09-P1-IBLEAF-03-08")]


def test_a_lone_hca_has_no_link_and_no_leaf():
    subnet = parse("ibnetdiscover-topograph-gb200-lone-ca.txt")
    assert [(n.kind, n.description) for n in subnet.nodes.values()] == [(CA, "dgx-gb200-n01-c1 HCA-1")]
    fabric = build_fabric([subnet], {"dgx-gb200-n01-c1"})
    assert fabric.hcas["dgx-gb200-n01-c1 HCA-1"].switch == "" and fabric.home == {}


def test_the_man_page_example_with_grouping_and_spaces():
    subnet = parse("ibnetdiscover-rdma-core-man-sdr.txt")
    assert sorted(n.description for n in subnet.nodes.values() if n.kind == SWITCH) == [
        "ISR9024 Voltaire", "SW-6IB4 Voltaire"]
    assert len(subnet.links) == 7  # each cable once, from the switch's side: two between the switches
    two_port = [link for link in subnet.links if "0008f10403960558" in (link.guid, link.peer_guid)]
    assert sorted(link.port for link in two_port) == [8, 12]


def test_full_and_grouped_port_lines_are_read():
    text = ('Switch\t36 "S-0002c90200400e30"\t\t# "MF0;sw1:MQM8700/U1" enhanced port 0 lid 1 lmc 0\n'
            '[1][ext 3]\t"H-7cfe900300e1a820"[1](7cfe900300e1a820) \t\t# "node01 mlx5_0" lid 2 2xNDR s=16 w=16 v=3\n'
            '[2]\t"S-0002c90200400e31"[5][ext 7]\t\t# "MF0;sw2:MQM8700/U1" lid 3 4xHDR\n')
    links = process_ibnetdiscover_output(text, "t").links
    assert [(link.port, link.peer_port, link.rate) for link in links] == [(1, 1, "2xNDR"), (2, 5, "4xHDR")]


@pytest.mark.parametrize(("text", "words"), [
    ("Switch\t36 \"S-0002c90200400e30\"\t\t# \"sw\" enhanced port 0 lid 1 lmc 0\n[1]\tgarbage\n", "line 2"),
    ("[1]\t\"S-0002c90200400e30\"[1]\t\t# \"sw\" lid 1 4xNDR\n", "line 1: not a port line"),
    ("hello\n", "line 1: not ibnetdiscover output"),
    ("#\n# Topology file: generated on Mon Dec  7 10:00:00 2026\n", "no switch or CA"),
])
def test_what_is_not_ibnetdiscover_output_is_an_error_naming_the_line(text, words):
    with pytest.raises(SourceUnavailable, match=words):
        process_ibnetdiscover_output(text, "rail3.txt")
