"""`ofed_info -s`: the node's MLNX_OFED or DOCA-OFED release, as `opsctl node check` reads it and writes it
for version-drift."""

import subprocess

import pytest

from opsctl.ib.ofed import OfedVersion, parse_ofed_info, read_ofed
from opsctl.nodecheck import metrics_text
from opsctl.nodecheck.run import ofed_dict, ofed_lines

T0 = 1_800_000_000.0


@pytest.mark.parametrize("text,distribution,version", [
    ("MLNX_OFED_LINUX-24.10-1.1.4.0:\n", "MLNX_OFED_LINUX", "24.10-1.1.4.0"),  # -s, MLNX_OFED's documentation
    ("MLNX_OFED_LINUX-5.8-1.0.1.1 (OFED-5.8-1.0.1):\n\nofed-scripts:\n", "MLNX_OFED_LINUX", "5.8-1.0.1.1"),  # no -s
    ("OFED-internal-25.01-0.6.0:\n", "OFED-internal", "25.01-0.6.0"),
])
def test_the_release_is_the_first_word_of_the_first_line(text, distribution, version):
    assert parse_ofed_info(text) == OfedVersion(distribution, version)


@pytest.mark.parametrize("text", ["", "ofed_info: command not understood\n", "MLNX_OFED_LINUX:\n"])
def test_what_it_cannot_read_is_no_version_and_says_so(text):
    found = parse_ofed_info(text)
    assert (found.version, found.distribution) == ("", "")
    assert found.note.startswith("ofed_info -s printed what it does not know")


def test_a_node_without_the_stack_has_no_version_and_writes_no_series():
    def missing(argv, **_):
        raise FileNotFoundError(2, "No such file or directory")
    found = read_ofed("ofed_info", missing)
    assert found == OfedVersion(note="ofed_info -s exited 127: ofed_info: No such file or directory")
    assert "opsctl_node_ofed_info" not in metrics_text([], T0, ofed=found)
    assert ofed_lines(found) == ["ofed not read: ofed_info -s exited 127: ofed_info: No such file or directory"]
    assert ofed_dict(found)["version"] is None


def test_the_release_read_is_one_series_of_the_textfile_and_a_line_of_the_report():
    def answers(argv, **_):
        assert argv == ["/usr/bin/ofed_info", "-s"]
        return subprocess.CompletedProcess(argv, 0, "MLNX_OFED_LINUX-24.10-3.2.5.0:\n", "")
    found = read_ofed("/usr/bin/ofed_info", answers)
    text = metrics_text([], T0, ofed=found)
    assert 'opsctl_node_ofed_info{distribution="MLNX_OFED_LINUX",version="24.10-3.2.5.0"} 1\n' in text
    assert ofed_lines(found) == ["ofed: MLNX_OFED_LINUX 24.10-3.2.5.0"]
    assert ofed_dict(found) == {"distribution": "MLNX_OFED_LINUX", "version": "24.10-3.2.5.0", "note": None}
