"""Capture real `sacct --json` output of Slurm 22.05, 24.11 and 26.05 as test fixtures.

    python3 tools/capture_sacct.py --out tests/fixtures/slurm [--only 22.05,24.11,26.05]

Root only; about three minutes per release. Per release, one small accounting cluster:
  * 22.05.8: Debian 12's own slurmctld/slurmd/slurmdbd on this host (`apt-get install slurmdbd mariadb-server`);
  * 24.11.x, 26.05.x: Debian 13 (trixie) and unstable (sid) in debootstrap chroots of this script's own
    (--chroots, default /var/tmp/sacct-chroots, built once with slurmdbd added; never the lab's shared
    cache), run through opsctl_lab.slurm_chroot.SlurmChroot (each command in its own mount namespace).
Every cluster has nodes gpu001..gpu005 with Gres=gpu:h200:8 (/dev/nvidiaN stand-ins from mknod),
AccountingStorageType=accounting_storage/slurmdbd, AccountingStorageTRES=gres/gpu, jobacct_gather/linux,
SlurmdTimeout=20. One MariaDB server of this script's own (--no-defaults, datadir and socket under
--work, default /var/tmp/sacct-capture, TCP 127.0.0.1:23306) serves every slurmdbd, one database and
one user per release, with a random password made per run.

Ports (away from the lab's 16817 and 17001+, and from ChrootCluster's 28817+): slurmctld 24817 + 10*i,
slurmdbd 24819 + 10*i, slurmd 24901 + 10*i + n, i = 0, 1, 2 for 22.05, 24.11, 26.05.

Jobs, all as root, and the files written to --out (sacct-<version>-<what>.json, stdout of sacct verbatim):
  failed     sbatch -N4 -w gpu[001-004] --gres=gpu:8 --wrap 'srun sleep 2; exit 1'
  completed  sbatch -N1 -w gpu005 --gres=gpu:4 --wrap 'srun hostname'
  timeout    sbatch -N1 -w gpu001 --gres=gpu:1 --time=1 --wrap 'srun sleep 300'
  cancelled  sbatch -N2 -w gpu[002-003] --gres=gpu:8 --wrap 'srun sleep 300', `scancel` once its step runs
  node-fail  sbatch -N2 -w gpu[004-005] --gres=gpu:8 --no-requeue --wrap 'srun sleep 300', then SIGKILL
             to gpu005's slurmd (its process group) until slurmctld marks the node DOWN
each as `sacct --json -j ID`; plus all-X (`sacct --json -X -S START -E now --allusers`) and N-gpu002
(`sacct --json -N gpu002 -S START -E now`); sacct's own table of the same jobs goes to
--work/sacct-<version>-check.txt, to check the JSON against. Every daemon, and whatever a job left
running, stops at the end, also on failure (Ctrl-C included); nothing stays mounted.
"""

import argparse
import os
import secrets
import shutil
import signal
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "lab")]

from opsctl.slurm.hostlist import hostlist_expression  # noqa: E402
from opsctl_lab.processes import read_pidfile, run, start, stop_all  # noqa: E402
from opsctl_lab.slurm_chroot import SlurmChroot, _wait  # noqa: E402

MIRROR = "http://deb.debian.org/debian"
CHROOT_PACKAGES = ["slurmctld", "slurmd", "slurm-client", "slurmdbd", "munge", "mount"]
NODES = [f"gpu{n:03d}" for n in range(1, 6)]
DB_PORT = 23306
RELEASES = {"22.05": "bookworm", "24.11": "trixie", "26.05": "sid"}  # release line -> Debian suite
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")

SLURM_CONF = """\
# slurm.conf of tools/capture_sacct.py (Slurm {version}, Debian {suite})
ClusterName={cluster}
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
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
GresTypes=gpu
SlurmdTimeout=20
InactiveLimit=0
KillWait=5
MinJobAge=30
MpiDefault=none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={dbd_port}
AccountingStorageTRES=gres/gpu
# the munged socket of the connection to slurmdbd (AuthInfo covers only slurmctld's and slurmd's)
AccountingStoragePass={state}/munge/munge.socket
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
NodeName={nodes} NodeAddr=127.0.0.1 NodeHostname=localhost Port={ports} CPUs=16 RealMemory=64000 Gres=gpu:h200:8 State=UNKNOWN
PartitionName=gpu Nodes={nodes} Default=YES MaxTime=INFINITE State=UP
"""

SLURMDBD_CONF = """\
AuthType=auth/munge
AuthInfo=socket={state}/munge/munge.socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={dbd_port}
SlurmUser=root
LogFile={state}/log/slurmdbd.log
PidFile={state}/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={db_port}
StorageUser={db_user}
StoragePass={db_pass}
StorageLoc={db_name}
"""


