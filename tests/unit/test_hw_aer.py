"""The PCIe AER counts of sysfs, in the kernel's two spellings, as `opsctl node check` reads and writes them."""

from opsctl.hw.aer import parse_total, read_aer
from opsctl.nodecheck.report import metrics_text
from opsctl.nodecheck.run import aer_lines
from opsctl_lab.ib_sysfs import aer_files

# Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats, its sample (the names before Linux 5.x)
KERNEL_DOC_SAMPLE = """Receiver Error 2
Bad TLP 0
Bad DLLP 0
RELAY_NUM Rollover 0
Replay Timer Timeout 0
Advisory Non-Fatal 0
Corrected Internal Error 0
Header Log Overflow 0
TOTAL_ERR_COR 2
"""


def test_the_total_is_read_in_either_spelling_and_a_file_without_it_has_none():
    assert parse_total(KERNEL_DOC_SAMPLE, "TOTAL_ERR_COR") == 2
    assert parse_total(aer_files(7)["aer_dev_correctable"], "TOTAL_ERR_COR") == 7
    assert parse_total(aer_files(7)["aer_dev_fatal"], "TOTAL_ERR_FATAL") == 0
    assert parse_total("RxErr 2\n", "TOTAL_ERR_COR") is None


def test_each_device_with_aer_files_has_its_three_counts_and_one_without_has_none(tmp_path):
    gpu = tmp_path / "bus" / "pci" / "devices" / "0000:18:00.0"
    gpu.mkdir(parents=True)
    for name, text in aer_files(12).items():
        (gpu / name).write_text(text)
    (tmp_path / "bus" / "pci" / "devices" / "0000:19:00.0").mkdir()
    counts = read_aer(tmp_path, {"gpu0": "0000:18:00.0", "mlx5_0": "0000:19:00.0"})
    assert counts == {"gpu0": {"correctable": 12, "nonfatal": 0, "fatal": 0}}
    text = metrics_text([], 1.8e9, aer=counts)
    assert 'opsctl_node_pcie_aer_errors_total{pcie="gpu0",severity="correctable"} 12\n' in text
    assert text.count("opsctl_node_pcie_aer_errors_total{") == 3
    assert aer_lines(counts) == ["pcie aer gpu0: correctable 12"]
    assert aer_lines({"gpu0": {"correctable": 0}}) == ["pcie aer: no errors on 1 devices"]
