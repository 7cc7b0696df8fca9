"""opsctl.fileio: the one atomic writer (a random temporary name created O_EXCL|O_NOFOLLOW, fchmod, fsync,
rename, fsync of the directory; nothing left behind on failure) and read_nofollow."""

import hashlib
import os
import stat

import pytest

from opsctl import fileio
from opsctl.fileio import read_nofollow, write_atomic


class Names:
    """A stand-in for the random source: the given hex strings in turn."""

    def __init__(self, *names):
        self.names = list(names)

    def token_hex(self, _nbytes):
        return self.names.pop(0)


def test_writes_the_data_with_the_mode_and_replaces_the_old_file(tmp_path):
    path = tmp_path / "out.prom"
    path.write_text("old\n")
    write_atomic(path, "new ✓\n", mode=0o640)
    assert path.read_text() == "new ✓\n" and stat.S_IMODE(path.stat().st_mode) == 0o640
    write_atomic(path, b"\x00bytes")
    assert path.read_bytes() == b"\x00bytes" and stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["out.prom"]


def test_a_symlink_planted_at_the_temporary_name_is_never_followed(tmp_path, monkeypatch):
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "shadow"
    victim.write_text("root:x:0:0\n")
    before = hashlib.sha256(victim.read_bytes()).hexdigest()
    target = tmp_path / "dir" / "out.prom"
    target.parent.mkdir()
    planted = target.with_name(".out.prom.aaaa.tmp")
    planted.symlink_to(victim)
    monkeypatch.setattr(fileio, "secrets", Names("aaaa", "bbbb"))
    write_atomic(target, "data\n")
    assert target.read_text() == "data\n" and not target.is_symlink()
    assert hashlib.sha256(victim.read_bytes()).hexdigest() == before
    assert planted.is_symlink() and os.readlink(planted) == str(victim)
    assert sorted(p.name for p in target.parent.iterdir()) == [".out.prom.aaaa.tmp", "out.prom"]


def test_when_every_temporary_name_is_taken_it_raises_and_changes_nothing(tmp_path, monkeypatch):
    target = tmp_path / "out.prom"
    target.write_text("old\n")
    os.mkfifo(tmp_path / ".out.prom.same.tmp")
    monkeypatch.setattr(fileio, "secrets", Names(*["same"] * fileio.TEMP_ATTEMPTS))
    with pytest.raises(OSError):
        write_atomic(target, "new\n")
    assert target.read_text() == "old\n"
    assert stat.S_ISFIFO((tmp_path / ".out.prom.same.tmp").lstat().st_mode)


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_no_temporary_file_is_left_after_a_failure(tmp_path, monkeypatch, failing):
    target = tmp_path / "out.prom"
    target.write_text("old\n")

    def fail(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fileio.os, failing, fail)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(target, "new\n")
    monkeypatch.undo()
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["out.prom"]


def test_a_directory_in_the_way_fails_and_leaves_no_temporary_file(tmp_path):
    (tmp_path / "out.prom").mkdir()
    with pytest.raises(IsADirectoryError):
        write_atomic(tmp_path / "out.prom", "new\n")
    assert [p.name for p in tmp_path.iterdir()] == ["out.prom"]


def test_the_file_and_then_its_directory_are_fsynced(tmp_path, monkeypatch):
    synced = []
    real = os.fsync

    def fsync(fd):
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(fileio.os, "fsync", fsync)
    write_atomic(tmp_path / "out.prom", "data\n")
    assert synced == ["file", "dir"]


def test_read_nofollow_reads_a_file_and_refuses_a_symlink_or_a_fifo(tmp_path):
    (tmp_path / "state.json").write_text("{}")
    (tmp_path / "link").symlink_to(tmp_path / "state.json")
    os.mkfifo(tmp_path / "fifo")  # a blocking open would wait for a writer for ever
    assert read_nofollow(tmp_path / "state.json") == "{}"
    assert read_nofollow(tmp_path / "missing") is None
    with pytest.raises(OSError):
        read_nofollow(tmp_path / "link")
    with pytest.raises(OSError, match="not a regular file"):
        read_nofollow(tmp_path / "fifo")
