"""The `cli` Slurm backend: node state from Slurm's JSON, changes through `scontrol update`.

Which command prints the nodes depends on the release (`scontrol --version`, read once per run):

- 22.05 has no `scontrol ... --json` (it answers "unrecognized option"); its `sinfo --json` lists
  one entry per node, the base state as a string and the flags apart, times as Unix seconds (0: none):
    {"nodes": [{"name": "gpu042", "state": "idle", "state_flags": ["DRAIN"], "reason": "...",
                "reason_set_by_user": "root", "reason_changed_at": 1796075950, "boot_time": 1796073198,
                "partitions": ["gpu"], "gres": "gpu:h200:8"}], ...}
- 23.02 and later print `sinfo --json` as aggregated records (`{"sinfo": [{"node": {"state": [...]},
  "nodes": {"nodes": [names]}, ...}]}`), one per group of alike nodes, so it no longer describes each
  node; `scontrol show nodes --json` (new in 23.02) does, with state and flags in one list and times
  as numbers that may be unset:
    {"nodes": [{"name": "gpu042", "state": ["IDLE", "DRAIN"], "reason": "...", "reason_set_by_user": "root",
                "reason_changed_at": {"set": true, "infinite": false, "number": 1796075926},
                "boot_time": {"set": true, "infinite": false, "number": 1796073197},
                "partitions": ["gpu"], "gres": ""}], "errors": [], ...}

`reason_set_by_user` and `reason_changed_at` are Slurm's record of who set the reason and when (`scontrol
show node` prints them as `Reason=... [root@2026-12-04T10:12:30]`); a node without a reason has none (0, or
an empty or default user). The actor judges opsctl's reasons with them (opsctl/actor/custody.py).

scontrol exits 0 on success and 1 with a message on stderr otherwise. A slurm.conf that SLURM_CONF
names but that is missing or unreadable makes sinfo and scontrol retry for 60 s ("cannot stat file
..., retrying in 1sec up to 60sec"), so it is checked before the first call.
"""

import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping

from opsctl.errors import SourceUnavailable
from opsctl.slurm.accounting import FinishedJob, parse_sacct, sacct_time
from opsctl.slurm.base import Job, JobSpec, NodesBusy, RunningJob, SlurmNode, StepSpec, load_slurm_json
from opsctl.slurm.hostlist import expand_hostlist
from opsctl.slurm.requeue import FLAGS_FORMAT, GONE, QUEUE_FORMAT, QueuedJob, parse_queued_job

# The first release whose scontrol prints JSON (and whose sinfo --json aggregates nodes).
SCONTROL_JSON_SINCE = (23, 2)
_VERSION = re.compile(r"\b(\d+)\.(\d+)\.\d+")


