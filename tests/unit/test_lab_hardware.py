"""The emulated node's hardware model, its faults, and the sysfs tree node_exporter reads."""

import pytest

from opsctl_lab.errors import LabError
from opsctl_lab.hardware import NodeHardware, fault_label, hca_name, parse_fault
from opsctl_lab.ib_sysfs import write_tree


@pytest.mark.parametrize("text", ["meltdown", "xid", "xid:", "xid:abc", "xid:0", "dbe:3", "clock-slowdown",
                                  "clock-slowdown:sw-power-cap", "clock-slowdown:3", "nvlink-down", "nvlink-down:18",
                                  "nvlink-down:-1", "nvlink-degraded:x"])
def test_bad_fault_names_are_refused(text):
    with pytest.raises(LabError):
        parse_fault(text)


def test_hca_addresses():
    assert hca_name(0) == "mlx5_0" and hca_name("7") == "mlx5_7"
    assert hca_name(8) == hca_name("mlx5_bond_0") == "mlx5_bond_0"
    with pytest.raises(LabError):
        hca_name(9)


def test_a_variant_fault_keeps_its_word_and_each_word_is_a_fault_of_its_own():
    hw = NodeHardware(node="gpu009")
    hw.inject("clock-slowdown:power-brake", gpu=2, now=100.0)
    hw.inject("clock-slowdown:sw-thermal", gpu=2, now=101.0)
    hw.inject("clock-slowdown:power-brake", gpu=2, now=102.0)  # again: replaces, not adds
    assert sorted(fault_label(f) for f in hw.active) == ["clock-slowdown:power-brake gpu2",
                                                        "clock-slowdown:sw-thermal gpu2"]
    assert parse_fault("clock-slowdown:hw-thermal")[1] == "hw-thermal"


def test_nvlink_faults_take_a_link_and_slow_or_stop_that_link_of_their_gpu_alone():
    from opsctl_lab.dcgm_emulator import GpuView
    from opsctl_lab.hardware import NVLINK_DEGRADED_SPEED_GBPS, NVLINK_SPEED_GBPS

    hw = NodeHardware(node="gpu009")
    hw.inject("nvlink-down:03", gpu=1, now=100.0)
    hw.inject("nvlink-down:17", gpu=1, now=100.0)
    hw.inject("nvlink-degraded:7", gpu=5, now=100.0)
    assert sorted(fault_label(f) for f in hw.active) == ["nvlink-degraded:7 gpu5", "nvlink-down:17 gpu1",
                                                        "nvlink-down:3 gpu1"]
    speeds = {gpu: GpuView(hw, gpu, 100.0).nvlink_speeds() for gpu in range(8)}
    off_speed = {(gpu, link, speed) for gpu, links in speeds.items() for link, speed in links.items()
                 if speed != NVLINK_SPEED_GBPS}
    assert off_speed == {(1, 3, 0.0), (1, 17, 0.0), (5, 7, NVLINK_DEGRADED_SPEED_GBPS)}
    assert all(len(links) == 18 for links in speeds.values())


def test_state_round_trips_through_its_file(tmp_path):
    hw = NodeHardware(node="gpu009")
    hw.inject("xid:48", gpu=2, now=100.0)
    hw.inject("clock-slowdown:hw-slowdown", gpu=5, now=100.0)
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


def test_dgx_naming_puts_the_storage_ports_between_the_rails_and_back(tmp_path):
    hw = NodeHardware(node="gpu001")
    hw.inject("dgx-naming", now=0.0)
    write_tree(tmp_path, hw, now=0.0)
    base = tmp_path / "class" / "infiniband"
    assert sorted(p.name for p in base.iterdir()) == sorted(f"mlx5_{i}" for i in range(12))
    layers = {p.name: (p / "ports" / "1" / "link_layer").read_text().strip() for p in base.iterdir()}
    assert sorted(name for name, layer in layers.items() if layer == "Ethernet") == ["mlx5_2", "mlx5_8"]
    assert hca_name(5, hw.hca_layout()) == "mlx5_9" and hca_name(8, hw.hca_layout()) == "mlx5_1"
    hw.inject("ib-down", hca="mlx5_9", now=0.0)
    write_tree(tmp_path, hw, now=1.0)
    assert (base / "mlx5_9" / "ports" / "1" / "state").read_text() == "1: DOWN\n"
    hw.clear(now=2.0)
    write_tree(tmp_path, hw, now=2.0)
    assert sorted(p.name for p in base.iterdir()) == sorted([*(f"mlx5_{i}" for i in range(8)), "mlx5_bond_0"])
    assert (base / "mlx5_3" / "device").resolve().name == "0000:5e:00.0"


def test_a_tree_written_before_the_pcie_bridges_is_laid_out_again(tmp_path):
    """Earlier lab trees held each HCA's PCI device as a directory in bus/pci/devices itself."""
    old = tmp_path / "bus" / "pci" / "devices" / "0000:1a:00.0"
    old.mkdir(parents=True)
    (old / "current_link_width").write_text("16\n")
    write_tree(tmp_path, NodeHardware(node="gpu001"), now=0.0)
    assert old.is_symlink() and (old / "current_link_width").read_text() == "16\n"
    assert (old / "class").read_text() == "0x020700\n"


def test_slow_gpu_takes_a_gpu_and_hang_the_node_and_clear_ends_both():
    from opsctl_lab.hardware import FAULTS, describe_faults

    hw = NodeHardware(node="gpu040")
    hw.inject("slow-gpu", gpu=2, now=100.0)
    hw.inject("hang", now=100.0)
    assert sorted(fault_label(f) for f in hw.active) == ["hang", "slow-gpu gpu2"]
    assert hw.has("slow-gpu", gpu=2) and not hw.has("slow-gpu", gpu=1) and hw.node_fault("hang")
    assert FAULTS["hang"].simulated_only and not FAULTS["slow-gpu"].simulated_only  # the machines run no train
    assert "slow-gpu" in describe_faults() and "hang " in describe_faults()
    hw.clear(now=101.0)
    assert hw.active == []
