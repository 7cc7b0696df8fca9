"""The storage readers on real captures (tests/fixtures/lustre, tests/fixtures/storage; SOURCES.md names
each): /proc/self/mountinfo, /proc/self/mountstats, `lctl get_param *.import`, `lfs check servers` and
`lfs df`.
Input a reader does not know is an error naming the line."""

from pathlib import Path

import pytest

from opsctl.errors import SourceUnavailable
from opsctl.storage.lustre import parse_check_servers, parse_df, parse_imports, target_name
from opsctl.storage.mountinfo import parse_mountinfo
from opsctl.storage.mountstats import parse_mountstats

FIXTURES = Path(__file__).parent.parent / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_mountinfo_finds_nfs4_and_the_later_of_two_mounts_on_one_point():
    lines = fixture("storage/mountinfo_procfs_fixture_nfs4.txt").splitlines()
    mounts = parse_mountinfo("\n".join(lines[1:]))
    assert mounts["/"].fstype == "ext4" and mounts["/"].source == "/dev/sda1"
    # The NFSv3 mount was made last on /mnt/nfs/test, so it is the one a path reaches.
    assert (mounts["/mnt/nfs/test"].fstype, mounts["/mnt/nfs/test"].source) == ("nfs", "192.168.1.1:/srv/test")


def test_mountinfo_with_an_empty_field_is_an_error_naming_the_line():
    with pytest.raises(SourceUnavailable, match=r"^mountinfo line 1: not a mountinfo line: '1 1 0:5 /  /root"):
        parse_mountinfo(fixture("storage/mountinfo_procfs_fixture_nfs4.txt"))


def test_mountinfo_of_a_lustre_client_and_escaped_spaces():
    mounts = parse_mountinfo(fixture("storage/mountinfo_gpud_lustre.txt")
                             + "2600 2357 0:101 / /projects/team\\040a rw shared:601 - nfs4 10.0.0.5:/a rw\n")
    assert (mounts["/lustre/fs1"].fstype, mounts["/lustre/fs1"].source) == ("lustre", "172.16.0.100@tcp:/lustrefs")
    assert mounts["/projects/team a"].fstype == "nfs4"


def test_mountstats_sums_retransmissions_of_each_nfs_mount():
    stats = parse_mountstats(fixture("storage/mountstats_procfs_fixture_nfs4.txt"))
    assert list(stats) == ["/mnt/nfs/test"]  # rootfs, sysfs, proc and ext4 carry no RPC statistics
    nfs = stats["/mnt/nfs/test"]
    assert nfs.server == "192.168.1.1:/srv/test"
    # READ 1298/1298; ACCESS has fewer transmissions than ops (edited values): never a negative count.
    assert (nfs.ops, nfs.retransmissions) == (1298 + 2927395007, 0)


def test_mountstats_of_nfs41_with_nine_field_ops():
    text = fixture("storage/mountstats_procfs_test_nfs41.txt")
    stats = parse_mountstats(text)
    (nfs,) = stats.values()
    ops = trans = 0
    in_ops = False
    for line in text.splitlines():
        if line.strip() == "per-op statistics":
            in_ops = True
        elif in_ops and ":" in line:
            numbers = line.split(":")[1].split()
            ops, trans = ops + int(numbers[0]), trans + max(int(numbers[0]), int(numbers[1]))
    assert nfs.ops == ops and nfs.retransmissions == trans - ops and nfs.ops > 400000


def test_mountstats_with_a_garbled_op_line_names_it():
    text = fixture("storage/mountstats_procfs_fixture_nfs4.txt").replace("READ: 1298 1298", "READ: many")
    with pytest.raises(SourceUnavailable, match=r"^mountstats line 17: not a per-op statistics line"):
        parse_mountstats(text)


def test_the_real_idle_import_has_no_header_and_is_healthy():
    (imp,) = parse_imports(fixture("lustre/osc_import_idle_2.12.7.txt"))
    assert (imp.device, imp.target, imp.state, imp.healthy) == (
        "temp-OST0004-osc-ffff9068ea7c9000", "temp-OST0004", "IDLE", True)


def test_lctl_imports_name_the_disconnected_ost():
    imports = parse_imports(fixture("lustre/lctl_get_param_imports_ost0002_disconn.txt"))
    assert [(i.target, i.state) for i in imports] == [
        ("lustre-OST0000", "FULL"), ("lustre-OST0001", "IDLE"), ("lustre-OST0002", "DISCONN"),
        ("lustre-MDT0000", "FULL")]
    assert [i.target for i in imports if not i.healthy] == ["lustre-OST0002"]


def test_an_import_without_a_state_or_stray_text_is_an_error_naming_the_line():
    text = fixture("lustre/lctl_get_param_imports_ost0002_disconn.txt").replace("    state: DISCONN\n", "")
    with pytest.raises(SourceUnavailable, match=r"line \d+: the import of lustre-OST0002-osc-ffff8c8e3a1b5000 has "
                                                r"no state"):
        parse_imports(text)
    with pytest.raises(SourceUnavailable, match=r"^lctl get_param line 1: expected an osc.\*.import="):
        parse_imports("error: get_param: param_path 'osc/*/import': No such file or directory\n")