def _seconds(value: object) -> float | None:
    """A time of Slurm's JSON: 22.05's number, or 23.02+'s {"set", "infinite", "number"}; None when unset or 0."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return float(value)


def _node(raw: object, where: str) -> SlurmNode:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise SourceUnavailable(f"{where}: a node entry has no name")
    state = raw.get("state", "")
    flags = [str(f).upper() for f in raw.get("state_flags") or []]
    if isinstance(state, list):  # 23.02+: ["IDLE", "DRAIN"]; the first is the base state
        flags += [str(s).upper() for s in state[1:]]
        state = state[0] if state else ""
    if not isinstance(state, str):
        raise SourceUnavailable(f"{where}: node {raw['name']} has a state of type {type(state).__name__}")
    partitions = raw.get("partitions") or []
    reason = str(raw.get("reason") or "")
    return SlurmNode(name=raw["name"], state=state.lower(), flags=tuple(dict.fromkeys(flags)), reason=reason,
                     partitions=tuple(str(p) for p in partitions) if isinstance(partitions, list) else (),
                     gres=str(raw.get("gres") or ""), boot_time=_seconds(raw.get("boot_time")),
                     # Only a reason has a setter: 24.11 names root for a node that has none.
                     reason_user=str(raw.get("reason_set_by_user") or "") if reason else "",
                     reason_time=_seconds(raw.get("reason_changed_at")) if reason else None)


def parse_nodes(text: str, where: str = "scontrol show nodes --json") -> dict[str, SlurmNode]:
    """Nodes from `sinfo --json` of 22.05 or `scontrol show nodes --json` of 23.02 and later."""
    data = load_slurm_json(text, where)
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list):
        if isinstance(data.get("sinfo"), list):
            raise SourceUnavailable(f"{where}: this is the aggregated sinfo of Slurm 23.02 or later, which does not "
                                    "describe each node; read it with scontrol show nodes --json")
        raise SourceUnavailable(f"{where}: no `nodes` list in the output")
    nodes = {}
    for raw in raw_nodes:
        node = _node(raw, where)
        nodes[node.name] = node
    return nodes


def parse_sinfo(text: str) -> dict[str, SlurmNode]:
    return parse_nodes(text, "sinfo --json")


def parse_version(text: str) -> tuple[int, int]:
    """'slurm 23.02.7' or 'slurm-wlm 24.11.5' -> (23, 2)."""
    match = _VERSION.search(text)
    if not match:
        raise SourceUnavailable(f"Slurm: cannot tell the release from `scontrol --version`: {text.strip()[:60]!r}")
    return int(match.group(1)), int(match.group(2))


def parse_return_to_service(text: str) -> int:
    """The `ReturnToService         = 1` line of `scontrol show config` (a `Key = value` line in every release)."""
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "ReturnToService":
            if value.strip().isdigit():
                return int(value.strip())
            break
    raise SourceUnavailable("Slurm: `scontrol show config` gives no ReturnToService number")


# Where Debian's Slurm reads its config when SLURM_CONF is not set.
DEFAULT_CONF = "/etc/slurm/slurm.conf"


def parse_squeue(text: str) -> dict[str, Job]:
    """`squeue --noheader --format=%i|%T|%r` -> job id -> Job."""
    jobs = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 3 or not parts[0].isdigit():
            if line.strip():
                raise SourceUnavailable(f"Slurm: squeue printed {line.strip()[:80]!r}, not id|state|reason")
            continue
        jobs[parts[0]] = Job(parts[0], parts[1], "" if parts[2] == "None" else parts[2])
    return jobs


# Everyone's running jobs, one line each: id, user, start, node host list, name. squeue's --json differs from
# 22.05 to 26.05; these format codes print the same in each. The name may hold the delimiter, so it goes last;
# no code has a width, so squeue cuts nothing (squeue(1), -o).
RUNNING_FORMAT = "%i|%u|%S|%N|%j"


def parse_running(text: str) -> list[RunningJob]:
    """`squeue --noheader --states=RUNNING --format=RUNNING_FORMAT` -> the jobs, their host lists expanded."""
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.strip().split("|", 4)
        if len(parts) != 5 or not parts[0] or " " in parts[0] or not parts[0][0].isdigit():
            raise SourceUnavailable(f"Slurm: squeue printed {line.strip()[:80]!r}, not id|user|start|nodes|name")
        job_id, user, start, hostlist, name = parts
        try:
            nodes = tuple(expand_hostlist(hostlist)) if hostlist not in ("", "(null)") else ()
        except ValueError as err:
            raise SourceUnavailable(f"Slurm: squeue: job {job_id}: {err}") from None
        jobs.append(RunningJob(job_id, name, user, nodes, _local_time(start)))
    return jobs


def _local_time(text: str) -> float | None:
    """squeue's %S, local time as 2026-12-04T14:02:11; None for N/A, Unknown or anything else."""
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _first_line(text: str | bytes | None) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else ""


def check_conf(environ: Mapping[str, str]) -> None:
    """Raise at once when the slurm.conf that Slurm's commands would read is missing or unreadable.

    Without SLURM_CONF, a missing default file is fine: a configless client asks slurmd or DNS."""
    path = environ.get("SLURM_CONF")
    if not path:
        if not os.path.exists(DEFAULT_CONF):
            return
        path = DEFAULT_CONF
    try:
        with open(path, "rb"):
            pass
    except OSError as err:
        named = f"SLURM_CONF={path}" if environ.get("SLURM_CONF") else path
        raise SourceUnavailable(f"Slurm: cannot read {named}: {err.strerror or type(err).__name__}") from None


# subprocess.run's shape, so that tests can pass a fake (the lab tier runs the real commands).
Runner = Callable[..., "subprocess.CompletedProcess[str]"]


