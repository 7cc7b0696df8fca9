"""The dcgm-exporter emulator's tick loop, with its real listener: the sysfs tree it keeps follows
every state change, also one that a scrape thread read first."""

from opsctl_lab.dcgm_emulator import EmulatedNode, _stop, tick
from opsctl_lab.hardware import NodeHardware


def test_sysfs_follows_a_state_change_even_when_a_scrape_read_it_first(tmp_path):
    state, sysfs = tmp_path / "hw.json", tmp_path / "sys"
    hw = NodeHardware(node="gpu001")
    hw.save(state)
    node = EmulatedNode("gpu001", "127.0.0.1:0", state, sysfs)
    try:
        tick(node, 0.0)
        port_state = sysfs / "class/infiniband/mlx5_4/ports/1/state"
        assert port_state.read_text() == "4: ACTIVE\n"
        changes = [(lambda h: h.inject("ib-down", hca=4), "1: DOWN\n"), (NodeHardware.clear, "4: ACTIVE\n")]
        for change, expected in changes:
            change(hw)
            hw.save(state)
            node.refresh()  # a scrape thread reads the new state before the tick loop does
            tick(node, 1.0)
            assert port_state.read_text() == expected
    finally:
        _stop(node)