@dataclass(frozen=True)
class Host:
    """Debian 12's own Slurm on this host, with the interface of SlurmChroot that this script uses."""
    suite: str = "bookworm"
    root: Path = Path("/")

    def command(self, argv: list[str]) -> list[str]:
        return list(argv)

    def run(self, argv: list[str], check: bool = True, timeout: float = 120):
        return run(argv, check=check, timeout=timeout)

    @property
    def version(self) -> str:
        return self.run(["dpkg-query", "-W", "-f", "${Version}", "slurm-client"]).stdout.split("-")[0]


def ensure_chroot(suite: str, chroots: Path) -> SlurmChroot:
    """This script's own chroot of `suite` (the lab's SlurmChroot recipe plus slurmdbd), built once."""
    root = chroots / suite
    stamp = root / ".sacct-capture"
    if not stamp.exists():
        staging = chroots / f"{suite}.new"
        shutil.rmtree(staging, ignore_errors=True)
        chroots.mkdir(parents=True, exist_ok=True)
        run(["debootstrap", "--variant=minbase", f"--include={','.join(CHROOT_PACKAGES)}", suite, str(staging),
             MIRROR], timeout=900)
        if not (staging / "etc/munge/munge.key").exists():
            run(["chroot", str(staging), "mungekey", "--create"])
        run(["chroot", str(staging), "apt-get", "clean"], check=False)
        (staging / ".sacct-capture").write_text(" ".join(CHROOT_PACKAGES) + "\n")
        shutil.rmtree(root, ignore_errors=True)
        staging.rename(root)
    # minbase has no /etc/hosts: slurmctld must resolve localhost and this host's name (an srun's address)
    shutil.copy("/etc/hosts", root / "etc/hosts")
    return SlurmChroot(suite=suite, root=root)


