"""The storage of a lab machine's GPU node (hwinstall and `opsctl-hw`): the Lustre tools at the real
paths, the bind mount units that stand in for /shared and /lustre, their sources moved away while
`mount-missing` lasts (also across a restart), and the emulated mountinfo, mountstats and hung /home
that `opsctl node check` reads, and what makes that hang work in a machine: the host's /dev/fuse bound
into GPU machines, and a hang that outlives the opsctl-hw that mounts it."""

import os
import socket
import stat
import sys
import time
from pathlib import Path

import pytest

from opsctl.storage.mountinfo import parse_mountinfo
from opsctl.storage.mountstats import parse_mountstats
from opsctl_lab import hung_mount
from opsctl_lab.errors import LabError
from opsctl_lab.hardware import FAULTS, NodeHardware
from opsctl_lab.hwtools import admin, common
from opsctl_lab.machines import hwinstall, lifecycle, nspawn, storage_mounts
from opsctl_lab.machines.settings import HW_STATE, Settings

STORAGE_FAULTS = ("lustre-ost-down", "mount-missing", "nfs-hung")


def installed(tmp_path, *faults):
    upper = tmp_path / "upper"
    if faults:
        hw = NodeHardware(node="gpu1")
        for fault in faults:
            hw.inject(fault, now=0.0)
        hw.save(upper / HW_STATE.lstrip("/"))
    hwinstall.install(upper, "gpu1", "10.213.1.11")
    return upper


def in_layer(upper: Path, path: str) -> Path:
    return upper / path.lstrip("/")


def test_the_lustre_client_tools_are_at_their_real_paths(tmp_path):
    upper = installed(tmp_path)
    for path, module in (("/usr/sbin/lctl", "lctl"), ("/usr/bin/lfs", "lfs"), ("/usr/sbin/lnetctl", "lnetctl")):
        tool = in_layer(upper, path)
        assert stat.S_IMODE(tool.stat().st_mode) == 0o755
        assert tool.read_text().endswith(f"exec /usr/bin/python3 -m opsctl_lab.hwtools.{module} \"$@\"\n")
        assert "OPSCTL_HW_MOUNT_BASE" not in tool.read_text()
    # Only opsctl-hw writes the machine's own mount points, and its hung /home outlives it (until clear).
    admin_tool = in_layer(upper, "/usr/local/sbin/opsctl-hw").read_text()
    assert "OPSCTL_HW_MOUNT_BASE=/ OPSCTL_HUNG_MOUNT_STAYS=1 PYTHONPATH=/opt/opsctl-hw exec" in admin_tool
    assert "OPSCTL_HUNG_MOUNT_STAYS" not in in_layer(upper, "/usr/bin/nvidia-smi").read_text()


def test_shared_and_lustre_are_enabled_bind_mount_units_of_the_exports(tmp_path):
    upper = installed(tmp_path)
    assert hwinstall.MOUNT_UNITS == {"/shared": "shared.mount", "/lustre": "lustre.mount"}
    units = in_layer(upper, "/etc/systemd/system")
    assert (units / "shared.mount").read_text() == """[Unit]
Description=/shared (opsctl lab: a bind mount standing in for the NFS client mount of 10.0.0.5:/shared)
AssertPathIsDirectory=/var/lib/opsctl-hw/storage/exports/shared

[Mount]
What=/var/lib/opsctl-hw/storage/exports/shared
Where=/shared
Type=none
Options=bind

[Install]
WantedBy=remote-fs.target
"""
    lustre = (units / "lustre.mount").read_text()
    assert "Lustre client mount of 10.10.0.10@o2ib:/lustre" in lustre
    assert "What=/var/lib/opsctl-hw/storage/exports/lustre\nWhere=/lustre\n" in lustre
    for unit in ("shared.mount", "lustre.mount"):
        link = units / "remote-fs.target.wants" / unit
        assert link.is_symlink() and os.readlink(link) == f"/etc/systemd/system/{unit}"
    assert in_layer(upper, hwinstall.EXPORTS + "/shared").is_dir()
    assert in_layer(upper, hwinstall.EXPORTS + "/lustre").is_dir()
    # A second start of the machine writes the same (the links are replaced, not duplicated).
    installed(tmp_path)
    assert sorted(p.name for p in (units / "remote-fs.target.wants").iterdir()) == ["lustre.mount", "shared.mount"]


