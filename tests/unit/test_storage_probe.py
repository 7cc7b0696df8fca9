"""The probe file of opsctl.storage.probe_child, in process (the check runs it as a child): a new file with
a random name, created O_EXCL|O_NOFOLLOW|O_NONBLOCK, checked with fstat, read back, removed. Whatever a
user plants in the (world-writable) probe directory, at the old predictable name or at the random one,
neither blocks, fails nor redirects it."""

import hashlib
import os
import stat

import pytest

from opsctl.storage import probe_child
from opsctl.storage.probe_child import NAME_ATTEMPTS, ProbeError, probe

HOST = "gpu007"
OLD_NAME = f".opsctl-probe-{HOST}"  # what the probe used before (git log -p opsctl/storage/probe.py)


def plant(kind: str, path, victim) -> None:
    if kind == "fifo":
        os.mkfifo(path)  # opened for writing, it blocked the old probe until a reader came: never
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink":
        path.symlink_to(victim)  # to a file outside the mount: opened, it truncated and overwrote that file
    else:
        path.write_text("someone else's file\n")
        path.chmod(0o644)


def fingerprint(path) -> tuple:
    info = path.lstat()
    content = os.readlink(path) if path.is_symlink() else path.read_bytes() if path.is_file() else None
    return stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), info.st_ino, content


@pytest.fixture
def setup(tmp_path):
    probe_dir = tmp_path / "mnt" / ".opsctl-probe"
    probe_dir.mkdir(parents=True)
    probe_dir.chmod(0o1777)
    victim = tmp_path / "outside" / "shadow"
    victim.parent.mkdir()
    victim.write_text("root:$6$secret:19000:0:99999:7:::\n")
    return probe_dir, victim


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink", "file"])
@pytest.mark.parametrize("where", ["old name", "random name"])
def test_a_planted_name_changes_nothing(setup, monkeypatch, kind, where):
    probe_dir, victim = setup
    suffixes = iter(["c0ffee" * 2 + "0123", "f00d" * 4])
    monkeypatch.setattr(probe_child, "random_suffix", lambda: next(suffixes))
    planted = probe_dir / (OLD_NAME if where == "old name" else f"{OLD_NAME}-c0ffeec0ffee0123")
    plant(kind, planted, victim)
    before, victim_sha = fingerprint(planted), hashlib.sha256(victim.read_bytes()).hexdigest()

    probe(str(probe_dir.parent), str(probe_dir), HOST)

    assert fingerprint(planted) == before
    assert hashlib.sha256(victim.read_bytes()).hexdigest() == victim_sha
    assert [p.name for p in probe_dir.iterdir()] == [planted.name]  # the probe's own file is gone again
    # A collision took the next random name; at the old name the first one was free.
    assert next(suffixes, None) == (None if where == "random name" else "f00d" * 4)


def test_the_probe_file_is_new_private_and_removed(setup, monkeypatch):
    probe_dir, _ = setup
    seen = []
    real_open = os.open

    def watching_open(path, flags, mode=0o777, *, dir_fd=None):
        fd = real_open(path, flags, mode, dir_fd=dir_fd)
        if flags & os.O_CREAT:
            seen.append((path, flags, stat.S_IMODE(os.fstat(fd).st_mode)))
        return fd

    monkeypatch.setattr(probe_child.os, "open", watching_open)
    probe(str(probe_dir.parent), str(probe_dir), HOST)
    [(name, flags, mode)] = seen
    assert name.startswith(f"{OLD_NAME}-") and len(name) == len(OLD_NAME) + 17
    for flag in (os.O_WRONLY, os.O_CREAT, os.O_EXCL, os.O_NOFOLLOW, os.O_NONBLOCK):
        assert flags & flag == flag
    assert mode == 0o600 and list(probe_dir.iterdir()) == []


def test_two_probes_never_share_a_name(setup, monkeypatch):
    probe_dir, _ = setup
    names = []
    real = probe_child.probe_name
    monkeypatch.setattr(probe_child, "probe_name", lambda host: names.append(real(host)) or names[-1])
    probe(str(probe_dir.parent), str(probe_dir), HOST)
    probe(str(probe_dir.parent), str(probe_dir), HOST)
    assert len(set(names)) == 2


def test_when_every_random_name_is_taken_the_probe_fails_and_touches_none(setup, monkeypatch):
    probe_dir, victim = setup
    monkeypatch.setattr(probe_child, "random_suffix", lambda: "same")
    planted = probe_dir / f"{OLD_NAME}-same"
    plant("symlink", planted, victim)
    with pytest.raises(ProbeError, match=f"{NAME_ATTEMPTS} random probe file names were all taken"):
        probe(str(probe_dir.parent), str(probe_dir), HOST)
    assert planted.is_symlink() and victim.read_text().startswith("root:")


def test_a_symlink_in_place_of_the_probe_directory_is_refused(setup):
    probe_dir, victim = setup
    elsewhere = victim.parent
    link = probe_dir.parent / "linked-probe"
    link.symlink_to(elsewhere)
    with pytest.raises(OSError):
        probe(str(probe_dir.parent), str(link), HOST)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["shadow"]


def test_a_file_that_is_not_ours_fails_the_probe(setup, monkeypatch):
    probe_dir, _ = setup
    monkeypatch.setattr(probe_child.os, "geteuid", lambda: 4242)  # as if another user had created it
    with pytest.raises(ProbeError, match="not a regular file of ours"):
        probe(str(probe_dir.parent), str(probe_dir), HOST)
    assert list(probe_dir.iterdir()) == []


def test_a_different_read_back_fails_the_probe(setup, monkeypatch):
    probe_dir, _ = setup
    monkeypatch.setattr(probe_child.os, "read", lambda fd, n: b"stale")
    with pytest.raises(ProbeError, match="differs from what was written"):
        probe(str(probe_dir.parent), str(probe_dir), HOST)
    assert list(probe_dir.iterdir()) == []


def test_main_prints_one_line_and_exits_1(setup, capsys):
    probe_dir, _ = setup
    assert probe_child.main([str(probe_dir.parent), str(probe_dir), HOST]) == 0
    assert probe_child.main([str(probe_dir.parent / "gone"), "", HOST]) == 1
    assert capsys.readouterr().err.startswith("FileNotFoundError: [Errno 2] No such file or directory")
    assert probe_child.main([str(probe_dir.parent), str(probe_dir / "missing"), HOST]) == 1
    assert capsys.readouterr().err.count("\n") == 1