def test_lfs_check_servers_all_active():
    checks = parse_check_servers(fixture("lustre/lfs_check_servers_all_active.txt"))
    assert len(checks) == 7 and all(c.active for c in checks)
    assert checks[0].target == "lustrefs-MDT0000" and checks[-1].target == "lustrefs-OST0006"


def test_lfs_check_servers_errors_name_the_target_and_the_error():
    checks = parse_check_servers(fixture("lustre/lfs_check_servers_errors.txt"))
    down = {(c.target, c.detail) for c in checks if not c.active}
    assert ("nas_test-OST0007", "Transport endpoint is not connected (107)") in down
    assert ("nas_test-OST0003", "Input/output error (5)") in down
    assert ("MGC192.168.6.172@tcp", "Cannot send after transport endpoint shutdown (108)") in down
    assert {c.target for c in checks if c.active} == {"nas_test-OST0000", "nas_test-MDT0000"}
    with pytest.raises(SourceUnavailable, match=r"^lfs check servers line 2: not a server line"):
        parse_check_servers("lustre-OST0000-osc-ffff8c8e3a1b5000 active.\nlfs check: cannot find mounted Lustre\n")


def test_target_names():
    assert target_name("lustre-OST0001-osc-ffff9a8b5c3e4000") == "lustre-OST0001"
    assert target_name("nas_test-OST0000-osc-MDT0000") == "nas_test-OST0000"
    assert target_name("lustre-MDT0000_UUID") == "lustre-MDT0000"


def test_lfs_df_of_a_real_filesystem_names_each_target_and_the_summary():
    (fs,) = parse_df(fixture("lustre/lfs_df_exascaler_cloud_24_osts.txt"))
    assert fs.mount == "/mnt/exacloud" and len(fs.targets) == 25
    mdt, ost0, ost10 = fs.targets[0], fs.targets[1], fs.targets[11]
    assert (mdt.name, mdt.kind, mdt.index, mdt.blocks_kb, mdt.used_kb, mdt.available_kb, mdt.use_percent) == (
        "exacloud-MDT0000", "MDT", 0, 315302464, 6212, 309927544, 1)
    assert (ost0.uuid, ost0.name, ost0.kind, ost0.index) == ("exacloud-OST0000_UUID", "exacloud-OST0000", "OST", 0)
    assert (ost10.name, ost10.index) == ("exacloud-OST000a", 10)  # the UUID in hex, the index in decimal
    # The summary adds up the OSTs only: with OSTs present, lfs leaves the MDTs' blocks out.
    osts = [t for t in fs.targets if t.kind == "OST"]
    assert fs.summary.blocks_kb == sum(t.blocks_kb for t in osts) == 12706795008
    assert fs.summary.used_kb == sum(t.used_kb for t in osts) and fs.summary.use_percent == 1


def test_lfs_df_verbose_with_an_inactive_ost_flags_and_a_full_one():
    (fs,) = parse_df(fixture("lustre/lfs_df_-v_ost0002_inactive.txt"))
    assert [(t.name, t.answered, t.flags, t.use_percent) for t in fs.targets] == [
        ("lustre-MDT0000", True, "f", 2), ("lustre-OST0000", True, "", 51), ("lustre-OST0001", True, "D", 21),
        ("lustre-OST0002", False, "", 0), ("lustre-OST0003", True, "", 94)]
    inactive = fs.targets[3]
    assert (inactive.uuid, inactive.kind, inactive.index, inactive.error) == ("OST0002", "OST", 2, "inactive device")
    assert fs.summary.blocks_kb == 3 * 61419143168 and fs.summary.use_percent == 55


def test_lfs_df_of_two_filesystems_a_failed_statfs_and_217s_wider_mount_column():
    text = (fixture("lustre/lfs_df_exascaler_cloud_24_osts.txt")
            + fixture("lustre/lfs_df_-v_ost0002_inactive.txt").replace(" /lustre", "  /lustre")
            .replace("lustre-OST0003_UUID  61419143168 57104547840  3695040512  94%  /lustre[OST:3]",
                     "lustre-OST0003_UUID : Input/output error"))
    exa, lustre = parse_df(text)
    assert (exa.mount, lustre.mount) == ("/mnt/exacloud", "/lustre")
    assert [(t.name, t.error) for t in lustre.targets if not t.answered] == [
        ("lustre-OST0002", "inactive device"), ("lustre-OST0003", "Input/output error")]


@pytest.mark.parametrize("text, message", [
    ("lfs df: cannot find mounted Lustre filesystem\n", r"^lfs df line 1: expected the UUID 1K-blocks"),
    ("UUID                   1K-blocks        Used   Available Use% Mounted on\nsome other line\n",
     r"^lfs df line 2: not an lfs df line: 'some other line'"),
    ("UUID                   1K-blocks        Used   Available Use% Mounted on\n"
     "exacloud-MDT0000_UUID   315302464        6212   309927544   1% /mnt/exacloud[MDT:0]\n",
     r"^lfs df: no filesystem_summary after the last header"),
])
def test_lfs_df_that_is_not_lfs_df_is_an_error_naming_the_line(text, message):
    with pytest.raises(SourceUnavailable, match=message):
        parse_df(text)
