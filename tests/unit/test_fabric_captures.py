"""PCIe links, perfquery counters, mlxup/mlxlink and link flaps, on real captures (tests/fixtures/infiniband/,
sources in tests/fixtures/SOURCES.md), this project's own fixtures in the same formats, and broken input."""

import re
from datetime import datetime
from pathlib import Path

import pytest

from opsctl.errors import SourceUnavailable
from opsctl.fabric.linkflap import count_link_flaps, parse_carrier_events
from opsctl.fabric.mellanox_tools import process_mlxlink_output, process_mlxup_output
from opsctl.fabric.pcie import (
    Mlx5PcieLimit,
    PcieLink,
    PcieLinkStatus,
    parse_link_speed,
    parse_link_width,
    process_lspci_vv_output,
    process_mlx5_pcie_dmesg,
    read_sysfs_pcie_link,
)
from opsctl.fabric.perfquery import PerfqueryCounters, process_perfquery_output
from tests.conftest import FIXTURES

IB = FIXTURES / "infiniband"
LSPCI_CX7 = (IB / "lspci-vvv_connectx7_block.txt").read_text()
LSPCI_X8 = (IB / "lspci-vvv_connectx7_x8_downgraded.txt").read_text()  # own
LSPCI_GEN4 = (IB / "lspci-vvv_connectx6_gen4_x16.txt").read_text()  # own
DMESG_LIMITED = (IB / "imbue_dmesg_mlx5_pcie_limited_line.txt").read_text()
DMESG_OWN = (IB / "dmesg_mlx5_pcie_bandwidth.txt").read_text()  # own
PERFQUERY_EXT = (IB / "infiniband_exporter_perfquery_perfquery_0x506b4b03005c2740.out.txt").read_text()
PERFQUERY_RCV = (IB / "infiniband_exporter_perfquery_perfquery-rcv-error_0x7cfe9003009ce5b0-1.out.txt").read_text()
TRANSCRIPT = (IB / "cx7_ndr_lspci_mlxup_mlxlink_b2b.txt").read_text()
MLXUP_OWN = (IB / "mlxup_query_two_connectx7.txt").read_text()  # own
LINKFLAP = (IB / "azurehpc_nhc_ib_linkflap_syslog_sample.txt").read_text()
SYSLOG_OWN = (IB / "syslog_networkd_carrier_ib0_ib3.txt").read_text()  # own

MLXUP_COMMAND = "sudo mlxup -d 0000:8e:00.0"
MLXLINK_COMMAND = "sudo mlxlink -d /dev/mst/mt4129_pciconf0 --show_mo"
_PROMPT = re.compile(r"^\S+@\S+:\S*\$ (.+)$")


def transcript_outputs(text: str) -> dict[str, str]:
    """The console transcript split at its prompts ("vyl@csegpu2:~$ <command>"): command -> what it printed."""
    outputs: dict[str, str] = {}
    command = None
    for line in text.splitlines(keepends=True):
        if match := _PROMPT.match(line.rstrip("\n")):
            command = match[1]
            outputs[command] = ""
        elif command is not None:
            outputs[command] += line
    return outputs


def mlxlink_output() -> str:
    """mlxlink's part of the transcript, less the "..." with which the source cut its last section."""
    text = transcript_outputs(TRANSCRIPT)[MLXLINK_COMMAND]
    assert text.endswith("Troubleshooting Info\n--------------------\n...\n")
    return text.removesuffix("...\n")


# --- PCIe -----------------------------------------------------------------------------------------


def test_lspci_real_connectx7_gen5_x16():
    assert process_lspci_vv_output(LSPCI_CX7) == [PcieLinkStatus(
        address="1a:00.0", current=PcieLink(32.0, 16), maximum=PcieLink(32.0, 16),
        description="Ethernet controller: Mellanox Technologies MT2910 Family [ConnectX-7]")]


def test_lspci_own_x8_downgraded_and_devices_without_link_skipped():
    records = process_lspci_vv_output(LSPCI_X8)
    # 00:00.0 (Root Complex Integrated Endpoint) and 00:1f.5 (no Express capability) have no link
    assert [(r.address, r.current, r.maximum) for r in records] == [
        ("0000:97:01.0", PcieLink(32.0, 8), PcieLink(32.0, 8)),
        ("0000:9c:00.0", PcieLink(32.0, 8), PcieLink(32.0, 16))]
    assert records[1].description == "Infiniband controller: Mellanox Technologies MT2910 Family [ConnectX-7]"


