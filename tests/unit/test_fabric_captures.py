"""The PCIe link of an HCA from sysfs, as `opsctl ib check` reads it: the kernel's speed strings, old and
new, the width files, and files that are missing or hold what the kernel never writes."""

import re
from pathlib import Path

import pytest

from opsctl.errors import SourceUnavailable
from opsctl.ib.pcie import PcieLink, PcieLinkStatus, parse_link_speed, parse_link_width, read_sysfs_pcie_link


def _sysfs_device(root: Path, name: str, current: tuple[str, str], maximum: tuple[str, str]) -> Path:
    device = root / name
    device.mkdir()
    for prefix, (speed, width) in (("current", current), ("max", maximum)):
        (device / f"{prefix}_link_speed").write_text(speed + "\n")
        (device / f"{prefix}_link_width").write_text(width + "\n")
    return device


def test_sysfs_x8_link(tmp_path):
    device = _sysfs_device(tmp_path, "0000:9c:00.0", ("32.0 GT/s PCIe", "8"), ("32.0 GT/s PCIe", "16"))
    assert read_sysfs_pcie_link(device) == PcieLinkStatus(
        address="0000:9c:00.0", current=PcieLink(32.0, 8), maximum=PcieLink(32.0, 16))


def test_sysfs_gen4_link_through_a_symlink(tmp_path):
    target = _sysfs_device(tmp_path, "0000:17:00.0", ("16.0 GT/s PCIe", "16"), ("16.0 GT/s PCIe", "16"))
    (tmp_path / "devices").mkdir()
    link = tmp_path / "devices" / "device"  # like /sys/class/infiniband/mlx5_0/device
    link.symlink_to(target)
    assert read_sysfs_pcie_link(link) == PcieLinkStatus(
        address="0000:17:00.0", current=PcieLink(16.0, 16), maximum=PcieLink(16.0, 16))


def test_sysfs_kernel_before_pci_speed_string(tmp_path):
    device = _sysfs_device(tmp_path, "0000:3b:00.0", ("8 GT/s", "16"), ("16 GT/s", "16"))
    assert (read_sysfs_pcie_link(device).current, read_sysfs_pcie_link(device).maximum) == (
        PcieLink(8.0, 16), PcieLink(16.0, 16))


def test_sysfs_missing_file_names_the_path(tmp_path):
    device = _sysfs_device(tmp_path, "0000:9c:00.0", ("32.0 GT/s PCIe", "16"), ("32.0 GT/s PCIe", "16"))
    (device / "max_link_width").unlink()
    with pytest.raises(SourceUnavailable, match=re.escape(str(device / "max_link_width"))):
        read_sysfs_pcie_link(device)


def test_sysfs_directory_that_is_no_device(tmp_path):
    device = _sysfs_device(tmp_path, "mlx5_0", ("32.0 GT/s PCIe", "16"), ("32.0 GT/s PCIe", "16"))
    with pytest.raises(SourceUnavailable, match="'mlx5_0' is no bdf"):
        read_sysfs_pcie_link(device)


@pytest.mark.parametrize("text,gts", [
    ("2.5 GT/s PCIe\n", 2.5), ("5.0 GT/s PCIe\n", 5.0), ("8.0 GT/s PCIe\n", 8.0), ("16.0 GT/s PCIe\n", 16.0),
    ("32.0 GT/s PCIe\n", 32.0), ("64.0 GT/s PCIe\n", 64.0), ("32.0 GT/s PCIe", 32.0), ("5 GT/s\n", 5.0),
])
def test_parse_link_speed(text, gts):
    assert parse_link_speed(text) == gts


@pytest.mark.parametrize("text", ["Unknown\n", "Unknown speed\n", "33 MHz PCI\n", "32GT/s\n", "", "32.0 GT/"])
def test_parse_link_speed_unknown_is_named(text):
    with pytest.raises(SourceUnavailable, match=re.escape(repr(text))):
        parse_link_speed(text)


def test_parse_link_width():
    assert (parse_link_width("16\n"), parse_link_width("8\n"), parse_link_width("0\n")) == (16, 8, 0)


@pytest.mark.parametrize("text", ["x16\n", "", "-1\n", "1\n6\n"])
def test_parse_link_width_unknown_is_named(text):
    with pytest.raises(SourceUnavailable, match=re.escape(repr(text))):
        parse_link_width(text)
