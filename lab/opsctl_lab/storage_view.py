"""A node's storage as the lab emulates it: the mounts that mountinfo and mountstats show, the mount
points themselves, and what the Lustre client's tools (hwtools lctl and lfs) print. The lab host's kernel
has neither an NFS nor a Lustre client, so the files that `opsctl node check` reads are written in the
real formats (tests/fixtures/storage, tests/fixtures/lustre) and the mount points are plain directories.

    /home    nfs4    10.0.0.5:/home           probe directory /home/.opsctl-probe
    /shared  nfs4    10.0.0.5:/shared
    /lustre  lustre  10.10.0.10@o2ib:/lustre  OST0000-OST0003, MDT0000

The node faults change it: `mount-missing` drops /shared from mountinfo, `lustre-ost-down` makes the
import of lustre-OST0002 DISCONN and `lfs check servers` fail it, and `nfs-hung` puts a FIFO where the
probe file of /home goes: the check's child blocks opening it for writing, as a stat of a hung NFS
mount blocks, until the check gives up on it.
"""

import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from opsctl_lab.hardware import NodeHardware, stable_int
from opsctl_lab.ib_sysfs import write_if_changed


@dataclass(frozen=True)
class LabMount:
    point: str
    fstype: str
    source: str
    options: str
    probe: bool = False


NFS_OPTIONS = ("rw,vers=4.2,rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,nconnect=8,timeo=600,retrans=2,"
               "sec=sys,local_lock=none,addr=10.0.0.5")
MOUNTS = (
    LabMount("/home", "nfs4", "10.0.0.5:/home", NFS_OPTIONS, probe=True),
    LabMount("/shared", "nfs4", "10.0.0.5:/shared", NFS_OPTIONS),
    LabMount("/lustre", "lustre", "10.10.0.10@o2ib:/lustre", "rw,flock,lazystatfs"),
)
MISSING_MOUNT = "/shared"
HUNG_MOUNT = "/home"
FSNAME = "lustre"
TARGETS = [f"{FSNAME}-OST{i:04x}" for i in range(4)] + [f"{FSNAME}-MDT0000"]
DOWN_TARGET = f"{FSNAME}-OST0002"
PROBE_DIR = ".opsctl-probe"


def mount_dir(base: Path, point: str) -> Path:
    """Where a mount point is: the path itself on a lab machine (base /), under the node's directory in
    the simulated lab."""
    return base / point.lstrip("/")


def probe_dir(base: Path, mount: LabMount) -> Path | None:
    return mount_dir(base, mount.point) / PROBE_DIR if mount.probe else None


def mountinfo(base: Path, hw: NodeHardware) -> str:
    lines = ["22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw,errors=remount-ro"]
    for index, mount in enumerate(MOUNTS):
        if mount.point == MISSING_MOUNT and hw.node_fault("mount-missing"):
            continue
        lines.append(f"{101 + index} 22 0:{50 + index} / {_escape(str(mount_dir(base, mount.point)))} rw,relatime "
                     f"shared:{60 + index} - {mount.fstype} {mount.source} {mount.options}")
    return "\n".join(lines) + "\n"


def mountstats(base: Path, hw: NodeHardware) -> str:
    """One block per mount in the kernel's layout; the NFS ones with RPC statistics (nfs-utils' order)."""
    out = ["device /dev/vda1 mounted on / with fstype ext4"]
    for mount in MOUNTS:
        if mount.point == MISSING_MOUNT and hw.node_fault("mount-missing"):
            continue
        out.append(f"device {mount.source} mounted on {_escape(str(mount_dir(base, mount.point)))} with fstype "
                   f"{mount.fstype}" + (" statvers=1.1" if mount.fstype == "nfs4" else ""))
        if mount.fstype != "nfs4":
            continue
        ops = 10_000 + stable_int(hw.node, mount.point, "ops", modulo=90_000)
        retrans = stable_int(hw.node, mount.point, "retrans", modulo=5)
        out += [f"\topts:\t{mount.options}", "\tage:\t86400", "\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)",
                "\txprt:\ttcp 940 0 2 0 1 938505 938504 0 12756069 0 32 254729 10823602", "\tper-op statistics",
                f"\t{'NULL':>12}: 1 1 0 44 24 0 0 0 0",
                f"\t{'READ':>12}: {ops} {ops + retrans} 0 7103096 1792122744 2272 464840 467945 0",
                f"\t{'WRITE':>12}: {ops // 2} {ops // 2} 0 39161277084 56725504 401718334 10139998 411864389 0"]
    return "\n".join(out) + "\n"


def write_storage(root: Path, base: Path, hw: NodeHardware, host: str | None = None) -> None:
    """mountinfo and mountstats under root, the mount points under base, and the hung probe FIFO as the
    nfs-hung fault says. `host` names the probe file as `opsctl node check` on that host does."""
    root.mkdir(parents=True, exist_ok=True)
    write_if_changed(root / "mountinfo", mountinfo(base, hw))
    write_if_changed(root / "mountstats", mountstats(base, hw))
    host = host or socket.gethostname()
    for mount in MOUNTS:
        mount_dir(base, mount.point).mkdir(parents=True, exist_ok=True)
        probe = probe_dir(base, mount)
        if probe is None:
            continue
        probe.mkdir(exist_ok=True)
        probe.chmod(0o1777)  # as under root_squash: the squashed user writes the probe
        fifo = probe / f".opsctl-probe-{host}"
        hung = mount.point == HUNG_MOUNT and hw.node_fault("nfs-hung")
        is_fifo = fifo.exists() and stat.S_ISFIFO(fifo.lstat().st_mode)
        if hung and not is_fifo:
            fifo.unlink(missing_ok=True)
            os.mkfifo(fifo)
        elif not hung and is_fifo:
            fifo.unlink()


def imports(hw: NodeHardware) -> list[tuple[str, str, str]]:
    """(parameter, target, state) of every import, as `lctl get_param osc.*.import mdc.*.import` lists them."""
    instance = f"ffff{stable_int(hw.node, 'lustre-instance', modulo=1 << 32):08x}000"
    out = []
    for target in TARGETS:
        kind = "mdc" if "-MDT" in target else "osc"
        state = "DISCONN" if target == DOWN_TARGET and hw.node_fault("lustre-ost-down") else "FULL"
        out.append((f"{kind}.{target}-{kind}-{instance}.import", target, state))
    return out


def _escape(path: str) -> str:
    return path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")