def test_lspci_own_gen4():
    assert [(r.address, r.current, r.maximum) for r in process_lspci_vv_output(LSPCI_GEN4)] == [
        ("0000:17:00.0", PcieLink(16.0, 16), PcieLink(16.0, 16))]


def _lspci_block(lnkcap: str, lnksta: str) -> str:
    return ("3b:00.0 Infiniband controller: Mellanox Technologies MT28908 Family [ConnectX-6]\n"
            "\tCapabilities: [60] Express (v2) Endpoint, MSI 00\n"
            f"\t\tLnkCap:\t{lnkcap}\n\t\tLnkSta:\t{lnksta}\n")


@pytest.mark.parametrize("lnkcap,lnksta,current,maximum", [
    # older pciutils: the flags on the LnkSta line, no qualifier
    ("Port #8, Speed 8GT/s, Width x16, ASPM L0s L1, Exit Latency L0s <512ns, L1 <4us",
     "Speed 8GT/s, Width x16, TrErr- Train- SlotClk+ DLActive- BWMgmt- ABWMgmt-", (8.0, 16), (8.0, 16)),
    ("Port #0, Speed 16GT/s, Width x16, ASPM not supported",
     "Speed 2.5GT/s (downgraded), Width x1 (downgraded)", (2.5, 1), (16.0, 16)),
    ("Port #0, Speed 5GT/s, Width x4, ASPM L0s", "Speed 5GT/s (ok), Width x4 (ok)", (5.0, 4), (5.0, 4)),
    ("Port #0, Speed 64GT/s, Width x16, ASPM not supported", "Speed 64GT/s, Width x16", (64.0, 16), (64.0, 16)),
])
def test_lspci_link_forms(lnkcap, lnksta, current, maximum):
    [record] = process_lspci_vv_output(_lspci_block(lnkcap, lnksta))
    assert (record.current, record.maximum) == (PcieLink(*current), PcieLink(*maximum))


def test_lspci_empty_is_no_device():
    assert process_lspci_vv_output("") == []


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


def test_dmesg_real_limited_line():
    assert process_mlx5_pcie_dmesg(DMESG_LIMITED) == [Mlx5PcieLimit(
        device="0000:9c:00.0", available_gbps=252.056, limited_by=PcieLink(32.0, 8),
        limiting_address="0000:97:01.0", capable_gbps=504.112, capable=PcieLink(32.0, 16))]


def test_dmesg_own_mlx5_lines_among_others():
    assert process_mlx5_pcie_dmesg(DMESG_OWN) == [
        Mlx5PcieLimit("0000:8e:00.0", 504.112, None, None, 504.112, PcieLink(32.0, 16)),
        Mlx5PcieLimit("0000:9c:00.0", 252.056, PcieLink(32.0, 8), "0000:97:01.0", 504.112, PcieLink(32.0, 16)),
        # the nvme line is another driver's; "<unknown>" is the kernel's name for a device it could not find
        Mlx5PcieLimit("0000:d1:00.0", 126.024, PcieLink(16.0, 8), None, 504.112, PcieLink(32.0, 16))]


def test_dmesg_kernel_before_pci_speed_string():
    line = "[    9.112233] mlx5_core 0000:3b:00.0: 63.008 Gb/s available PCIe bandwidth (8 GT/s x8 link)\n"
    assert process_mlx5_pcie_dmesg(line) == [
        Mlx5PcieLimit("0000:3b:00.0", 63.008, None, None, 63.008, PcieLink(8.0, 8))]


def test_dmesg_without_the_line_is_empty():
    assert process_mlx5_pcie_dmesg("[   17.962710] mlx5_core 0000:8e:00.0: firmware version: 28.39.1002\n") == []


# --- perfquery ------------------------------------------------------------------------------------

