"""opsctl.gpu.kmsg over real kernel log lines (tests/fixtures/kmsg, SOURCES.md): /dev/kmsg records and their
continuation lines, the driver's XID lines with and without a process, NVSwitch SXids, and XID 154's
recovery actions; records that quote the driver's words and are not its lines; and nvidia-smi's index query
(opsctl.gpu.nvidia_smi.parse_gpu_indexes)."""

import re

import pytest

from opsctl.errors import SourceUnavailable
from opsctl.gpu.kmsg import (
    Record,
    canonical_pci,
    ignored_because,
    parse_record,
    parse_records,
    parse_sxid,
    parse_xid,
    recovery_action,
)
from opsctl.gpu.nvidia_smi import parse_gpu_indexes
from tests.conftest import FIXTURES

KMSG = FIXTURES / "kmsg"


def lines(name):
    return (KMSG / name).read_text().splitlines()


# What dmesg and syslog put before a record's message: `[24128.828315] `, `[Sun Feb 23 16:24:18 2025] `, `[...] `,
# `Dec  2 11:38:46 worker4 kernel: [  218.250668] `, `Aug 10 15:36:05 gpu-node-a kernel: `.
DECORATION = re.compile(r"(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ kernel: )?(?:\[[^\]]*\] )?")


def message(line):
    """The record's message of a dmesg or syslog line: the parsers read messages, as /dev/kmsg gives them."""
    return line[DECORATION.match(line).end():]


def xids(name):
    return [x for line in lines(name) if (x := parse_xid(message(line))) is not None]


def test_the_abi_examples_records_without_their_continuation_lines():
    assert parse_records((KMSG / "dev-kmsg_abi_example.txt").read_text()) == [
        Record(160, 424069, "pci_root PNP0A03:00: host bridge window [io  0x0000-0x0cf7] (ignored)", 7),
        Record(339, 5140900, "NET: Registered protocol family 10", 6),
        Record(340, 5690716, "udevd[80]: starting version 181", 30)]


def test_one_read_of_dev_kmsg_is_one_record_its_context_and_unknown_header_fields_left_out():
    raw = "\n".join(lines("dev-kmsg_abi_example.txt")[:3]) + "\n"
    assert parse_record(raw) == Record(160, 424069,
                                       "pci_root PNP0A03:00: host bridge window [io  0x0000-0x0cf7] (ignored)", 7)
    # "Future extensions might add more comma separated values before the terminating ';'" (dev-kmsg ABI).
    assert parse_record("6,339,5140900,-,caller=T42;NET: Registered protocol family 10\n") == Record(
        339, 5140900, "NET: Registered protocol family 10", 6)


def test_only_facility_0_is_the_kernel_udevd_and_a_program_writing_to_dev_kmsg_are_not():
    records = parse_records((KMSG / "dev-kmsg_abi_example.txt").read_text())
    assert [r.from_kernel for r in records] == [True, True, False]  # udevd's is facility 3 (LOG_DAEMON)
    # What `echo '<4>NVRM: Xid ...' > /dev/kmsg` makes: the kernel sets facility 1 (LOG_USER), never 0.
    assert not parse_record("12,7,1,-;NVRM: Xid (PCI:0000:55:00): 79, GPU has fallen off the bus.").from_kernel


def test_a_node_with_nvswitches_holds_records_in_sequence_and_no_xid():
    records = parse_records((KMSG / "gpud_kmsg.1.log").read_text())
    assert [r.seq for r in records] == list(range(3964, 4011))
    assert records[-1] == Record(4010, 57631398464,
                                 "IPv6: ADDRCONF(NETDEV_CHANGE): calic24dd7712a6: link becomes ready", 6)
    assert all(r.from_kernel for r in records)
    assert [r for r in records if parse_xid(r.message) or parse_sxid(r.message)] == []


def test_defect_1_a_kernel_record_that_quotes_the_drivers_text_is_no_xid_or_sxid():
    """Real records (kmsg_quoted_driver_text.txt): a file named like an XID line exec'd with an empty argv, the
    segfault of a program of that name, an audit message and two lines a program wrote to /dev/kmsg. None is
    the driver's: its message does not begin with the driver's prefix and address, or it is not the kernel's."""
    records = parse_records((KMSG / "kmsg_quoted_driver_text.txt").read_text())
    kernels = [r for r in records if r.from_kernel]  # the last two are a program's: their facility tells them apart
    assert [r.seq for r in kernels] == [1289, 1290, 1292]
    assert [(r.seq, x.code) for r in kernels if (x := parse_xid(r.message))] == []
    assert [(r.seq, s.code) for r in kernels if (s := parse_sxid(r.message))] == []


