"""`opsctl ib check`: the profile's checks on real captures (tests/fixtures/infiniband, sources in
SOURCES.md) and on the lab's emulated sysfs tree with each fault injected; the command's exit codes."""

import json
import shutil

import pytest
from click.testing import CliRunner

from opsctl.cli import main
from opsctl.clients import Clients
from opsctl.config import parse_config
from opsctl.errors import SourceUnavailable
from opsctl.ib.check import Finding, h200_ndr, judge
from opsctl.ib.collect import capture_snapshot, live_snapshot
from opsctl.ib.report import check_report
from opsctl_lab.hardware import HCA_FW_MISMATCH, NodeHardware
from opsctl_lab.ib_sysfs import write_tree
from tests.conftest import FIXTURES

IB = FIXTURES / "infiniband"
SYSFS_LISTING = IB / "gpud_sys-class-infiniband-h100_fixture.txt"
IBSTAT_ACTIVE = IB / "gpud_ibstat.47.0.h100.all.active.0.txt"
IBSTAT_SOME_DOWN = IB / "gpud_ibstat.47.0.h100.some.down.0.txt"
DEVINFO_ROCE = IB / "ibv_devinfo_cx7_roce_mlx5_0.txt"
T0 = 1_800_000_000.0


def lab_tree(tmp_path, *faults, seconds=10.0):
    """Two snapshots of a lab node's sysfs tree, `seconds` apart, with the faults injected at T0."""
    hw = NodeHardware(node="gpu007")
    for fault, hca in faults:
        hw.inject(fault, hca=hca, now=T0)
    write_tree(tmp_path, hw, now=T0)
    first = live_snapshot(tmp_path)
    write_tree(tmp_path, hw, now=T0 + seconds)
    return first, live_snapshot(tmp_path)


def test_a_healthy_lab_node_passes_every_check(tmp_path):
    first, later = lab_tree(tmp_path)
    report = judge(first, h200_ndr(), later, 10)
    assert report.passed and report.skipped == {}
    assert [p.device for p in report.ports] == [f"mlx5_{i}" for i in range(8)]  # the storage port is not judged
    assert {(p.pcie.current.speed_gts, p.pcie.current.width) for p in report.ports} == {(32.0, 16)}


@pytest.mark.parametrize("fault,check,detail", [
    ("ib-down", "port-state", "state DOWN, expected ACTIVE"),
    ("ib-degraded", "link-rate", "200 Gb/sec (2X NDR), expected 400 Gb/sec (4X NDR)"),
    ("ib-fw-mismatch", "firmware", f"firmware {HCA_FW_MISMATCH}, the other HCAs run 28.41.1000"),
    ("ib-counters", "error-counters", "symbol_error +200"),
    ("pcie-x8", "pcie-link", "PCIe 32 GT/s x8 at 0000:5e:00.0, expected 32 GT/s x16"),
])
def test_each_fault_fails_the_check_naming_its_hca(tmp_path, fault, check, detail):
    first, later = lab_tree(tmp_path, (fault, "mlx5_3"))
    report = judge(first, h200_ndr(), later, 10)
    assert not report.passed
    assert {f.device for f in report.findings} == {"mlx5_3"}
    assert {f.check for f in report.findings} == {check}
    assert any(detail in f.detail for f in report.findings), report.findings


def test_a_down_port_reports_its_physical_state_too(tmp_path):
    first, _ = lab_tree(tmp_path, ("ib-down", "mlx5_1"))
    details = [f.detail for f in judge(first, h200_ndr()).findings]
    assert details == ["state DOWN, expected ACTIVE", "physical state Polling, expected LinkUp"]


def test_the_pinned_firmware_is_required(tmp_path):
    first, later = lab_tree(tmp_path)
    report = judge(first, h200_ndr(firmware="28.43.2026"), later, 10)
    assert {f.device for f in report.findings} == {f"mlx5_{i}" for i in range(8)}
    assert report.findings[0] == Finding("firmware", "mlx5_0", "firmware 28.41.1000, pinned 28.43.2026")


def test_a_missing_peermem_module_and_a_missing_hca_fail_the_node(tmp_path):
    first, later = lab_tree(tmp_path)
    shutil.rmtree(tmp_path / "module" / "nvidia_peermem")
    shutil.rmtree(tmp_path / "class" / "infiniband" / "mlx5_7")
    report = judge(live_snapshot(tmp_path), h200_ndr())
    assert ("kernel-modules", "") in {(f.check, f.device) for f in report.findings}
    assert any(f.check == "hca-count" and f.detail.startswith("7 InfiniBand compute HCAs") for f in report.findings)