EXT_COUNTERS = {
    "PortSelect": 1, "CounterSelect": 0, "PortXmitData": 178791657177235, "PortRcvData": 178762341961629,
    "PortXmitPkts": 393094651266, "PortRcvPkts": 387654829341, "PortUnicastXmitPkts": 387471005571,
    "PortUnicastRcvPkts": 387648134400, "PortMulticastXmitPkts": 5623645694, "PortMulticastRcvPkts": 6694940,
    "CounterSelect2": 0, "SymbolErrorCounter": 0, "LinkErrorRecoveryCounter": 0, "LinkDownedCounter": 1,
    "PortRcvErrors": 0, "PortRcvRemotePhysicalErrors": 0, "PortRcvSwitchRelayErrors": 7, "PortXmitDiscards": 20046,
    "PortXmitConstraintErrors": 0, "PortRcvConstraintErrors": 0, "LocalLinkIntegrityErrors": 0,
    "ExcessiveBufferOverrunErrors": 0, "VL15Dropped": 0, "PortXmitWait": 41864608, "QP1Dropped": 0}
RCV_COUNTERS = {"PortSelect": 1, "CounterSelect": 0, "PortLocalPhysicalErrors": 0, "PortMalformedPktErrors": 0,
                "PortBufferOverrunErrors": 0, "PortDLIDMappingErrors": 0, "PortVLMappingErrors": 0,
                "PortLoopingErrors": 0}


def test_perfquery_real_extended():
    assert process_perfquery_output(PERFQUERY_EXT) == [PerfqueryCounters(
        kind="Port extended", lid=2052, port=1, cap_mask=0x5300, cap_mask2=0x2, counters=EXT_COUNTERS)]


def test_perfquery_real_rcv_error_details():
    assert process_perfquery_output(PERFQUERY_RCV) == [PerfqueryCounters(
        kind="PortRcvErrorDetails", lid=1719, port=1, cap_mask=None, cap_mask2=None, counters=RCV_COUNTERS)]


def test_perfquery_several_blocks():
    blocks = process_perfquery_output(PERFQUERY_EXT + PERFQUERY_RCV)
    assert [(b.kind, b.lid, len(b.counters)) for b in blocks] == [("Port extended", 2052, 25),
                                                                  ("PortRcvErrorDetails", 1719, 8)]


def test_perfquery_hex_counter_is_its_int():
    text = "# Port counters: Lid 1 port 1 (CapMask: 0x1600)\nPortSelect:......................1\n" \
           "CounterSelect:...................0x1b01\n"
    [block] = process_perfquery_output(text)
    assert (block.kind, block.cap_mask, block.counters) == ("Port", 0x1600, {"PortSelect": 1, "CounterSelect": 0x1B01})


# --- mlxup, mlxlink -------------------------------------------------------------------------------


def test_transcript_holds_the_commands():
    assert list(transcript_outputs(TRANSCRIPT)) == ["lspci |grep mellanox -i", "which mlxup", MLXUP_COMMAND,
                                                    MLXLINK_COMMAND]


def test_mlxup_real():
    [device] = process_mlxup_output(transcript_outputs(TRANSCRIPT)[MLXUP_COMMAND])
    assert (device.device_type, device.part_number, device.psid, device.pci_device_name, device.base_guid) == (
        "ConnectX7", "MCX75310AAS-NEA_Ax", "MT_0000000838", "0000:8e:00.0", "9c63c00300abed5a")
    assert (device.firmware_current, device.firmware_available, device.firmware_running, device.status) == (
        "28.47.1026", "28.47.1026", "28.46.3048", "Up to date")
    assert device.versions == {"FW": ("28.47.1026", "28.47.1026"), "FW (Running)": ("28.46.3048", None),
                               "PXE": ("3.8.0100", None), "UEFI": ("14.39.0014", None)}
    assert device.description.startswith("NVIDIA ConnectX-7 HHHL Adapter card; 400GbE / NDR IB (default mode);")
    assert device.fields["Base MAC"] == "9c63c0abed5a"


def test_mlxup_own_two_devices():
    first, second = process_mlxup_output(MLXUP_OWN)
    assert (first.pci_device_name, first.firmware_current, first.firmware_available, first.firmware_running,
            first.status) == ("0000:1a:00.0", "28.39.1002", "28.43.2026", "28.39.1002", "Update required")
    assert (second.pci_device_name, second.firmware_current, second.firmware_running, second.status) == (
        "0000:9c:00.0", "28.43.2026", "28.39.1002", "Up to date")


