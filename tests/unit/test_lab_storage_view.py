"""The lab's emulated storage (opsctl_lab.storage_view) and Lustre tools, read back with opsctl's own
parsers: what `opsctl node check` sees on a lab node, healthy and under each storage fault."""

import stat

import pytest

from opsctl.config import parse_config
from opsctl.storage.check import LustreView, judge
from opsctl.storage.lustre import parse_check_servers, parse_imports
from opsctl.storage.mountinfo import parse_mountinfo
from opsctl.storage.mountstats import parse_mountstats
from opsctl.storage.probe import ProbeResult
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.hwtools import lctl, lfs
from opsctl_lab.storage_view import MOUNTS, mount_dir, write_storage


def view(tmp_path, *faults):
    hw = NodeHardware(node="gpu002")
    for fault in faults:
        hw.inject(fault, now=0.0)
    write_storage(tmp_path / "storage", tmp_path / "mnt", hw, host="gpu002")
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


def test_mount_missing_drops_shared_and_nfs_hung_puts_a_fifo_where_the_probe_goes(tmp_path):
    hw = view(tmp_path, "mount-missing", "nfs-hung")
    assert str(tmp_path / "mnt/shared") not in parse_mountinfo((tmp_path / "storage/mountinfo").read_text())
    fifo = tmp_path / "mnt/home/.opsctl-probe/.opsctl-probe-gpu002"
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    hw.clear()
    write_storage(tmp_path / "storage", tmp_path / "mnt", hw, host="gpu002")
    assert not fifo.exists()
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

    with pytest.raises(LabError, match=r"^nfs-hung is a fault of the simulated lab: `opsctl lab inject`$"):
        lifecycle.inject("gpu2", "nfs-hung")
