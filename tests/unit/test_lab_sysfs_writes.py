"""The emulated sysfs tree is written by more than one process at once (`lab machines inject` and the
emulator's refresh loop): each writer's rename must land whole, whatever the other does meanwhile."""

import os
import stat

from opsctl_lab import ib_sysfs


def test_a_writer_that_finishes_between_anothers_write_and_rename_breaks_nothing(tmp_path, monkeypatch):
    state = tmp_path / "class" / "infiniband" / "mlx5_3" / "ports" / "1" / "state"
    real_replace = os.replace
    interleaved = []

    def replace_after_another_writer(src, dst):
        # The other writer runs to completion after this one wrote its temporary file and before it renames.
        if not interleaved:
            interleaved.append(dst)
            ib_sysfs._write_if_changed(state, "4: ACTIVE")
        real_replace(src, dst)

    monkeypatch.setattr(ib_sysfs.os, "replace", replace_after_another_writer)
    ib_sysfs._write_if_changed(state, "2: INIT")

    assert interleaved == [state]
    assert state.read_text() == "2: INIT\n"  # the later rename wins, as with any two renames
    assert [p.name for p in state.parent.iterdir()] == ["state"]  # no temporary file left behind


def test_written_files_are_world_readable_like_sysfs(tmp_path):
    path = tmp_path / "fw_ver"
    ib_sysfs._write_if_changed(path, "28.41.1000")
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert path.read_text() == "28.41.1000\n"
