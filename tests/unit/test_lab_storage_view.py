"""The lab's emulated storage (opsctl_lab.storage_view) and Lustre tools, read back with opsctl's own
parsers: what `opsctl node check` sees on a lab node, healthy and under each storage fault."""

import stat
from pathlib import Path

import pytest

from opsctl.config import parse_config
from opsctl.storage.check import LnetView, LustreView, judge
from opsctl.storage.lnet import parse_net_show, parse_ping, parse_stats_show
from opsctl.storage.lustre import parse_check_servers, parse_df, parse_imports
from opsctl.storage.mountinfo import parse_mountinfo
from opsctl.storage.mountstats import parse_mountstats
from opsctl.storage.probe import ProbeResult
from opsctl_lab import hung_mount
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.hwtools import lctl, lfs, lnetctl
from opsctl_lab.storage_view import MGS_NID, MOUNTS, mount_dir, write_storage

FIXTURES = Path(__file__).parent.parent / "fixtures" / "lustre"


def view(tmp_path, *faults):
    hw = NodeHardware(node="gpu002")
    for fault in faults:
        hw.inject(fault, now=0.0)
    write_storage(tmp_path / "storage", tmp_path / "mnt", hw)
    return hw


def run_tool(module, argv, hw, monkeypatch, capsys):
    monkeypatch.setattr(module, "load", lambda: hw)
    code = module.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_healthy_node_mounts_home_shared_and_lustre(tmp_path):
    view(tmp_path)
    table = parse_mountinfo((tmp_path / "storage/mountinfo").read_text())
    assert {p: m.fstype for p, m in table.items()} == {
        "/": "ext4", str(tmp_path / "mnt/home"): "nfs4", str(tmp_path / "mnt/shared"): "nfs4",
        str(tmp_path / "mnt/lustre"): "lustre"}
    nfs = parse_mountstats((tmp_path / "storage/mountstats").read_text())
    assert set(nfs) == {str(tmp_path / "mnt/home"), str(tmp_path / "mnt/shared")}
    assert all(0 <= s.retransmissions < 5 for s in nfs.values())
    assert all(mount_dir(tmp_path / "mnt", m.point).is_dir() for m in MOUNTS)


def test_mount_missing_drops_shared_and_nfs_hung_hangs_the_home_mount_point(tmp_path, monkeypatch):
    # The hang is a FUSE mount (root, a holder process: tests/integration/lab/test_lab_storage.py); here, where
    # it goes and when it ends.
    calls = []
    monkeypatch.setattr(hung_mount, "hang", lambda point, pidfile: calls.append(("hang", point, pidfile)))
    monkeypatch.setattr(hung_mount, "release", lambda point, pidfile: calls.append(("release", point, pidfile)))
    hw = view(tmp_path, "mount-missing", "nfs-hung")
    assert str(tmp_path / "mnt/shared") not in parse_mountinfo((tmp_path / "storage/mountinfo").read_text())
    pidfile = tmp_path / "storage/nfs-hung.pid"
    assert calls == [("hang", tmp_path / "mnt/home", pidfile)]
    assert stat.S_IMODE((tmp_path / "mnt/home/.opsctl-probe").stat().st_mode) == 0o1777
    hw.clear()
    write_storage(tmp_path / "storage", tmp_path / "mnt", hw)
    assert calls[1:] == [("release", tmp_path / "mnt/home", pidfile)]
    assert str(tmp_path / "mnt/shared") in parse_mountinfo((tmp_path / "storage/mountinfo").read_text())


@pytest.mark.parametrize("faults, down", [((), []), (("lustre-ost-down",), ["lustre-OST0002"])])
def test_lctl_and_lfs_print_what_opsctl_parses(tmp_path, monkeypatch, capsys, faults, down):
    hw = view(tmp_path, *faults)
    code, out, err = run_tool(lctl, ["get_param", "osc.*.import", "mdc.*.import"], hw, monkeypatch, capsys)
    assert code == 0 and err == ""
    imports = parse_imports(out)
    assert len(imports) == 5 and [i.target for i in imports if not i.healthy] == down
    code, out, err = run_tool(lfs, ["check", "servers"], hw, monkeypatch, capsys)
    assert code == 0  # as lfs: a failed target is a line on stderr, not an exit code
    servers = parse_check_servers(out + err)
    assert [s.target for s in servers if not s.active] == down and len(servers) == 5
    config = parse_config({"storage": {"mounts": [{"path": "/lustre", "fstype": "lustre"}]}}, "t", {}).storage
    table = parse_mountinfo("1 1 0:1 / /lustre rw - lustre 10.10.0.10@o2ib:/lustre rw\n")
    report = judge(config.mounts, {"/lustre": ProbeResult("/lustre", "ok")}, table,
                   LustreView(imports=imports, servers=servers))
    assert [(f.check, f.device) for f in report.findings] == [("lustre-import-down", d) for d in down]


def test_lctl_of_a_parameter_it_does_not_have_fails_as_lctl_does(tmp_path, monkeypatch, capsys):
    hw = view(tmp_path)
    code, out, err = run_tool(lctl, ["get_param", "llite.*.stats"], hw, monkeypatch, capsys)
    assert code == 2 and out == ""
    assert err == "error: get_param: param_path 'llite/*/stats': No such file or directory\n"


def test_the_lab_machines_refuse_storage_faults_they_do_not_emulate_before_any_ssh():
    from opsctl_lab.errors import LabError
    from opsctl_lab.machines import lifecycle

    with pytest.raises(LabError, match=r"^lnet-down is a fault of the simulated lab: `opsctl lab inject`$"):
        lifecycle.inject("gpu2", "lnet-down")


