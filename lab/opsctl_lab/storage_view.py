"""A node's storage as the lab emulates it: the mounts that mountinfo and mountstats show, the mount
points themselves, and what the Lustre client's tools (hwtools lctl, lfs and lnetctl) print. The lab
host's kernel has neither an NFS nor a Lustre client, so the files that `opsctl node check` reads are
written in the real formats (tests/fixtures/storage, tests/fixtures/lustre) and the mount points are
plain directories.

    /home    nfs4    10.0.0.5:/home           probe directory /home/.opsctl-probe
    /shared  nfs4    10.0.0.5:/shared
    /lustre  lustre  10.10.0.10@o2ib:/lustre  OST0000-OST0003, MDT0000

LNet: the node's one NI, 10.10.1.<n>@o2ib on bond0 (the storage port), besides the loopback; the MGS
(and MDS) answers at 10.10.0.10@o2ib, the OSS of OST<i> at 10.10.0.<11+i>@o2ib.

The node faults change it: `mount-missing` drops /shared from mountinfo, `lustre-ost-down` makes the
import of lustre-OST0002 DISCONN, `lfs check servers` fail it and `lfs df` leave it out (`-v`: "inactive
device"), `lnet-down` takes the o2ib NI down, so that no server answers `lctl ping`, and `nfs-hung` makes /home
hang: a FUSE mount whose server never answers sits on its mount point (opsctl_lab.hung_mount), so the
check's child blocks in its stat, as on a hung NFS mount, until the check gives up on it.

The probe directory /home/.opsctl-probe has mode 1777 (root_squash needs the squashed user to write
there), so any user may put names in it, as on a real cluster.
"""

import re
from dataclasses import dataclass
from pathlib import Path

from opsctl_lab import hung_mount
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
HUNG_PIDFILE = "nfs-hung.pid"  # the hung mount's holder (opsctl_lab.hung_mount), beside mountinfo
FSNAME = "lustre"
TARGETS = [f"{FSNAME}-OST{i:04x}" for i in range(4)] + [f"{FSNAME}-MDT0000"]
DOWN_TARGET = f"{FSNAME}-OST0002"
PROBE_DIR = ".opsctl-probe"
MGS_NID = "10.10.0.10@o2ib"
LNET_INTERFACE = "bond0"
# Each target's size in KiB, the same from every client; lfs df shows the MDT on flash (f, with -v).
MDT_KB, OST_KB = 4020187136, 61419143168


@dataclass(frozen=True)
class LabNi:
    net_type: str
    nid: str
    status: str
    interfaces: tuple[str, ...]


@dataclass(frozen=True)
class LabDf:
    """What `lfs df` knows of a target: its space in KiB, and whether the client still has it active."""

    target: str
    kind: str  # MDT or OST
    index: int
    blocks_kb: int
    used_kb: int
    available_kb: int
    flags: str  # the state flags lfs prints with -v
    active: bool


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


def write_storage(root: Path, base: Path, hw: NodeHardware) -> None:
    """mountinfo and mountstats under root, the mount points under base, and the hung /home as the nfs-hung
    fault says (its holder's PID file under root)."""
    root.mkdir(parents=True, exist_ok=True)
    write_if_changed(root / "mountinfo", mountinfo(base, hw))
    write_if_changed(root / "mountstats", mountstats(base, hw))
    for mount in MOUNTS:
        point = mount_dir(base, mount.point)
        hung = mount.point == HUNG_MOUNT and hw.node_fault("nfs-hung")
        if mount.point == HUNG_MOUNT and not hung:
            hung_mount.release(point, root / HUNG_PIDFILE)
        if hung and hung_mount.mounted(point):
            hung_mount.hang(point, root / HUNG_PIDFILE)  # keeps it (or mounts it again if its holder died)
            continue  # anything below a hung mount point would wait too
        point.mkdir(parents=True, exist_ok=True)
        probe = probe_dir(base, mount)
        if probe is not None:
            probe.mkdir(exist_ok=True)
            probe.chmod(0o1777)  # as under root_squash: the squashed user writes the probe
        if hung:
            hung_mount.hang(point, root / HUNG_PIDFILE)