def test_real_sysfs_capture_passes_what_it_holds():
    # 8 ConnectX-7 NDR rails (mlx5_0, 1, 4-9: 2 and 3 went into the bond) plus a BlueField-3 Ethernet
    # bond, which the profile does not count.
    report = judge(capture_snapshot(SYSFS_LISTING), h200_ndr(devices="mlx5_[0-9]"))
    assert report.passed and len(report.ports) == 8
    assert set(report.skipped) == {"pcie-link", "kernel-modules", "error-counters"}
    assert {p.rate_text for p in report.ports} == {"400 Gb/sec (4X NDR)"}


def test_the_profile_counts_only_the_rails_it_names():
    report = judge(capture_snapshot(SYSFS_LISTING), h200_ndr())  # mlx5_[0-7]: 8 and 9 are not rails here
    assert [f.check for f in report.findings] == ["hca-count"]
    assert report.findings[0].detail.startswith("6 InfiniBand compute HCAs (mlx5_0, mlx5_1, mlx5_4, ")


def test_real_ibstat_rails_pass_and_its_down_ethernet_ports_are_not_judged():
    # 8 NDR InfiniBand rails and 4 Ethernet ports (three of them Down) on one H100 node.
    rails = "mlx5_(0|3|4|5|6|9|10|11)"
    report = judge(capture_snapshot(IBSTAT_SOME_DOWN), h200_ndr(devices=rails))
    assert report.passed, report.findings
    assert len(report.ports) == 8 and {(p.state, p.rate_gbps, p.firmware) for p in report.ports} == {
        ("ACTIVE", 400.0, "28.39.1002")}
    assert "link-rate" not in report.skipped  # ibstat's number is compared


def test_real_ibstat_of_a_roce_node_fails_the_infiniband_profile():
    report = judge(capture_snapshot(IBSTAT_ACTIVE), h200_ndr(devices="mlx5_([0-9]|1[01])"))
    assert report.ports == [] and len([f for f in report.findings if f.check == "link-layer"]) == 12
    assert report.findings[-1].check == "hca-count"


def test_real_roce_devinfo_is_not_an_infiniband_rail():
    report = judge(capture_snapshot(DEVINFO_ROCE), h200_ndr())
    assert report.ports == []
    assert [f.check for f in report.findings] == ["link-layer", "hca-count"]


@pytest.mark.parametrize("text,named", [
    ("hello\n", "hello"),
    ("mlx5_0/ports/1/state: 9 WEIRD\n", "mlx5_0/ports/1/state"),
    ("mlx5_0/ports/1/rate: fast\n", "mlx5_0/ports/1/rate"),
    ("mlx5_0/ports/1/counters/symbol_error: -1\n", "symbol_error"),
    ("CA 'mlx5_0'\n\tPort 1:\n\t\tState: Sleeping\n", "Sleeping"),
])
def test_unknown_capture_input_is_an_error_naming_it(tmp_path, text, named):
    capture = tmp_path / "capture.txt"
    capture.write_text(text)
    with pytest.raises(SourceUnavailable, match=named):
        judge(capture_snapshot(capture), h200_ndr())


def test_a_copied_class_infiniband_directory_is_a_capture(tmp_path):
    write_tree(tmp_path / "node", NodeHardware(node="gpu001"), now=T0)
    copy = tmp_path / "bundle" / "infiniband-copy"
    shutil.copytree(tmp_path / "node" / "class" / "infiniband", copy, symlinks=True)
    report = judge(capture_snapshot(copy), h200_ndr())
    assert report.passed and len(report.ports) == 8


def invoke(tmp_path, *args, config=None):
    clients = Clients(config=parse_config(config or {}, "test", env={"OPSCTL_STATE_DIR": str(tmp_path)}))
    return CliRunner().invoke(main, ["ib", "check", *args], obj=clients)