def test_mount_missing_keeps_shared_from_mounting_across_a_restart(tmp_path):
    upper = installed(tmp_path, "mount-missing")
    exports = in_layer(upper, hwinstall.EXPORTS)
    assert sorted(p.name for p in exports.iterdir()) == [".shared.mount-missing", "lustre"]
    (exports / ".shared.mount-missing" / "data").write_text("kept")
    NodeHardware(node="gpu1").save(in_layer(upper, HW_STATE))  # cleared while the machine was down
    hwinstall.install(upper, "gpu1", "10.213.1.11")
    assert sorted(p.name for p in exports.iterdir()) == ["lustre", "shared"]
    assert (exports / "shared" / "data").read_text() == "kept"


def test_the_storage_paths_are_next_to_the_machines_state_file(monkeypatch):
    monkeypatch.delenv("OPSCTL_HW_STATE", raising=False)
    assert common.DEFAULT_STATE == HW_STATE
    assert admin.storage_root() == Path(hwinstall.STORAGE_ROOT) == Path("/var/lib/opsctl-hw/storage")
    assert (hwinstall.MOUNTINFO, hwinstall.MOUNTSTATS) == ("/var/lib/opsctl-hw/storage/mountinfo",
                                                           "/var/lib/opsctl-hw/storage/mountstats")
    assert storage_mounts.export_dir(admin.storage_root(), "/shared") == Path(hwinstall.EXPORTS) / "shared"


@pytest.mark.parametrize("point, unit", [("/shared", "shared.mount"), ("/lustre", "lustre.mount"),
                                         ("/scratch/a-b", "scratch-a\\x2db.mount"), ("/.x/y.z", "\\x2ex-y.z.mount"),
                                         ("/", "-.mount")])
def test_mount_unit_names_are_systemd_escape_p(point, unit):
    assert storage_mounts.mount_unit(point) == unit


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """opsctl-hw as in a machine: the mount base is the machine's root (here a directory), and the units
    it would start or stop are recorded."""
    root = tmp_path / "root"
    NodeHardware(node=socket.gethostname()).save(tmp_path / "hw" / "hardware.json")
    monkeypatch.setenv("OPSCTL_HW_STATE", str(tmp_path / "hw" / "hardware.json"))
    monkeypatch.setenv("OPSCTL_HW_SYSFS_ROOT", str(tmp_path / "hw" / "sys"))
    monkeypatch.setenv("OPSCTL_HW_MOUNT_BASE", str(root))
    monkeypatch.setattr(admin, "MACHINE_BASE", root)
    calls = []
    storage = tmp_path / "hw" / "storage"

    def systemctl(action, point):
        # The source is there while its unit starts, and still there when it stops (moved only after).
        calls.append((action, point, storage_mounts.export_dir(storage, point).is_dir()))

    monkeypatch.setattr(storage_mounts, "systemctl_mount", systemctl)
    return root, storage, calls


def table(storage):
    return parse_mountinfo((storage / "mountinfo").read_text())


def test_opsctl_hw_writes_the_storage_at_boot(machine):
    root, storage, calls = machine
    assert admin.main(["sysfs"]) == 0
    assert {p: m.fstype for p, m in table(storage).items()} == {
        "/": "ext4", f"{root}/home": "nfs4", f"{root}/shared": "nfs4", f"{root}/lustre": "lustre"}
    assert set(parse_mountstats((storage / "mountstats").read_text())) == {f"{root}/home", f"{root}/shared"}
    assert (root / "home/.opsctl-probe").is_dir() and sorted(p.name for p in (storage / "exports").iterdir()) == [
        "lustre", "shared"]
    assert calls == []  # at boot the units mount by themselves