class SlurmCliImpl:
    def __init__(self, sinfo: str = "sinfo", scontrol: str = "scontrol", timeout: float = 30.0,
                 run: Runner = subprocess.run, environ: Mapping[str, str] = os.environ):
        self.sinfo = sinfo
        self.scontrol = scontrol
        self.timeout = timeout
        self._run = run
        self._version: tuple[int, int] | None = None
        self._environ = environ
        self._conf_checked = False

    def _call(self, argv: list[str]) -> str:
        if not self._conf_checked:
            check_conf(self._environ)
            self._conf_checked = True
        try:
            proc = self._run(argv, capture_output=True, text=True, timeout=self.timeout, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise SourceUnavailable(f"Slurm: {argv[0]} not found (install slurm-client or set slurm.{argv[0]})") \
                from None
        except subprocess.TimeoutExpired as err:
            said = _first_line(err.stderr)
            raise SourceUnavailable(f"Slurm: {argv[0]} {argv[1]} timed out after {self.timeout:g}s"
                                    + (f": {said}" if said else "")) from None
        if proc.returncode != 0:
            msg = _first_line(proc.stderr) or _first_line(proc.stdout) or f"exit {proc.returncode}"
            raise SourceUnavailable(f"Slurm: {argv[0]} {argv[1]} failed: {msg}")
        return str(proc.stdout)

    def version(self) -> tuple[int, int]:
        if self._version is None:
            self._version = parse_version(self._call([self.scontrol, "--version"]))
        return self._version

    def nodes(self) -> dict[str, SlurmNode]:
        if self.version() >= SCONTROL_JSON_SINCE:
            return parse_nodes(self._call([self.scontrol, "show", "nodes", "--json"]))
        return parse_sinfo(self._call([self.sinfo, "--json"]))

    def drain(self, names: list[str], reason: str) -> None:
        # One call for all nodes that share the reason; argv, not a shell, so the reason needs no quoting.
        self._call([self.scontrol, "update", f"nodename={','.join(names)}", "state=drain", f"reason={reason}"])

    def resume(self, names: list[str]) -> None:
        self._call([self.scontrol, "update", f"nodename={','.join(names)}", "state=resume"])

    def set_reason(self, names: list[str], reason: str) -> None:
        # Only the reason: the node keeps its state (a drained node stays drained).
        self._call([self.scontrol, "update", f"nodename={','.join(names)}", f"reason={reason}"])

    def reboot(self, names: list[str], reason: str) -> None:
        # scontrol(1): reboot [ASAP] [nextstate={RESUME|DOWN}] [reason=<reason>] {ALL|<NodeList>}; slurmd runs
        # slurm.conf's RebootProgram, and slurmctld waits for the node to register with a later boot time.
        self._call([self.scontrol, "reboot", "ASAP", "nextstate=DOWN", f"reason={reason}", ",".join(names)])

    def return_to_service(self) -> int:
        return parse_return_to_service(self._call([self.scontrol, "show", "config"]))

    def expand(self, hostlist: str) -> list[str]:
        return self._call([self.scontrol, "show", "hostnames", hostlist]).split()

    # ---- jobs: opsctl's own validation jobs (SlurmJobs) ----------------------------------------------
    def _tool(self, name: str) -> str:
        """sbatch, squeue, scancel: next to the configured scontrol, else on the PATH."""
        where = os.path.dirname(self.scontrol)
        return os.path.join(where, name) if where else name

    def submit(self, spec: JobSpec) -> str:
        # --parsable prints "<id>" or "<id>;<cluster>" (sbatch(1)), the same from 22.05 to 26.05.
        out = self._call([self._tool("sbatch"), "--parsable", f"--job-name={spec.name}",
                          f"--partition={spec.partition}", f"--nodelist={spec.node}", "--nodes=1", "--exclusive",
                          f"--time={spec.minutes}", "--chdir=/", "--output=/dev/null",
                          *([f"--reservation={spec.reservation}"] if spec.reservation else []),
                          f"--wrap={spec.command}"])
        job = out.strip().split(";", 1)[0]
        if not job.isdigit():
            raise SourceUnavailable(f"Slurm: sbatch answered {out.strip()[:80]!r}, not a job id")
        return job

    def queued(self, ids: list[str]) -> dict[str, Job]:
        if not ids:
            return {}
        try:
            out = self._call([self._tool("squeue"), "--noheader", "--states=all", f"--jobs={','.join(ids)}",
                              "--format=%i|%T|%r"])
        except SourceUnavailable as err:
            if "Invalid job id" in str(err):  # every one of them ended and left slurmctld's memory
                return {}
            raise
        return parse_squeue(out)

    def cancel(self, ids: list[str]) -> None:
        if ids:
            self._call([self._tool("scancel"), *ids])

    def running_jobs(self) -> list[RunningJob]:
        return parse_running(self._call([self._tool("squeue"), "--noheader", "--states=RUNNING",
                                         f"--format={RUNNING_FORMAT}"]))

    # ---- reservations and steps: opsctl validate --preflight (SlurmReservations) ----------------------
    def reserve(self, name: str, nodes: list[str], minutes: int) -> None:
        # scontrol(1) "RESERVATIONS": MAINT lets it overlap other reservations; Users=root keeps users' jobs
        # off its nodes. A node that runs a job refuses it: "Requested nodes are busy".
        try:
            self._call([self.scontrol, "create", "reservation", f"ReservationName={name}", "StartTime=now",
                        f"Duration={minutes}", f"Nodes={','.join(nodes)}", "Users=root", "Flags=MAINT"])
        except SourceUnavailable as err:
            if "busy" in str(err).lower():
                raise NodesBusy(str(err)) from None
            raise

    def hand_over(self, name: str, nodes: list[str], users: list[str], minutes: int) -> None:
        # One update, so no node is free between the validation and the caller's use; Flags-= since 20.11.
        self._call([self.scontrol, "update", f"ReservationName={name}", f"Nodes={','.join(nodes)}",
                    f"Users={','.join(users)}", f"Duration={minutes}", "Flags-=MAINT"])

    def release(self, name: str) -> None:
        self._call([self.scontrol, "delete", f"ReservationName={name}"])

    def run_step(self, spec: StepSpec, timeout: float) -> tuple[int, str]:
        # env(1) after srun: Slurm sets CUDA_VISIBLE_DEVICES in each task, the step picks its own GPU.
        env = [f"{k}={v}" for k, v in spec.env]
        argv = [self._tool("srun"), f"--job-name={spec.name}", f"--partition={spec.partition}",
                f"--reservation={spec.reservation}", f"--nodelist={','.join(spec.nodes)}",
                f"--nodes={len(spec.nodes)}", "--ntasks-per-node=1", "--exclusive",
                f"--gres=gpu:{spec.gpus_per_node}", f"--time={spec.minutes}", f"--mpi={spec.mpi}",
                "--chdir=/", "--quiet", "env", *env, *spec.argv]
        try:
            proc = self._run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise SourceUnavailable("Slurm: srun not found (install slurm-client)") from None
        except subprocess.TimeoutExpired:
            return 124, f"srun timed out after {timeout:g}s"
        return proc.returncode, str(proc.stdout) + ("" if proc.returncode == 0 else str(proc.stderr))

    # ---- accounting: ended jobs, from slurmdbd (SlurmAccounting) ---------------------------------------
    def finished_job(self, job_id: str) -> FinishedJob | None:
        jobs = parse_sacct(self._call([self._tool("sacct"), "--json", f"--jobs={job_id}"]))
        return next((job for job in jobs if job.id == job_id), None)

    def finished_jobs(self, since: float, until: float) -> list[FinishedJob]:
        # Every user's allocations that ran at some point between the two times (sacct(1), -S and -E).
        return parse_sacct(self._call([self._tool("sacct"), "--json", "--allusers", "--allocations",
                                       f"--starttime={sacct_time(since)}", f"--endtime={sacct_time(until)}"]))

    # ---- one job, and its requeue without some nodes (SlurmRequeue: opsctl/slurm/requeue.py) -----------
    def queued_job(self, job_id: str) -> QueuedJob | None:
        squeue = [self._tool("squeue"), "--noheader", "--states=all", f"--jobs={job_id}"]
        try:
            queue = self._call([*squeue, f"--format={QUEUE_FORMAT}"])
            flags = self._call([*squeue, f"--Format={FLAGS_FORMAT}"])
        except SourceUnavailable as err:
            if GONE in str(err):  # it ended more than MinJobAge ago
                return None
            raise
        return parse_queued_job(queue, flags, job_id)

    def requeue_excluding(self, job_id: str, excluded: str, pending: bool) -> None:
        self._call([self.scontrol, "hold" if pending else "requeuehold", job_id])
        try:
            self._call([self.scontrol, "update", f"JobId={job_id}", f"ExcNodeList={excluded}"])
        finally:
            self._call([self.scontrol, "release", job_id])
