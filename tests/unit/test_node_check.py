"""`opsctl node check`: its metrics for node_exporter's textfile collector, written for node_exporter's
textfile collector (--drain-self: test_node_check_drain_self.py)."""

from opsctl.ib.check import h200_ndr, judge
from opsctl.ib.collect import live_snapshot
from opsctl.nodecheck import metrics_text, results, write_textfile
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.ib_sysfs import write_tree

T0 = 1_800_000_000.0


def found_on(tmp_path, *faults):
    hw = NodeHardware(node="gpu007")
    for fault, hca in faults:
        hw.inject(fault, hca=hca, now=T0)
    write_tree(tmp_path / "sys", hw, now=T0)
    return results(judge(live_snapshot(tmp_path / "sys"), h200_ndr()))


def test_metrics_name_each_failed_check_and_device_and_each_passed_check(tmp_path):
    text = metrics_text(found_on(tmp_path, ("ib-down", "mlx5_2"), ("pcie-x8", "mlx5_6")), now=T0)
    assert 'opsctl_node_check{check="ib-port-state",device="mlx5_2"} 1' in text
    assert 'opsctl_node_check{check="ib-pcie-link",device="mlx5_6"} 1' in text
    assert 'opsctl_node_check{check="ib-link-rate",device="node"} 0' in text
    assert 'check="ib-port-state",device="node"' not in text  # a failed check has no passing series
    assert 'check="ib-error-counters"' not in text  # not made (no window): no series, never a pass
    assert text.endswith(f"opsctl_node_check_timestamp_seconds {T0:.3f}\n")


def test_the_textfile_is_written_whole_and_only_as_prom(tmp_path):
    target = tmp_path / "opsctl_node_check.prom"
    write_textfile(target, "x 1\n")
    assert target.read_text() == "x 1\n" and [p.name for p in tmp_path.iterdir()] == [target.name]
    try:
        write_textfile(tmp_path / "checks.txt", "x 1\n")
    except Exception as err:  # noqa: BLE001
        assert "must be an absolute path ending in .prom" in str(err)
    else:
        raise AssertionError("a non-.prom textfile was accepted")