def test_why_a_record_with_the_drivers_words_is_not_its_line():
    records = parse_records((KMSG / "kmsg_quoted_driver_text.txt").read_text())
    assert [ignored_because(r) for r in records] == ["quoted", "quoted", "quoted", "userspace", "userspace"]
    # The driver's own lines, counted or not (an SXid's detail), and records without its words are not ignored.
    driver = parse_records((KMSG / "kmsg_h200_node.txt").read_text())
    assert [r.seq for r in driver if ignored_because(r)] == []
    assert [r.seq for r in driver if "SXid" in r.message and not parse_sxid(r.message)] == [1205]
    # A record whose message begins with the driver's words but not its address: a process named by them.
    assert ignored_because(Record(1, 1, "nvidia-nvswitch0: SXid[77]: segfault at 0 ip 0 sp 0 error 6", 6)) == "quoted"


@pytest.mark.parametrize("line", [" SUBSYSTEM=acpi", " DEVICE=+acpi:PNP0A03:00", "", "garbage", "6,339;no usec",
                                  "6,x,5140900,-;not a sequence number", "[ 812.345] NVRM: Xid in dmesg form"])
def test_what_is_no_record_is_skipped(line):
    assert parse_record(line) is None
    assert parse_records(f"6,1,2,-;first\n{line}\n6,3,4,-;last\n") == [Record(1, 2, "first", 6),
                                                                          Record(3, 4, "last", 6)]


def test_xid_with_pid_and_name():
    found = xids("gpud_dmesg-with-xid-119.log")
    assert [(x.pci, x.code, x.pid, x.process) for x in found] == [
        ("00000000:9B:00.0", 119, 2024380, "nvidia-smi"), ("00000000:9B:00.0", 119, 2024380, "nvidia-smi"),
        ("00000000:9B:00.0", 119, 2024380, "nvidia-smi"), ("00000000:9B:00.0", 119, 1263500, "cache_mgr_main"),
        ("00000000:9B:00.0", 119, 1240590, "gpud")]
    assert found[0].text == ("Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 103 "
                             "(GSP_RM_ALLOC) (0x2081 0x4).")


def test_xid_whose_process_the_driver_does_not_know():
    assert [(x.code, x.pid, x.process, x.text[:40]) for x in xids("gpu-operator-1146_xid48_xid64.txt")] == [
        (48, None, None, "An uncorrectable double bit error (DBE) "),
        (64, None, None, "Dynamic Page Retirement: Blacklisting fa")]


def test_xid_without_pid_and_name_as_older_drivers_print_it():
    assert [(x.pci, x.code, x.pid, x.process, x.text) for x in xids("bumblebee-677_xid32_xid31.txt")] == [
        ("00000000:01:00.0", 32, None, None, "Channel ID 00000000 intr 00004000"),
        ("00000000:01:00.0", 32, None, None, "Channel ID 00000000 intr 00004000"),
        ("00000000:01:00.0", 31, None, None, "Ch 00000003, engmask 00000101, intr 10000000")]
    both = xids("journalctl_xid48_171_63_154.txt")
    assert [(x.code, x.pid, x.process) for x in both] == [(48, None, None), (171, None, None), (48, 2187734, "python"),
                                                          (63, 2187734, "python"), (154, None, None)]
    assert both[0].text == ("An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at "
                            "physAddr 0xe9b9107e0 partition 3, subpartition 0.")


def test_gpuds_test_lines_no_xid_and_the_fallen_off_the_bus_line_are_not_counted():
    """The driver prints `NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.` after (not instead of) its
    XID 79 line (gpud_sxid_readme_xid79_sxid20034.txt): counting both would count one XID twice."""
    found = {line: parse_xid(message(line)) for line in lines("gpud_xid_kmsg_test_lines.txt")}
    assert [line for line, x in found.items() if x is None] == [
        "Regular log content without Xid errors", "NVRM: Xid error: xyz, invalid data",
        "Regular log content without Xid", "NVRM: Xid (invalid): some error",
        "NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.", "NVRM: GPU 18:00.0: GPU has fallen off the bus."]
    assert sorted({(x.pci, x.code) for x in found.values() if x}) == [
        ("00000000:01:00.0", 79), ("00000000:03:00.0", 14), ("00000000:05:00.0", 79), ("00000008:01:00.0", 149),
        ("00000008:01:00.0", 154), ("00000009:01:00.0", 149), ("00000009:01:00.0", 154), ("00000018:01:00.0", 154),
        ("00000019:01:00.0", 154)]


