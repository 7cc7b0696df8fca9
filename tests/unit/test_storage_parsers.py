"""The storage readers on real captures (tests/fixtures/lustre, tests/fixtures/storage; SOURCES.md names
each): /proc/self/mountinfo, /proc/self/mountstats, `lctl get_param *.import` and `lfs check servers`.
Input a reader does not know is an error naming the line."""

from pathlib import Path

import pytest

from opsctl.errors import SourceUnavailable
from opsctl.storage.lustre import parse_check_servers, parse_imports, target_name
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