class MariaDB:
    """A private mariadbd: its own datadir and socket under `work`, TCP on 127.0.0.1 only."""

    def __init__(self, work: Path):
        self.dir = work / "mariadb"
        self.data, self.socket, self.run_dir = self.dir / "data", self.dir / "mysqld.sock", self.dir / "run"

    def up(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        shutil.chown(self.dir, "mysql", "mysql")
        if not (self.data / "mysql").is_dir():
            run(["mariadb-install-db", "--no-defaults", f"--datadir={self.data}", "--user=mysql",
                 "--auth-root-authentication-method=socket", "--skip-test-db"], timeout=300)
        start("mariadbd", ["mariadbd", "--no-defaults", f"--datadir={self.data}", f"--socket={self.socket}",
                           f"--port={DB_PORT}", "--bind-address=127.0.0.1", "--skip-name-resolve", "--user=mysql",
                           f"--pid-file={self.dir / 'mariadbd.pid'}", "--innodb-buffer-pool-size=256M",
                           "--innodb-lock-wait-timeout=900", "--innodb-log-file-size=64M"],
              self.run_dir, self.dir)
        _wait(lambda: self.sql("SELECT 1", check=False).returncode == 0, 60,
              f"mariadbd did not answer (log in {self.dir}/mariadbd.log)")

    def sql(self, statement: str, check: bool = True):
        return run(["mariadb", "--no-defaults", f"--socket={self.socket}", "-u", "root", "-e", statement],
                   check=check, timeout=60)

    def database(self, name: str) -> tuple[str, str]:
        """A fresh database `name` and its own user, with a new random password: (user, password)."""
        password = secrets.token_urlsafe(24)
        self.sql(f"DROP DATABASE IF EXISTS {name}; CREATE DATABASE {name}; "
                 f"CREATE OR REPLACE USER '{name}'@'127.0.0.1' IDENTIFIED BY '{password}'; "
                 f"GRANT ALL ON {name}.* TO '{name}'@'127.0.0.1'")
        return name, password

    def down(self) -> None:
        stop_all(self.run_dir, timeout=60)


class Cluster:
    """munged, slurmdbd, slurmctld and one slurmd per node of one release, on the host or in a chroot."""

    def __init__(self, system, index: int, db: MariaDB):
        self.system, self.db = system, db
        self.version = system.version
        self.cluster = "sacct-" + self.version.rsplit(".", 1)[0].replace(".", "")
        self.inside = Path("/var/tmp/sacct-capture") / self.cluster if system.suite == "bookworm" \
            else Path("/var/lib/sacct-capture")
        self.state = system.root / self.inside.relative_to("/")
        self.run_dir = self.state / "run"
        self.ctld_port, self.dbd_port = 24817 + 10 * index, 24819 + 10 * index
        first = 24901 + 10 * index
        self.ports = ",".join(hostlist_expression(range(first, first + len(NODES))))

    def cmd(self, *argv: str) -> list[str]:
        return self.system.command(["env", f"SLURM_CONF={self.inside}/slurm.conf", *argv])

    def slurm(self, *argv: str, check: bool = True) -> str:
        return run(self.cmd(*argv), check=check, timeout=60).stdout

    def up(self) -> None:
        shutil.rmtree(self.state, ignore_errors=True)
        for sub in ("state", "spool", "log", "run", "dev", "out"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        nodes = ",".join(hostlist_expression(NODES))
        (self.state / "slurm.conf").write_text(SLURM_CONF.format(
            version=self.version, suite=self.system.suite, cluster=self.cluster, ctld_port=self.ctld_port,
            dbd_port=self.dbd_port, state=self.inside, nodes=nodes, ports=self.ports))
        for gpu in range(8):
            os.mknod(self.state / "dev" / f"nvidia{gpu}", 0o666 | stat.S_IFCHR, os.makedev(195, gpu))
        (self.state / "gres.conf").write_text(
            f"AutoDetect=off\nNodeName={nodes} Name=gpu Type=h200 File={self.inside}/dev/nvidia[0-7]\n")
        if self.system.suite != "bookworm":  # 24.11+ would set up cgroups, which this hybrid host lacks
            (self.state / "cgroup.conf").write_text("CgroupPlugin=disabled\n")
        user, password = self.db.database(self.cluster.replace("-", "_"))
        dbd_conf = self.state / "slurmdbd.conf"
        dbd_conf.touch(mode=0o600)
        dbd_conf.write_text(SLURMDBD_CONF.format(state=self.inside, dbd_port=self.dbd_port, db_port=DB_PORT,
                                                 db_user=user, db_pass=password, db_name=user))
        logs, munge = self.state / "log", f"{self.inside}/munge"
        self.system.run(["install", "-d", "-o", "munge", "-g", "munge", "-m", "0755", munge])
        start("munged", self.system.command(["runuser", "-u", "munge", "--", "munged", "--foreground", "--force",
                                             f"--socket={munge}/munge.socket", f"--pid-file={munge}/munged.pid",
                                             f"--seed-file={munge}/munged.seed", f"--log-file={munge}/munged.log"]),
              self.run_dir, logs)
        _wait(lambda: (self.state / "munge" / "munge.socket").exists(), 15, "munged made no socket")
        # slurmdbd reads the slurmdbd.conf next to $SLURM_CONF
        start("slurmdbd", self.cmd("slurmdbd", "-D"), self.run_dir, logs)
        _wait(lambda: run(self.cmd("sacctmgr", "-n", "list", "cluster"), check=False).returncode == 0, 60,
              f"slurmdbd did not answer (logs in {logs})")
        self.slurm("sacctmgr", "-i", "add", "cluster", self.cluster)
        start("slurmctld", self.cmd("slurmctld", "-D", "-i"), self.run_dir, logs)
        for node in NODES:
            self.start_slurmd(node)
        _wait(self.all_idle, 90, f"{self.cluster}: nodes not idle (logs in {logs})")

    def start_slurmd(self, node: str) -> None:
        start(f"slurmd.{node}", self.cmd("slurmd", "-D", "-N", node), self.run_dir, self.state / "log")

    def kill_slurmd(self, node: str) -> None:
        """SIGKILL to the node's slurmd and its process group, as if the node died."""
        pid = read_pidfile(self.run_dir / f"slurmd.{node}.pid")
        if pid is not None:
            os.killpg(pid, signal.SIGKILL)

    def all_idle(self) -> bool:
        out = run(self.cmd("sinfo", "-h", "-N", "-o", "%N %t"), check=False, timeout=20)
        states = dict(line.split(None, 1) for line in out.stdout.splitlines() if " " in line)
        return out.returncode == 0 and all(states.get(n) == "idle" for n in NODES)

    def sbatch(self, name: str, *args: str) -> str:
        out = self.slurm("sbatch", "--parsable", f"--job-name={name}", f"--output={self.inside}/out/%j.out",
                         f"--chdir={self.inside}/out", *args)
        return out.strip().split(";")[0]

    def squeue_state(self, job: str) -> str:
        return self.slurm("squeue", "-h", "-j", job, "-o", "%T", check=False).strip()

    def accounted(self, job: str) -> bool:
        """True once sacct has the job and all its steps in a final state, with an end time."""
        rows = [r.split("|") for r in self.slurm("sacct", "-n", "-P", "-j", job, "-o", "State,End",
                                                 check=False).splitlines()]
        return bool(rows) and all(s.split()[0] in FINAL and end not in ("", "Unknown") for s, end in rows)

    def sacct_json(self, *args: str) -> str:
        return self.slurm("sacct", "--json", *args)

    def down(self) -> None:
        stop_all(self.run_dir, timeout=20)
        # What a job left behind (a step of a node whose slurmd died, a job of a failed run): in a chroot,
        # every process rooted there; on the host, every process started with this cluster's SLURM_CONF.
        mine = f"SLURM_CONF={self.inside}/slurm.conf".encode()
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                if (self.system.suite != "bookworm" and os.readlink(proc / "root") == str(self.system.root)) or \
                        (self.system.suite == "bookworm" and mine in (proc / "environ").read_bytes().split(b"\0")):
                    os.kill(int(proc.name), signal.SIGKILL)
            except OSError:
                pass


def capture(cluster: Cluster, out: Path, work: Path, log) -> None:
    version = cluster.version
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 2))
    jobs = {"failed": cluster.sbatch("failed", "-N4", "-w", "gpu[001-004]", "--gres=gpu:8",
                                     "--wrap", "srun sleep 2; exit 1"),
            "completed": cluster.sbatch("completed", "-N1", "-w", "gpu005", "--gres=gpu:4", "--wrap", "srun hostname")}
    _wait(lambda: cluster.accounted(jobs["failed"]) and cluster.accounted(jobs["completed"]), 90,
          f"{version}: the first jobs did not end in sacct")
    jobs["timeout"] = cluster.sbatch("timeout", "-N1", "-w", "gpu001", "--gres=gpu:1", "--time=1",
                                     "--wrap", "srun sleep 300")
    jobs["cancelled"] = cluster.sbatch("cancelled", "-N2", "-w", "gpu[002-003]", "--gres=gpu:8",
                                       "--wrap", "srun sleep 300")
    jobs["node-fail"] = cluster.sbatch("node-fail", "-N2", "-w", "gpu[004-005]", "--gres=gpu:8", "--no-requeue",
                                       "--wrap", "srun sleep 300")
    for name in ("cancelled", "node-fail"):
        _wait(lambda: cluster.squeue_state(jobs[name]) == "RUNNING", 60, f"{version}: {name} job never ran")
    time.sleep(5)  # the srun steps start
    cluster.slurm("scancel", jobs["cancelled"])
    log(f"{version}: killing gpu005's slurmd under job {jobs['node-fail']}")
    cluster.kill_slurmd("gpu005")
    _wait(lambda: cluster.accounted(jobs["node-fail"]), 180, f"{version}: the node-fail job did not end")
    _wait(lambda: cluster.accounted(jobs["cancelled"]), 60, f"{version}: the cancelled job did not end")
    _wait(lambda: cluster.accounted(jobs["timeout"]), 240, f"{version}: the timeout job did not end")
    cluster.start_slurmd("gpu005")  # back, so that slurmctld ends the stale step there
    for name, job in jobs.items():
        (out / f"sacct-{version}-{name}.json").write_text(cluster.sacct_json("-j", job))
        log(f"{version}: {name} = job {job}")
    (out / f"sacct-{version}-all-X.json").write_text(cluster.sacct_json("-X", "-S", since, "-E", "now", "--allusers"))
    (out / f"sacct-{version}-N-gpu002.json").write_text(cluster.sacct_json("-N", "gpu002", "-S", since, "-E", "now"))
    # sacct's own table of the same jobs, to check the JSON against (not a fixture)
    (work / f"sacct-{version}-check.txt").write_text(cluster.slurm(
        "sacct", "-a", "-P", "-S", since, "-E", "now", "-o",
        "JobID,JobName,State,ExitCode,DerivedExitCode,NodeList,Start,End,Elapsed,Timelimit"))
    log(f"{version}: -S {since}; wrote sacct-{version}-*.json and {work}/sacct-{version}-check.txt")
    _wait(lambda: cluster.slurm("squeue", "-h") == "", 60, f"{version}: jobs still queued after the capture")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", default=",".join(RELEASES), help="release lines, comma-separated")
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/sacct-capture"))
    parser.add_argument("--chroots", type=Path, default=Path("/var/tmp/sacct-chroots"))
    args = parser.parse_args()

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    db = MariaDB(args.work)
    try:
        db.up()
        for index, (line, suite) in enumerate(RELEASES.items()):
            if line not in args.only.split(","):
                continue
            system = Host() if suite == "bookworm" else ensure_chroot(suite, args.chroots)
            cluster = Cluster(system, index, db)
            log(f"{cluster.version}: up ({cluster.cluster}, state in {cluster.state})")
            try:
                cluster.up()
                capture(cluster, args.out, args.work, log)
            finally:
                cluster.down()
    finally:
        db.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