def test_mount_missing_stops_shared_mount_then_moves_its_source_and_clear_undoes_it(machine, capsys):
    root, storage, calls = machine
    assert admin.main(["sysfs"]) == 0  # booted
    assert admin.main(["inject", "mount-missing"]) == 0
    assert calls == [("stop", "/shared", True)]
    assert f"{root}/shared" not in table(storage) and f"{root}/lustre" in table(storage)
    assert not (storage / "exports/shared").exists() and (storage / "exports/.shared.mount-missing").is_dir()
    assert admin.main(["inject", "ib-down", "--hca", "2"]) == 0  # another fault leaves the units alone
    assert calls == [("stop", "/shared", True)] and not (storage / "exports/shared").exists()
    assert admin.main(["clear"]) == 0
    assert calls[1:] == [("start", "/shared", True)]
    assert f"{root}/shared" in table(storage)
    assert sorted(p.name for p in (storage / "exports").iterdir()) == ["lustre", "shared"]
    assert capsys.readouterr().out.splitlines()[-1].endswith(": cleared 2 fault(s)")


def test_nfs_hung_hangs_the_home_mount_point(machine, monkeypatch):
    root, storage, calls = machine
    hangs = []  # the FUSE mount itself needs root and /dev/fuse: opsctl_lab.hung_mount, tests/component
    monkeypatch.setattr(hung_mount, "hang", lambda point, pidfile: hangs.append(("hang", point)))
    monkeypatch.setattr(hung_mount, "release", lambda point, pidfile: hangs.append(("release", point)))
    assert admin.main(["inject", "nfs-hung"]) == 0
    assert hangs[-1] == ("hang", root / "home") and calls == []
    assert admin.main(["clear"]) == 0
    assert hangs[-1] == ("release", root / "home") and calls == [("start", "/shared", True)]


def test_outside_a_machine_no_unit_is_touched_and_the_mounts_are_under_the_storage(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCTL_HW_STATE", str(tmp_path / "hardware.json"))
    monkeypatch.setenv("OPSCTL_HW_SYSFS_ROOT", str(tmp_path / "sys"))
    monkeypatch.delenv("OPSCTL_HW_MOUNT_BASE", raising=False)
    monkeypatch.setattr(storage_mounts, "systemctl_mount", lambda *a: pytest.fail(f"systemctl {a}"))
    assert admin.main(["inject", "mount-missing"]) == 0 and admin.main(["clear"]) == 0
    assert f"{tmp_path}/storage/mnt/shared" in table(tmp_path / "storage")


def test_the_lab_machines_take_the_storage_faults(tmp_path):
    assert not any(FAULTS[name].simulated_only for name in STORAGE_FAULTS)
    settings = Settings(net=1, state_dir=tmp_path, inventory_dir=tmp_path, apt_cache_dir=tmp_path)
    for fault in STORAGE_FAULTS:
        # Past the fault's check: only the machine is unknown here.
        with pytest.raises(LabError, match=r"^unknown GPU machine 'gpu2'; lab GPU machines: none$"):
            lifecycle.inject("gpu2", fault, settings=settings)


def test_inject_and_clear_all_reach_every_gpu_machine_and_no_other(monkeypatch):
    """`opsctl lab machines inject all lustre-ost-down`: a storage outage on every GPU machine at once."""
    calls = []
    monkeypatch.setattr(lifecycle, "known", lambda settings: ["head", "stor1", "gpu1", "gpu2", "gpu3"])
    monkeypatch.setattr(lifecycle, "_ssh_admin", lambda settings, machine, args: calls.append((machine, args)) or "")
    settings = Settings(net=7, state_dir=Path("/nonexistent"), inventory_dir=Path("/nonexistent"),
                        apt_cache_dir=Path("/nonexistent"))
    lifecycle.inject("all", "lustre-ost-down", settings=settings)
    lifecycle.clear("all", settings=settings)
    lifecycle.inject("gpu2", "nfs-hung", settings=settings)
    assert calls == [(n, ["inject", "lustre-ost-down"]) for n in ("gpu1", "gpu2", "gpu3")] + [
        (n, ["clear"]) for n in ("gpu1", "gpu2", "gpu3")] + [("gpu2", ["inject", "nfs-hung"])]


def run_holder(monkeypatch, parent, ppid, max_sleeps=3):
    """The hung mount's holder script with a fake clock: how many seconds it held before it exited."""
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) >= max_sleeps:
            raise TimeoutError("still holding")

    monkeypatch.setattr(time, "sleep", sleep)
    monkeypatch.setattr(os, "getppid", lambda: ppid)
    monkeypatch.setattr(sys, "argv", ["-c", str(parent)])
    try:
        exec(hung_mount._HOLDER, {})  # noqa: S102 - the script the holder process runs
    except TimeoutError:
        return None  # never exits by itself
    return len(sleeps)