def imports(hw: NodeHardware) -> list[tuple[str, str, str]]:
    """(parameter, target, state) of every import, as `lctl get_param osc.*.import mdc.*.import` lists them."""
    instance = f"ffff{stable_int(hw.node, 'lustre-instance', modulo=1 << 32):08x}000"
    out = []
    for target in TARGETS:
        kind = "mdc" if "-MDT" in target else "osc"
        state = "DISCONN" if target == DOWN_TARGET and hw.node_fault("lustre-ost-down") else "FULL"
        out.append((f"{kind}.{target}-{kind}-{instance}.import", target, state))
    return out


def server_nid(target: str) -> str:
    """The NID that serves a target: the MGS/MDS for the MDT, an OSS per OST."""
    return MGS_NID if "-MDT" in target else f"10.10.0.{11 + int(target[-4:], 16)}@o2ib"


def node_nid(hw: NodeHardware) -> str:
    """10.10.1.<n>@o2ib for gpu<n> (n 1-254), a stable address for any other name."""
    digits = re.findall(r"\d+", hw.node)
    host = int(digits[-1]) if digits else 0
    return f"10.10.1.{host if 0 < host < 255 else stable_int(hw.node, 'nid', modulo=254) + 1}@o2ib"


def lnet_nis(hw: NodeHardware) -> list[LabNi]:
    """The NIs of `lnetctl net show`, the loopback first as lnetctl lists it."""
    status = "down" if hw.node_fault("lnet-down") else "up"
    return [LabNi("lo", "0@lo", "up", ()), LabNi("o2ib", node_nid(hw), status, (LNET_INTERFACE,))]


def lnet_stats(hw: NodeHardware) -> dict[str, int]:
    """`lnetctl stats show`'s counters, in the real capture's order, the same on every run."""
    sent = 1_000_000 + stable_int(hw.node, "lnet-sent", modulo=500_000)
    drops = stable_int(hw.node, "lnet-drops", modulo=20)
    return {"msgs_alloc": 0, "msgs_max": 39, "rst_alloc": 15, "errors": 0, "send_count": sent,
            "resend_count": 0, "response_timeout_count": 0, "local_interrupt_count": 0, "local_dropped_count": 0,
            "local_aborted_count": 0, "local_no_route_count": 0, "local_timeout_count": 0, "local_error_count": 0,
            "remote_dropped_count": 0, "remote_error_count": 0, "remote_timeout_count": 0,
            "network_timeout_count": 0, "recv_count": sent - drops - 9, "route_count": 0, "drop_count": drops,
            "send_length": sent * 236, "recv_length": (sent - drops - 9) * 229, "route_length": 0,
            "drop_length": drops * 439}


def ping(hw: NodeHardware, nid: str) -> list[str] | None:
    """The NIDs that answer `lctl ping <nid>`, None when none does: a lab server, or the node itself, while
    its o2ib NI is up."""
    if nid == node_nid(hw):
        return [nid]
    servers = {server_nid(t) for t in TARGETS}
    return [nid] if nid in servers and not hw.node_fault("lnet-down") else None


def df(hw: NodeHardware) -> list[LabDf]:
    """Every target as `lfs df -v` lists them, MDTs first; fill levels are the filesystem's, not the node's."""
    out = []
    for target in sorted(TARGETS, key=lambda t: ("-OST" in t, t)):
        kind, index = target[-7:-4], int(target[-4:], 16)
        blocks = MDT_KB if kind == "MDT" else OST_KB
        used = blocks * (5 + stable_int(FSNAME, target, "used", modulo=60)) // 100
        reserved = blocks // 20 if kind == "OST" else blocks * 6 // 100  # what ldiskfs keeps back for root
        active = not (target == DOWN_TARGET and hw.node_fault("lustre-ost-down"))
        out.append(LabDf(target, kind, index, blocks, used, blocks - used - reserved, "f" if kind == "MDT" else "",
                         active))
    return out


def _escape(path: str) -> str:
    return path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")