def test_xid_of_a_mig_instance_names_the_gpu():
    # Written from kernel_rc.c's format:
    # "NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u): %d, pid=%s, name=%s, %s"
    xid = parse_xid("NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 13, pid=4242, name=python3, Graphics Exception")
    assert (xid.pci, xid.code, xid.pid, xid.process, xid.text) == ("00000000:3B:00.0", 13, 4242, "python3",
                                                                   "Graphics Exception")


def test_sxid_fatal_and_non_fatal_counted_on_their_first_line_only():
    readme = [s for line in lines("gpud_sxid_readme_xid79_sxid20034.txt") if (s := parse_sxid(message(line)))]
    assert [(s.pci, s.code, s.fatal, s.text) for s in readme] == [
        ("00000000:06:00.0", 20034, True, "Link 48 LTSSM Fault Up"),
        ("00000000:05:00.0", 20034, True, "Link 63 LTSSM Fault Up"),
        ("00000000:07:00.0", 20034, True, "Link 37 LTSSM Fault Up"),
        ("00000000:05:00.0", 20034, True, "Link 62 LTSSM Fault Up")]  # not the Severity and Data lines
    found = {line: parse_sxid(message(line)) for line in lines("gpud_sxid_kmsg_test_lines.txt")}
    assert [(s.pci, s.code, s.fatal, s.text) for s in found.values() if s] == [
        ("00000000:05:00.0", 12028, False, "Link 32 egress non-posted PRIV error (First)"),
        ("00000000:00:00.0", 20034, True, "Link 30 LTSSM Fault Up"),
        ("00000000:05:00.0", 12028, False, "Link 32 egress non-posted PRIV error"),
        ("00000000:05:00.0", 12028, False, "Link 32 egress non-posted PRIV error"),
        ("00000000:00:00.0", 20034, True, "Link 30 LTSSM Fault Up")]
    assert sum(s is None for s in found.values()) == 6
    assert all(parse_xid(message(line)) is None for line in found)  # an SXid is no XID


@pytest.mark.parametrize("name,actions", [
    ("gpud_xid_kmsg_test_lines.txt", ["drain_and_reset", "reset", "reset", "reset"]),
    ("h100_dmesg_xid13_31_119_154.txt", ["reset"]),
    ("journalctl_xid48_171_63_154.txt", ["drain_and_reset"]),
    ("xid154_reboot_and_flr_pages.txt", ["reboot", "reboot", "reset"]),  # Node Reboot Required, OS Reboot, PF FLR
])
def test_xid_154_recovery_actions_of_real_lines(name, actions):
    found = xids(name)
    assert [x.recovery_action for x in found if x.code == 154] == actions
    assert {x.recovery_action for x in found if x.code != 154} <= {None}


@pytest.mark.parametrize("text,action", [
    # Written in the format of the real lines above, for the codes and texts no capture here shows.
    ("GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", "none"),
    ("GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)", "drain_p2p"),
    ("GPU recovery action changed from None to Node Reboot Required", "reboot"),  # no code: by its words
    ("GPU recovery action changed from 0x0 (None) to 0x7 (System Reboot)", "reboot"),  # a newer code: by its words
    ("GPU recovery action changed from 0x0 (None) to 0x5 (Recover IMEX Domain)", None),  # none of the five
    ("Channel 00000001", None),
])
def test_recovery_action_by_code_then_by_words(text, action):
    assert recovery_action(text) == action


@pytest.mark.parametrize("address,canonical", [
    ("PCI:0000:18:00", "00000000:18:00.0"), ("0000:9b:00", "00000000:9B:00.0"), ("0018:01:00", "00000018:01:00.0"),
    ("00000000:1A:00.0", "00000000:1A:00.0"), ("PCI:0000:c7:00.0", "00000000:C7:00.0"), ("18:00.0", "00000000:18:00.0"),
    ("invalid", None), ("0000:18", None), ("0000:18:00.9", None),
])
def test_one_canonical_pci_form_as_nvidia_smi_prints_it(address, canonical):
    assert canonical_pci(address) == canonical


def test_gpu_indexes_from_nvidia_smi_and_a_gpu_it_cannot_reach():
    # The index and pci.bus_id columns of the real H200 capture (tests/fixtures/gpu), and the line nvidia-smi
    # prints for a GPU that fell off the bus (rc 15, tests/unit/test_hw_facts.py).
    text = "Unable to determine the device handle for GPU0000:DB:00.0: Unknown Error\n0, 00000000:83:00.0\n"
    assert parse_gpu_indexes(text) == {"00000000:83:00.0": 0}
    with pytest.raises(SourceUnavailable, match="no index and PCI bus id"):
        parse_gpu_indexes("0, [N/A]\n")