def test_command_exit_codes_and_json(tmp_path):
    write_tree(tmp_path / "ok", NodeHardware(node="gpu001"), now=T0)
    passed = invoke(tmp_path, "--sysfs-root", str(tmp_path / "ok"), "--window", "0", "--json")
    assert passed.exit_code == 0, passed.output
    data = json.loads(passed.output)
    assert data["verdict"] == "pass" and len(data["hcas"]) == 8 and data["skipped"] == [
        {"check": "error-counters", "why": "no sampling window"}]
    hw = NodeHardware(node="gpu001")
    hw.inject("ib-down", hca="mlx5_5", now=T0)
    write_tree(tmp_path / "bad", hw, now=T0)
    failed = invoke(tmp_path, "--sysfs-root", str(tmp_path / "bad"), "--window", "0")
    assert failed.exit_code == 1
    assert "port-state: mlx5_5: state DOWN, expected ACTIVE" in failed.output
    assert failed.output.splitlines()[-1].startswith("verdict: FAIL")
    unreadable = invoke(tmp_path, "--sysfs-root", str(tmp_path / "nothing"), "--window", "0")
    assert unreadable.exit_code == 3 and "class/infiniband does not exist" in unreadable.output


def test_config_sets_the_profile_firmware_and_root(tmp_path):
    write_tree(tmp_path / "ok", NodeHardware(node="gpu001"), now=T0)
    pinned = invoke(tmp_path, "--window", "0",
                    config={"ib": {"sysfs_root": str(tmp_path / "ok"), "firmware": "28.41.1000"}})
    assert pinned.exit_code == 0, pinned.output
    config = tmp_path / "config.yaml"
    config.write_text("ib:\n  profile: h100-hdr\n")
    bad = CliRunner().invoke(main, ["ib", "check", "--config", str(config)], obj=Clients())
    assert bad.exit_code == 2 and "config key ib.profile: unknown profile" in bad.output


DGX_RAILS = ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]


def test_the_json_says_which_rails_were_judged_and_how_they_were_found(tmp_path):
    write_tree(tmp_path / "hgx", NodeHardware(node="gpu001"), now=T0)
    data = json.loads(invoke(tmp_path, "--sysfs-root", str(tmp_path / "hgx"), "--window", "0", "--json").output)
    assert data["rails"] == {"source": "discovered", "devices": [f"mlx5_{i}" for i in range(8)],
                             "basis": "link layer and PCIe tree",
                             "not_rails": [{"device": "mlx5_bond_0", "why": "link layer Ethernet"}],
                             "watched": [f"mlx5_{i}" for i in range(8)]}
    pinned = invoke(tmp_path, "--sysfs-root", str(tmp_path / "hgx"), "--window", "0", "--json",
                    config={"ib": {"rails": [f"mlx5_{i}" for i in range(8)]}})
    assert json.loads(pinned.output)["rails"]["source"] == "pinned" and pinned.exit_code == 0


def test_a_dgx_named_lab_node_passes_on_its_discovered_rails_and_fails_the_hgx_pin(tmp_path):
    hw = NodeHardware(node="gpu001")
    hw.inject("dgx-naming", now=T0)
    write_tree(tmp_path / "dgx", hw, now=T0)
    found = invoke(tmp_path, "--sysfs-root", str(tmp_path / "dgx"), "--window", "0")
    assert found.exit_code == 0, found.output
    assert f"rails: {', '.join(DGX_RAILS)} (discovered by link layer and PCIe tree)" in found.output
    assert "not rails: mlx5_1 (no GPU behind its PCIe switch), mlx5_2 (link layer Ethernet)" in found.output
    assert "note: the health rules and fabric-test use ib.rails (mlx5_0, mlx5_1" in found.output
    pinned = invoke(tmp_path, "--sysfs-root", str(tmp_path / "dgx"), "--window", "0", "--json",
                    config={"ib": {"rails": [f"mlx5_{i}" for i in range(8)]}})
    assert pinned.exit_code == 1
    # The HGX names judge the storage ports (HDR, one of them Ethernet) as rails and miss mlx5_9..11.
    assert {(f["check"], f["device"]) for f in json.loads(pinned.output)["findings"]} == {
        ("link-layer", "mlx5_2"), ("hca-count", ""), ("link-rate", "mlx5_1"), ("link-rate", "mlx5_7")}


def test_a_capture_is_judged_on_the_rails_its_link_layer_shows():
    report = check_report(parse_config({}, env={}).ib, None, str(IBSTAT_SOME_DOWN), None, None)
    assert report.rails.devices == tuple(DGX_RAILS) and report.rails.basis.startswith("link layer only")
    assert {p.device for p in report.ports} == set(DGX_RAILS)
