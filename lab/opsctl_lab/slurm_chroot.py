"""Slurm releases newer than Debian 12's, run for real from debootstrap chroots: Debian 13 (trixie,
Slurm 24.11) and Debian unstable (sid, Slurm 26.05). Debian 12's own 22.05 is the host's (the lab).

    chroot = SlurmChroot.ensure("trixie")          # built once (about a minute), then reused
    chroot.version                                 # "24.11.5"
    chroot.slurmd_check(conf_dir, ["gpu1"])        # that release's `slurmd -G -N gpu1` on the files
    cluster = ChrootCluster(chroot, "name", ["gpu033", "gpu034"], index=0, gres="gpu:h200:8")
    cluster.up(fresh=True)                         # munged, slurmctld, one slurmd per node, all inside
    cluster.sinfo, cluster.scontrol                # host-side wrappers: opsctl's slurm.sinfo/.scontrol
    cluster.down()

Each chroot is cached under $OPSCTL_LAB_CHROOT_DIR (default /var/cache/opsctl/slurm-chroots), one
directory per suite and recipe, like the lab machine image. Every command runs in its own mount
namespace (`unshare --mount`) that binds /proc, /sys and /dev into the chroot, so nothing stays
mounted on the host when the command or daemon ends.
"""

import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from opsctl.slurm.hostlist import hostlist_expression
from opsctl_lab.errors import LabError
from opsctl_lab.machines.settings import DEFAULT_MIRROR
from opsctl_lab.processes import run, running, start, stop_all
from opsctl_lab.slurm_reboot import write_program

# suite -> the Slurm release line it carries (checked at build time: `version` reads the package).
SUITES = {"trixie": "24.11", "sid": "26.05"}
PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge", "mount"]
RECIPE_VERSION = "1"
STAMP = ".opsctl-chroot-recipe"
CHECKER = Path(__file__).resolve().parents[2] / "playbooks" / "roles" / "slurm_common" / "files" / "opsctl-slurm-check"
# Inside a private mount namespace: bind the root onto itself (so that / is a mount point in the chroot
# and a command there may make its own private namespace, as the slurm role's checker does), mount
# /proc, /sys and /dev into it, then run the command there.
_ENTER = ('root=$1; shift; mount --bind "$root" "$root" || exit 1; '
          'for fs in proc sys dev; do mount --rbind "/$fs" "$root/$fs" || exit 1; done; '
          'exec chroot "$root" "$@"')


def chroot_dir() -> Path:
    return Path(os.environ.get("OPSCTL_LAB_CHROOT_DIR") or "/var/cache/opsctl/slurm-chroots")


def _recipe(suite: str, mirror: str) -> str:
    return hashlib.sha256("\n".join([RECIPE_VERSION, suite, mirror, *PACKAGES]).encode()).hexdigest()