def test_mlxlink_real():
    info = process_mlxlink_output(mlxlink_output())
    assert (info.state, info.physical_state, info.speed, info.width, info.fec) == (
        "Active", "LinkUp", "IB-NDR", 4, "Ethernet_Consortium_LL_50G_RS_FEC_PLR -(272,257+1)")
    assert info.sections["Operational Info"]["Auto Negotiation"] == "ON"
    assert info.sections["Supported Info"] == {"Enabled Link Speed": "0x000000f1 (NDR,HDR,EDR,FDR,SDR)",
                                               "Supported Cable Speed": "0x000000f1 (NDR,HDR,EDR,FDR,SDR)"}
    assert info.sections["Troubleshooting Info"] == {}


def test_mlxlink_colour_codes_are_removed():
    coloured = mlxlink_output().replace("Active ", "\x1b[32mActive\x1b[0m ")
    assert process_mlxlink_output(coloured).state == "Active"


# --- link flaps -----------------------------------------------------------------------------------


def test_linkflap_real_six_flaps_of_ib6():
    assert count_link_flaps(LINKFLAP) == {"ib6": 6}
    events = parse_carrier_events(LINKFLAP, now=datetime(2024, 8, 17, 7, 0))
    assert [(e.time, e.lost) for e in events].count((datetime(2024, 8, 17, 6, 18, 6), True)) == 5
    assert (len(events), sum(e.lost for e in events), {e.interface for e in events}) == (12, 6, {"ib6"})


def test_linkflap_real_window():
    now = datetime(2024, 8, 17, 7, 0)
    assert count_link_flaps(LINKFLAP, start=datetime(2024, 8, 17, 6, 18, 2), now=now) == {"ib6": 5}
    assert count_link_flaps(LINKFLAP, start=datetime(2024, 8, 17, 6, 30), now=now) == {"ib6": 0}


def test_linkflap_own_two_interfaces_across_new_year():
    now = datetime(2025, 1, 1, 6, 0)
    assert count_link_flaps(SYSLOG_OWN, now=now) == {"ib3": 1, "ib0": 2}
    assert parse_carrier_events(SYSLOG_OWN, now=now)[0].time == datetime(2024, 12, 31, 23, 59, 58)
    assert count_link_flaps(SYSLOG_OWN, start=datetime(2024, 12, 31, 23, 0), now=now) == {"ib3": 1, "ib0": 2}
    assert count_link_flaps(SYSLOG_OWN, start=datetime(2025, 1, 1, 0, 0), now=now) == {"ib3": 0, "ib0": 2}
    assert count_link_flaps(SYSLOG_OWN, start=datetime(2025, 1, 1, 5, 0), now=now) == {"ib3": 0, "ib0": 1}


def test_linkflap_rfc3339_timestamps():
    text = ("2024-08-17T06:18:01.123456+00:00 gpu017 systemd-networkd[1187]: ib0: Lost carrier\n"
            "2024-08-17T06:18:05+0000 gpu017 systemd-networkd[1187]: ib0: Gained carrier\n")
    assert [(e.time, e.lost) for e in parse_carrier_events(text, now=datetime(2024, 8, 18))] == [
        (datetime(2024, 8, 17, 6, 18, 1, 123456), True), (datetime(2024, 8, 17, 6, 18, 5), False)]
    assert count_link_flaps(text, start=datetime(2024, 8, 17, 6, 18, 2), now=datetime(2024, 8, 18)) == {"ib0": 0}


def test_linkflap_nothing_from_networkd_is_no_interface():
    assert count_link_flaps("Aug 17 00:00:24 jplc7eb7-vm-0 systemd[1]: Finished Rotate log files.\n") == {}


# --- broken input: an error that names what it could not read --------------------------------------

_CX7_LINES = LSPCI_CX7.splitlines(keepends=True)
_DMESG_LINE = DMESG_LIMITED.rstrip("\n")


