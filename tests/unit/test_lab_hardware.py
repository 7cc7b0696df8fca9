"""The emulated node's hardware model, its faults, and the sysfs tree node_exporter reads."""

import pytest

from opsctl_lab.errors import LabError
from opsctl_lab.hardware import NodeHardware, hca_name, parse_fault
from opsctl_lab.ib_sysfs import write_tree


@pytest.mark.parametrize("text", ["meltdown", "xid", "xid:", "xid:abc", "xid:0", "dbe:3"])
def test_bad_fault_names_are_refused(text):
    with pytest.raises(LabError):
        parse_fault(text)


def test_hca_addresses():
    assert hca_name(0) == "mlx5_0" and hca_name("7") == "mlx5_7"
    assert hca_name(8) == hca_name("mlx5_bond_0") == "mlx5_bond_0"
    with pytest.raises(LabError):
        hca_name(9)


def test_state_round_trips_through_its_file(tmp_path):
    hw = NodeHardware(node="gpu009")
    hw.inject("xid:48", gpu=2, now=100.0)
    hw.inject("ib-down", hca=4, now=100.0)
    hw.save(tmp_path / "hw.json")
    back = NodeHardware.load(tmp_path / "hw.json", "gpu009")
    assert back == hw


def test_corrupt_state_is_a_clear_error(tmp_path):
    (tmp_path / "hw.json").write_text("{not json")
    with pytest.raises(LabError, match="cannot read lab hardware state"):
        NodeHardware.load(tmp_path / "hw.json", "gpu001")


def _read(root, rel):
    return (root / "class" / "infiniband" / rel).read_text().strip()


def test_sysfs_tree_has_the_real_layout(tmp_path):
    write_tree(tmp_path, NodeHardware(node="gpu001"))
    assert _read(tmp_path, "mlx5_0/ports/1/rate") == "400 Gb/sec (4X NDR)"
    assert _read(tmp_path, "mlx5_0/ports/1/state") == "4: ACTIVE"
    assert _read(tmp_path, "mlx5_0/ports/1/phys_state") == "5: LinkUp"
    assert _read(tmp_path, "mlx5_0/hca_type") == "MT4129"
    assert _read(tmp_path, "mlx5_bond_0/ports/1/link_layer") == "Ethernet"


def test_sysfs_faults_change_only_their_port(tmp_path):
    hw = NodeHardware(node="gpu001")
    hw.inject("ib-down", hca=2, now=0.0)
    hw.inject("ib-degraded", hca=5, now=0.0)
    hw.inject("ib-counters", hca=6, now=0.0)
    write_tree(tmp_path, hw, now=0.0)
    symbols_at_0 = int(_read(tmp_path, "mlx5_6/ports/1/counters/symbol_error"))
    write_tree(tmp_path, hw, now=10.0)
    assert _read(tmp_path, "mlx5_2/ports/1/state") == "1: DOWN"
    assert _read(tmp_path, "mlx5_5/ports/1/rate") == "200 Gb/sec (2X NDR)"
    assert int(_read(tmp_path, "mlx5_6/ports/1/counters/symbol_error")) > symbols_at_0
    for untouched in ("mlx5_0", "mlx5_1", "mlx5_3"):
        assert _read(tmp_path, f"{untouched}/ports/1/state") == "4: ACTIVE"
        assert _read(tmp_path, f"{untouched}/ports/1/counters/symbol_error") == "0"