@dataclass(frozen=True)
class SlurmChroot:
    suite: str
    root: Path

    @classmethod
    def ensure(cls, suite: str, mirror: str = DEFAULT_MIRROR) -> "SlurmChroot":
        """The cached chroot of `suite`, built first if it is missing or of another recipe."""
        if suite not in SUITES:
            raise LabError(f"unknown suite {suite!r}: one of {', '.join(SUITES)}")
        recipe = _recipe(suite, mirror)
        root = chroot_dir() / f"{suite}-{recipe[:16]}"
        root.parent.mkdir(parents=True, exist_ok=True)
        with open(root.parent / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another test session may be building it right now
            if not _current(root, recipe):
                _build(suite, mirror, root, recipe)
        return cls(suite=suite, root=root)

    def command(self, argv: list[str]) -> list[str]:
        """argv as a host command that runs it inside the chroot."""
        return ["unshare", "--mount", "--fork", "sh", "-c", _ENTER, "opsctl-chroot", str(self.root), *argv]

    def run(self, argv: list[str], check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run(self.command(argv), check=check, timeout=timeout)

    @property
    def version(self) -> str:
        """The Slurm release in the chroot, e.g. 24.11.5 (the package version without its Debian revision;
        `sinfo --version` of 24.11 wants a configuration first)."""
        return self.run(["dpkg-query", "-W", "-f", "${Version}", "slurm-client"]).stdout.split("-")[0]

    def slurmd_check(self, conf_dir: Path, nodes: list[str],
                     cgroup_conf: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run the slurm role's checker (`slurmd -G -N NODE` for each node) with this release's slurmd
        on conf_dir's slurm.conf, gres.conf and cgroup.conf. Returns the CompletedProcess.

        slurmd of 26.05 makes a MUNGE credential before it parses anything, so a munged runs in the
        chroot for the check: the one of a ChrootCluster that is up, else one started for it."""
        with tempfile.TemporaryDirectory(dir=self.root / "tmp") as work, self._munged():
            inside = Path(work)
            shutil.copy(CHECKER, inside / "check")
            for name in ("slurm.conf", "gres.conf"):
                shutil.copy(conf_dir / name, inside / name)
            shutil.copy(cgroup_conf or conf_dir / "cgroup.conf", inside / "cgroup.conf")
            jail = "/" + str(inside.relative_to(self.root))
            return self.run([f"{jail}/check", f"{jail}/slurm.conf", f"{jail}/gres.conf", f"{jail}/cgroup.conf",
                             *nodes], check=False)

    @contextmanager
    def _munged(self) -> Iterator[None]:
        """A munged in this chroot for as long as the block runs (one already answering is reused)."""
        with open(self.root / "tmp" / ".opsctl-munged.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.run(["munge", "-n"], check=False).returncode == 0:
                yield
                return
            run_dir = self.root / "tmp" / f"opsctl-munged-{os.getpid()}"
            self.run(["install", "-d", "-o", "munge", "-g", "munge", "-m", "0755", "/run/munge"])
            start("munged", self.command(["runuser", "-u", "munge", "--", "munged", "--foreground", "--force"]),
                  run_dir, run_dir)
            try:
                _wait(lambda: self.run(["munge", "-n"], check=False).returncode == 0, 15,
                      f"munged in the {self.suite} chroot did not answer (log in {run_dir})")
                yield
            finally:
                stop_all(run_dir, timeout=15)
                shutil.rmtree(run_dir, ignore_errors=True)


def _current(root: Path, recipe: str) -> bool:
    try:
        return (root / STAMP).read_text().strip() == recipe
    except OSError:
        return False


def _build(suite: str, mirror: str, root: Path, recipe: str) -> None:
    staging = root.with_name(root.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", suite, str(staging), mirror],
        timeout=900)
    # One munge key per chroot, made where munged will read it (mungekey(8)).
    key = staging / "etc/munge/munge.key"
    if not key.exists():
        run(["chroot", str(staging), "mungekey", "--create"], timeout=60)
    run(["chroot", str(staging), "apt-get", "clean"], check=False)
    (staging / STAMP).write_text(recipe + "\n")
    shutil.rmtree(root, ignore_errors=True)
    staging.rename(root)
    for old in root.parent.glob(f"{suite}-*"):
        if old != root and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)


SLURM_CONF = """\
# slurm.conf of an opsctl lab cluster inside the {suite} chroot (Slurm {version}).
ClusterName=opsctl-{suite}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={state}/munge/munge.socket
CredType=cred/munge
StateSaveLocation={state}/state
SlurmdSpoolDir={state}/spool/%n
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile={state}/slurmd.%n.pid
SlurmctldLogFile={state}/log/slurmctld.log
SlurmdLogFile={state}/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmdParameters=config_overrides
# 2, unlike the lab's 1: tests/component/test_slurm_chroots.py proves that opsctl refuses to reboot here.
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdTimeout=300
InactiveLimit=0
KillWait=5
MinJobAge=30
MpiDefault=none
# `scontrol reboot`: RebootProgram restarts the node's slurmd (opsctl_lab.slurm_reboot). 26.05 issues
# reboots from its power_save thread, every power_save_interval (10 s by default) when nothing else
# wakes it: 1 s, so that a reboot starts as promptly as in 22.05 and 24.11 (slurm.conf(5)).
RebootProgram={reboot_program}
SlurmctldParameters=power_save_interval=1
NodeName={nodes} NodeAddr=127.0.0.1 NodeHostname=localhost Port={ports} CPUs=8 RealMemory=16000 State=UNKNOWN{gres}
{partitions}
{extra}"""
MAX_INDEX, NODES_PER_INDEX = 100, 300  # slurmd ports 29001..59000, slurmctld 28817..28916


class ChrootCluster:
    """A real slurmctld and one slurmd per node, all inside a chroot, on their own ports.

    Ports: slurmctld 28817 + index, slurmd from 29001 + 300 * index (at most 300 nodes), `index` (0-99)
    telling clusters apart: 10 * OPSCTL_LAB_SLOT + n keeps parallel sessions apart. The state lives in
    <chroot>/var/lib/opsctl-<name>, and so does the cluster's own munged socket: clusters of one chroot
    never share a munged.

    `gres` (e.g. "gpu:h200:8") gives every node that many GPUs, with device files made by mknod as
    the host lab does; `extra_conf` lines are appended to slurm.conf. `scontrol reboot` reboots a node
    as the host lab does (opsctl_lab.slurm_reboot: its slurmd stops and starts again with -b), unless
    `reboot_program` names another RebootProgram (a path inside the chroot).
    """

    def __init__(self, chroot: SlurmChroot, name: str, nodes: list[str], index: int = 0,
                 partitions: dict[str, list[str]] | None = None, gres: str | None = None, extra_conf: str = "",
                 reboot_program: str | None = None):
        self.chroot = chroot
        self.name = name
        self.nodes = list(nodes)
        self.index = index
        self.inside = Path("/var/lib") / f"opsctl-{name}"  # the state dir as seen inside the chroot
        self.state = chroot.root / self.inside.relative_to("/")
        if not 0 <= index < MAX_INDEX or len(self.nodes) > NODES_PER_INDEX:
            raise LabError(f"ChrootCluster: index must be 0-{MAX_INDEX - 1} and nodes at most {NODES_PER_INDEX}")
        self.ctld_port = 28817 + index
        first = 29001 + NODES_PER_INDEX * index
        self.gres = gres
        nodelist = ",".join(hostlist_expression(self.nodes))
        parts = partitions or {"gpu": self.nodes}
        self.own_reboot_program = reboot_program is None
        self.reboot_program = reboot_program or str(self.inside / "opsctl-lab-reboot")
        self.conf_text = SLURM_CONF.format(
            suite=chroot.suite, version=SUITES[chroot.suite], ctld_port=self.ctld_port, state=self.inside,
            reboot_program=self.reboot_program,
            gres=f" Gres={gres}" if gres else "", extra=("GresTypes=gpu\n" if gres else "") + extra_conf,
            nodes=nodelist, ports=",".join(hostlist_expression(range(first, first + len(self.nodes)))),
            partitions="\n".join(
                f"PartitionName={p} Nodes={','.join(hostlist_expression(members))} Default={'YES' if i == 0 else 'NO'} "
                "MaxTime=INFINITE State=UP" for i, (p, members) in enumerate(parts.items())))

    @property
    def run_dir(self) -> Path:
        return self.state / "run"

    @property
    def bin(self) -> Path:
        return self.state / "bin"

    @property
    def sinfo(self) -> str:
        return str(self.bin / "sinfo")

    @property
    def scontrol(self) -> str:
        return str(self.bin / "scontrol")

    def _env_argv(self, argv: list[str]) -> list[str]:
        return self.chroot.command(["env", f"SLURM_CONF={self.inside}/slurm.conf", *argv])

    def up(self, timeout: float = 60, fresh: bool = False, slurmd: bool = True) -> None:
        """Start the cluster; `fresh` forgets what slurmctld saved (drains, reservations) last time. Without
        `slurmd`, only munged and slurmctld start (its nodes stay UNKNOWN): enough for what slurmctld alone
        reads, such as a topology.conf (in the state directory, beside slurm.conf), in a second or two."""
        if fresh:
            shutil.rmtree(self.state / "state", ignore_errors=True)
        for sub in ("state", "spool", "log", "run", "bin"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        (self.state / "slurm.conf").write_text(self.conf_text)
        if self.own_reboot_program:
            write_program(self.state / "opsctl-lab-reboot", cluster=f"the {self.name} cluster in the "
                          f"{self.chroot.suite} chroot", self_path=self.reboot_program, run_dir=self.inside / "run",
                          log_dir=self.inside / "log", slurm_conf=self.inside / "slurm.conf")
        if self.gres:
            self._gres_conf()
        # The cluster tracks processes through /proc; slurmd of 24.11+ would otherwise set up cgroups,
        # which this v1/v2 hybrid host does not offer it (cgroup.conf(5), CgroupPlugin=disabled).
        (self.state / "cgroup.conf").write_text("CgroupPlugin=disabled\n")
        (self.state / "cluster.json").write_text(json.dumps({"nodes": self.nodes, "suite": self.chroot.suite}))
        for tool in ("sinfo", "scontrol", "squeue", "srun", "sbatch"):
            wrapper = self.bin / tool
            wrapper.write_text("#!/bin/sh\n# This chroot's Slurm client with its cluster's slurm.conf.\n"
                               f"exec {' '.join(_quote(a) for a in self._env_argv([f'/usr/bin/{tool}']))} \"$@\"\n")
            wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        logs = self.state / "log"
        # munged as the chroot's munge user, as its package runs it (lab-facts: a root munged refuses
        # credentials for root clients), with this cluster's own socket (slurm.conf AuthInfo).
        munge = f"{self.inside}/munge"
        self.chroot.run(["install", "-d", "-o", "munge", "-g", "munge", "-m", "0700", munge])
        start("munged", self.chroot.command(["runuser", "-u", "munge", "--", "munged", "--foreground", "--force",
                                             f"--socket={munge}/munge.socket", f"--pid-file={munge}/munged.pid",
                                             f"--seed-file={munge}/munged.seed"]), self.run_dir, logs)
        _wait(lambda: (self.state / "munge" / "munge.socket").exists(), 15, "munged in the chroot made no socket")
        start("slurmctld", self._env_argv(["slurmctld", "-D", "-i"]), self.run_dir, logs)
        if not slurmd:
            _wait(self._answers, timeout, f"{self.name}: slurmctld does not answer (logs in {logs})")
            return
        for node in self.nodes:
            start(f"slurmd.{node}", self._env_argv(["slurmd", "-D", "-N", node]), self.run_dir, logs)
        _wait(self._all_idle, timeout, f"{self.name}: nodes not idle (logs in {logs})")

    def _gres_conf(self) -> None:
        """gres.conf and /dev/nvidiaN stand-ins (character devices 195:N) for `gres`, as the host lab has."""
        count = int(str(self.gres).rsplit(":", 1)[-1])
        gpu_type = str(self.gres).split(":")[1] if str(self.gres).count(":") == 2 else ""
        dev = self.state / "dev"
        dev.mkdir(exist_ok=True)
        for gpu in range(count):
            if not (dev / f"nvidia{gpu}").exists():
                os.mknod(dev / f"nvidia{gpu}", 0o666 | stat.S_IFCHR, os.makedev(195, gpu))
        files = f"{self.inside}/dev/nvidia[0-{count - 1}]" if count > 1 else f"{self.inside}/dev/nvidia0"
        (self.state / "gres.conf").write_text(
            f"AutoDetect=off\nNodeName={','.join(hostlist_expression(self.nodes))} Name=gpu"
            + (f" Type={gpu_type}" if gpu_type else "") + f" File={files}\n")

    def _answers(self) -> bool:
        return "is UP" in run([self.scontrol, "ping"], check=False, timeout=20).stdout

    def _all_idle(self) -> bool:
        out = run([self.sinfo, "-h", "-N", "-o", "%N %t"], check=False, timeout=20)
        states = dict(line.split(None, 1) for line in out.stdout.splitlines() if " " in line)
        return out.returncode == 0 and set(states) >= set(self.nodes) and \
            all(states[n].startswith("idle") and not states[n].endswith("*") for n in self.nodes)

    def running(self) -> dict[str, int]:
        return running(self.run_dir)

    def down(self) -> None:
        stop_all(self.run_dir, timeout=15)


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


def _wait(check: Callable[[], object], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise LabError(message)
        time.sleep(0.3)


if __name__ == "__main__":
    # `python -m opsctl_lab.slurm_chroot`: every suite's chroot built now (`make test` starts this beside the
    # streams, so that the tiers that use them find them built instead of waiting for debootstrap).
    for name in SUITES:
        SlurmChroot.ensure(name)