def test_in_a_machine_the_hang_outlives_opsctl_hw(monkeypatch):
    """opsctl-hw exits as soon as it has mounted the hang: in a machine (OPSCTL_HUNG_MOUNT_STAYS=1) the
    holder has no parent to follow and holds until clear kills it; elsewhere it follows its parent."""
    monkeypatch.delenv(hung_mount.STAYS_ENV, raising=False)
    assert hung_mount.holder_parent() == os.getpid()
    monkeypatch.setenv(hung_mount.STAYS_ENV, "1")
    assert hung_mount.holder_parent() == 0
    assert run_holder(monkeypatch, parent=0, ppid=1) is None  # reparented to the machine's init: holds on
    assert run_holder(monkeypatch, parent=4242, ppid=4242) is None  # its parent lives: holds on
    assert run_holder(monkeypatch, parent=4242, ppid=1) == 0  # its parent is gone: lets go at once


def test_gpu_machines_get_the_hosts_fuse_device_and_no_other_machine_does(tmp_path, monkeypatch):
    fuse = tmp_path / "fuse"
    assert nspawn.gpu_machine_args(fuse) == []  # a host without FUSE: the machine starts, nfs-hung fails
    fuse.touch()
    assert nspawn.gpu_machine_args(fuse) == [f"--bind={fuse}"]
    started = {}
    monkeypatch.setattr(nspawn, "gpu_machine_args", lambda: ["--bind=/dev/fuse"])
    monkeypatch.setattr(lifecycle.disks, "nspawn_args", lambda settings: ["--bind=/dev/loop7:/dev/vdb"])
    monkeypatch.setattr(nspawn, "running_pid", lambda settings, name: None)
    monkeypatch.setattr(nspawn, "prepare_layer", lambda settings, name, names, key, kernel_key: tmp_path / name)
    monkeypatch.setattr(nspawn, "start", lambda settings, name, extra: started.setdefault(name, extra))
    monkeypatch.setattr(hwinstall, "install", lambda upper, name, address: None)
    for module, name in ((lifecycle.net, "ensure_machine_netns"), (lifecycle.keys, "write_known_hosts"),
                         (lifecycle.inventory, "write")):
        monkeypatch.setattr(module, name, lambda *args: None)
    monkeypatch.setattr(lifecycle.keys, "ensure_client_key", lambda settings: "ssh-ed25519 AAAA lab")
    monkeypatch.setattr(lifecycle, "known", lambda settings: [])
    settings = Settings(net=7, state_dir=tmp_path, inventory_dir=tmp_path, apt_cache_dir=tmp_path)
    assert lifecycle._start_machines(settings, ["head", "stor1", "gpu1", "gpu2"]) == ["head", "stor1", "gpu1", "gpu2"]
    assert started == {"head": [], "stor1": ["--bind=/dev/loop7:/dev/vdb"], "gpu1": ["--bind=/dev/fuse"],
                       "gpu2": ["--bind=/dev/fuse"]}
