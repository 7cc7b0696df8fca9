"""`nvidia-smi nvlink -s` read from a real capture, and what `opsctl node check` makes of it."""

import subprocess

import pytest

from opsctl.errors import SourceUnavailable
from opsctl.gpu.nvlink import NvlinkReport, parse_nvlink_status, read_nvlinks
from opsctl.nodecheck.report import metrics_text
from opsctl.nodecheck.run import nvlink_lines
from tests.conftest import FIXTURES

CAPTURE = (FIXTURES / "gpu" / "nvidia-smi_nvlink_-s_2xH100_PCIe.txt").read_text()
BRIDGED = {0, 1, 2, 3, 6, 7, 8, 9, 12, 13, 14, 15}  # the links of the capture's NVLink bridge


def test_the_real_capture_reads_as_each_links_speed_and_inactive_as_zero():
    speeds = parse_nvlink_status(CAPTURE)
    assert sorted(speeds) == [0, 1]
    for links in speeds.values():
        assert sorted(links) == list(range(18))
        assert {link for link, speed in links.items() if speed == 26.562e9} == BRIDGED
        assert {link for link, speed in links.items() if speed == 0} == set(range(18)) - BRIDGED


def test_a_gpu_whose_links_nvml_cannot_read_has_no_link_and_a_stray_line_is_an_error():
    text = ("GPU 0: NVIDIA H200 (UUID: GPU-1)\n"
            "\t NVML: Unable to retrieve NVLink information as all links are inActive\n")
    assert parse_nvlink_status(text) == {0: {}}
    # not "0 inactive": nothing is known of its links
    assert "opsctl_node_nvlink_inactive{" not in metrics_text([], 1.8e9, nvlinks=NvlinkReport(speeds={0: {}}))
    with pytest.raises(SourceUnavailable, match="a line it does not know: 'Link 0: fast'"):
        parse_nvlink_status("GPU 0: NVIDIA H200 (UUID: GPU-1)\n\t Link 0: fast\n")


def test_a_failing_or_missing_nvidia_smi_gives_no_link_and_says_why():
    def fails(argv, **_):
        return subprocess.CompletedProcess(argv, 9, "", "NVIDIA-SMI has failed because it couldn't communicate "
                                                            "with the NVIDIA driver.\n")

    def missing(argv, **_):
        raise FileNotFoundError(2, "No such file or directory")
    assert read_nvlinks("nvidia-smi", 26.562e9, fails) == NvlinkReport(
        note="nvidia-smi nvlink -s exited 9: NVIDIA-SMI has failed because it couldn't communicate with the "
             "NVIDIA driver.")
    assert read_nvlinks("/usr/bin/nvidia-smi", 26.562e9, missing).note == \
        "nvidia-smi nvlink -s exited 127: /usr/bin/nvidia-smi: No such file or directory"


def test_the_textfile_has_two_series_per_gpu_naming_its_inactive_and_slow_links_and_the_lines_name_them():
    report = NvlinkReport(speeds={0: {0: 26.562e9, 1: 0.0}, 1: {0: 13.281e9, 1: 26.562e9},
                                  2: {0: 0.0, 1: 0.0, 2: 20e9, 3: 13.281e9}, 3: {0: 26.562e9, 1: 26.562e9}})
    text = metrics_text([], 1.8e9, nvlinks=report)
    assert 'opsctl_node_nvlink_inactive{gpu="0",nvlink="gpu0 link1"} 1\n' in text
    assert 'opsctl_node_nvlink_inactive{gpu="2",nvlink="gpu2 links 0,1"} 2\n' in text
    assert 'opsctl_node_nvlink_inactive{gpu="3",nvlink="gpu3"} 0\n' in text
    assert 'opsctl_node_nvlink_speed_ratio{gpu="1",nvlink="gpu1 link0"} 0.5\n' in text
    assert 'opsctl_node_nvlink_speed_ratio{gpu="2",nvlink="gpu2 links 2,3"} 0.5\n' in text
    assert 'opsctl_node_nvlink_speed_ratio{gpu="0",nvlink="gpu0"} 1\n' in text
    assert text.count("opsctl_node_nvlink_inactive{") == text.count("opsctl_node_nvlink_speed_ratio{") == 4
    assert nvlink_lines(NvlinkReport(speeds={0: {0: 26.562e9, 1: 0.0}, 1: {0: 13.281e9, 1: 26.562e9}})) == [
        "nvlink: 2 of 4 links at 26.562 GB/s", "nvlink gpu0 link1: inactive", "nvlink gpu1 link0: 13.281 GB/s"]
    assert "nvlink" not in metrics_text([], 1.8e9, nvlinks=NvlinkReport(note="no driver"))
    assert nvlink_lines(NvlinkReport(note="no driver")) == ["nvlink not read: no driver"]
    assert nvlink_lines(NvlinkReport(speeds={0: {}})) == ["nvlink: no GPU lists a link"]