@pytest.mark.parametrize("parser,text,named", [
    (process_lspci_vv_output, _lspci_block("Port #0, Speed 32GT/s, Width x16, ASPM not supported",
                                           "Speed unknown, Width x0"), "Speed unknown, Width x0"),
    (process_lspci_vv_output, _lspci_block("Port #0, Speed 32GT/s, Width x16, ASPM not supported",
                                           "Speed 32GT/s (slow), Width x16"), "LnkSta:\\tSpeed 32GT/s (slow)"),
    (process_lspci_vv_output, _lspci_block("Speed 32GT/s, Width x16", "Speed 32GT/s, Width x16"),
     "LnkCap:\\tSpeed 32GT/s, Width x16"),
    (process_lspci_vv_output, "".join(_CX7_LINES[:20]), "1a:00.0: LnkSta missing"),  # cut after LnkCap
    (process_lspci_vv_output, "".join(_CX7_LINES[:12]), "1a:00.0: Express 'Endpoint' without"),  # cut before
    (process_lspci_vv_output, "1a:00.0 Ethernet controller: Mellanox Technologies MT2910 Family [ConnectX-7]\n"
     "\tCapabilities: <access denied>\n", "<access denied>"),
    (process_lspci_vv_output, "vyl@csegpu1:~$ sudo lspci -vvv\n" + LSPCI_CX7, "vyl@csegpu1:~$ sudo lspci -vvv"),
    (process_mlx5_pcie_dmesg, _DMESG_LINE[:120] + "\n", _DMESG_LINE[:120]),
    (process_mlx5_pcie_dmesg, _DMESG_LINE.replace("32.0 GT/s PCIe x8", "Unknown speed x8"), "'Unknown speed'"),
    (process_perfquery_output, "", "no '# ... counters:' header"),
    (process_perfquery_output, PERFQUERY_EXT.splitlines()[0] + "\n", "no counters under 'Port extended'"),
    (process_perfquery_output, PERFQUERY_EXT.replace("PortXmitWait:....................41864608",
                                                     "PortXmitWait:......"), "PortXmitWait:......"),
    (process_perfquery_output, PERFQUERY_RCV.splitlines(keepends=True)[1] + PERFQUERY_RCV, "PortSelect:....."),
    (process_perfquery_output, "# Port counters: DR path slid 0; dlid 0; 0,1 port 1\nPortSelect:....1\n",
     "DR path slid 0"),
    (process_perfquery_output, "cannot query PortXmitDataSL# PortXmitDataSL counters: Lid 3 port 1\n",
     "cannot query"),
    (process_mlxup_output, "", "no 'Device #'"),
    (process_mlxup_output, transcript_outputs(TRANSCRIPT)[MLXUP_COMMAND].split("  PSID:")[0],
     "device #1 has no 'PSID'"),
    (process_mlxup_output, transcript_outputs(TRANSCRIPT)[MLXUP_COMMAND].split("     PXE")[0].replace(
        "     FW  ", "     XX  "), "device #1 has no FW version row"),
    (process_mlxup_output, transcript_outputs(TRANSCRIPT)[MLXUP_COMMAND] + "unexpected trailing text\n",
     "unexpected trailing text"),
    (process_mlxlink_output, transcript_outputs(TRANSCRIPT)[MLXLINK_COMMAND], "'...'"),
    (process_mlxlink_output, mlxlink_output().split("Width")[0], "no 'Width' line"),
    (process_mlxlink_output, mlxlink_output().replace("4x", "4"), "unknown Width '4'"),
    (process_mlxlink_output, "Supported Info\n--------------\nEnabled Link Speed : 0x000000f1\n",
     "no 'Operational Info'"),
    (count_link_flaps, "Aug 17 06:18:01 host systemd-networkd[5398]: ib6: carrier lost\n", "ib6: carrier lost"),
    (count_link_flaps, LINKFLAP.splitlines()[2][:-4] + "\n", "ib6: lost car'"),
    (count_link_flaps, "Aug 17 06:18:01 host systemd-networkd: ib6: lost carrier\n", "systemd-networkd: ib6"),
    (count_link_flaps, "Aug 17 06:18:01 host systemd-networkd[5398]: ib6 lost carrier\n", "ib6 lost carrier"),
])
def test_unknown_or_cut_input_is_a_source_error_naming_it(parser, text, named):
    with pytest.raises(SourceUnavailable, match=re.escape(named)):
        parser(text)