@pytest.mark.parametrize("faults, down", [((), []), (("lnet-down",), ["10.10.1.2@o2ib"])])
def test_lnetctl_and_lctl_ping_print_what_opsctl_parses(tmp_path, monkeypatch, capsys, faults, down):
    hw = view(tmp_path, *faults)  # gpu002: its NID is 10.10.1.2@o2ib
    for argv in (["net", "show"], ["net", "show", "-v"]):
        code, out, err = run_tool(lnetctl, argv, hw, monkeypatch, capsys)
        assert code == 0 and err == ""
        nis = parse_net_show(out)
        assert [(ni.net_type, ni.nid, ni.interfaces) for ni in nis] == [("o2ib", "10.10.1.2@o2ib", ("bond0",))]
        assert [ni.nid for ni in nis if not ni.up] == down
    code, out, err = run_tool(lctl, ["ping", MGS_NID, "1"], hw, monkeypatch, capsys)
    assert code == (1 if down else 0)
    ping = parse_ping(MGS_NID, out + err)
    assert ping.reachable is not down
    assert (out, err) == (("", f"failed to ping {MGS_NID}: Input/output error\n") if down else
                          (f"12345-0@lo\n12345-{MGS_NID}\n", ""))
    code, out, _ = run_tool(lctl, ["list_nids"], hw, monkeypatch, capsys)
    assert (code, out) == (0, "10.10.1.2@o2ib\n")
    config = parse_config({"storage": {"mounts": [{"path": "/lustre", "fstype": "lustre"}]}}, "t", {}).storage
    table = parse_mountinfo("1 1 0:1 / /lustre rw - lustre 10.10.0.10@o2ib:/lustre rw\n")
    report = judge(config.mounts, {"/lustre": ProbeResult("/lustre", "ok")}, table, LustreView(imports=[], servers=[]),
                   lnet=LnetView(nis=nis, pings=[ping]))
    assert [(f.check, f.device) for f in report.findings] == (
        [("lnet-ni-down", "10.10.1.2@o2ib"), ("lustre-mgs-unreachable", MGS_NID)] if down else [])


def test_lnetctl_verbose_is_laid_out_as_the_real_capture_and_stats_parse(tmp_path, monkeypatch, capsys):
    hw = view(tmp_path)
    _, out, _ = run_tool(lnetctl, ["net", "show", "-v"], hw, monkeypatch, capsys)
    # The same keys at the same depths as a real `lnetctl net show -v` (the real one has a tcp NI).
    def keys(text):
        return [line.split(":")[0] for line in text.splitlines() if not line.strip().startswith(
            ("conns_per_peer", "peercredits_hiw", "map_on_demand", "concurrent_sends", "fmr_", "ntx", "0:"))]
    real = (FIXTURES / "lnetctl_net_show_-v_tcp.txt").read_text()
    assert keys(out) == keys(real.split("        - nid: 172.16.0.25@tcp")[0].replace("tcp", "o2ib"))
    code, out, _ = run_tool(lnetctl, ["stats", "show"], hw, monkeypatch, capsys)
    stats = parse_stats_show(out)
    assert code == 0 and list(stats) == list(parse_stats_show((FIXTURES / "lnetctl_stats_show.txt").read_text()))
    assert stats["recv_count"] < stats["send_count"]


def test_lfs_df_prints_the_real_layout_and_leaves_out_the_ost_that_is_down(tmp_path, monkeypatch, capsys):
    hw = view(tmp_path)
    code, out, err = run_tool(lfs, ["df"], hw, monkeypatch, capsys)
    assert code == 0 and err == ""
    (fs,) = parse_df(out)
    assert [t.name for t in fs.targets] == ["lustre-MDT0000"] + [f"lustre-OST000{i}" for i in range(4)]
    assert fs.mount == "/lustre" and fs.summary.blocks_kb == 4 * 61419143168
    assert all(t.flags == "" for t in fs.targets)  # without -v, lfs prints only the flags that are errors
    # Column for column as the real capture: the header, and a row made of its numbers.
    real = (FIXTURES / "lfs_df_exascaler_cloud_24_osts.txt").read_text().splitlines()
    assert out.splitlines()[0] == real[0]
    assert lfs._usage("exacloud-OST000a_UUID", 529449792, 1268, 524063432, "/mnt/exacloud") + "[OST:10]" == real[12]
    assert lfs._usage("filesystem_summary:", 12706795008, 30348, 12577522452, "/mnt/exacloud") == real[-2]

    hw.inject("lustre-ost-down", now=0.0)
    _, out, _ = run_tool(lfs, ["df"], hw, monkeypatch, capsys)
    (fs,) = parse_df(out)
    assert "lustre-OST0002" not in [t.name for t in fs.targets] and fs.summary.blocks_kb == 3 * 61419143168
    _, out, _ = run_tool(lfs, ["df", "-v", "/lustre"], hw, monkeypatch, capsys)
    assert "\nOST0002             : inactive device\n" in out
    (fs,) = parse_df(out)
    assert [(t.name, t.error) for t in fs.targets if not t.answered] == [("lustre-OST0002", "inactive device")]
    assert fs.targets[0].flags == "f"  # the MDT is on flash: a flag only -v prints
    assert out.splitlines()[0] == (FIXTURES / "lfs_df_-v_ost0002_inactive.txt").read_text().splitlines()[0]
