"""`make test`: the linters and every test tier (README, "Tests") as three streams at once, one exit code.

Most of the tiers' wall time is waiting (scrapes, SSH, systemd), not CPU, so they run as three streams at
once, each named after its tiers:

  provision                     the playbooks against the lab machines, in a lab directory of their own
                                (PROVISION_LAB_DIR), so that no stream sees another's processes;
  lab                           the simulated cluster;
  lint+component+machines+unit  `make lint`, then the other tiers. The component tier's Prometheus,
                                exporters and Slurm chroots take addresses, ports and chroot indexes apart
                                from the lab's (tests/component/promlab.py, paths.py); the machines tier's
                                machines live in a directory and network of their own (test_machines.py) and
                                find the image that the provisioning stream has built by then.

Beside them, from the start, the Slurm chroots of the newer releases are built (debootstrap, mostly waiting
on the mirror), which the component and lab tiers use a few minutes in: a test then finds its chroot built
or waits on the build's lock; a build that fails here fails again, with its message, in the first test
that needs it, so its exit code counts for nothing here.

Each stream writes its own log, ending with its slowest tests (pytest --durations=15), into the log
directory: --logs, else $OPSCTL_TEST_LOGS, else a new one under /tmp; its path is printed first. The
third stream's output is shown as it comes, the other logs follow at the end, then a table of each
stream's wall time, CPU time and exit code. The exit code is 0 only when every stream passed. A stream
that runs past --stream-limit (an hour) is interrupted where it hung, and fails. A linter's
failure stops every stream, as do Ctrl-C and SIGTERM (a second one kills them).

With pytest arguments (`tests/run.py -- ARGS`, as `make test PYTEST_ARGS=...` does), it runs `make lint`
and then one plain pytest with them instead.

Run it with the virtualenv's Python (`.venv/bin/python tests/run.py`); it uses the standard library only.
"""

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

REPO = Path(__file__).resolve().parent.parent
PYTEST = str(Path(sys.executable).parent / "pytest")
LINT = ["make", "--no-print-directory", "lint"]
CHROOT_BUILD = [sys.executable, "-m", "opsctl_lab.slurm_chroot"]
PROVISION_LAB_DIR = "/var/lib/opsctl-lab-machines-tests"
# A stream's slowest tests, after its results: where its time goes. The streams share no pytest cache.
STREAM_PYTEST_OPTIONS = ["-p", "no:cacheprovider", "--durations=15"]
# After a linter's failure, how long the streams may take to tear down (the lab's `down`) before they
# are killed.
STOP_GRACE_SECONDS = 180.0
# A stream that runs this long has hung (each takes about half an hour on CI's 2 cores): it gets SIGINT, so
# that pytest writes where it was (its KeyboardInterrupt line names the test's file and line) and tears
# down, then SIGKILL after STOP_GRACE_SECONDS; the run fails. Without it a hung stream would run until
# CI's own limit, whose kill writes nothing about where it hung. --stream-limit sets it.
STREAM_LIMIT_SECONDS = 3600.0

# CPU weighting. The provisioning stream is the longest, so every other process of the run yields the CPU
# to it: they run in the cpu cgroup LOW_SHARE_GROUP, which weighs as much as one session, and at nice 5
# within it. nice alone does not do it: with the kernel's autogroups (sched_autogroup_enabled, the default)
# nice weighs only within one session, and the lab's daemons and machines each start a session of their
# own, each weighted as much as the provisioning stream; a cgroup's weight covers all of its processes, in
# whatever session. Measured on a 2-core host, whole run 1770 s: provision 1748 s wall / 1534 s CPU, lab
# 1641 s / 995 s, lint+component+machines+unit 1331 s / 472 s. At nice 10 instead of 5 the third stream
# ended 130 s later and the lab stream 120 s earlier, a component test's exporter missed its scrapes, and
# the provisioning stream was not shorter, so nice 5 stays. This weighting lives here, and only here (it
# was tests/low_cpu_share.sh), so that what it does and what it was measured against are read together.
LOW_SHARE_GROUP = "opsctl-tests-background"
LOW_SHARE_NICE = 5


@dataclass(frozen=True)
class StreamSpec:
    name: str  # its tiers, in the order it runs them
    selection: list[str]  # the pytest arguments that choose its tests
    env: dict[str, str] = field(default_factory=dict)
    lint_first: bool = False
    yields_cpu: bool = True  # runs in LOW_SHARE_GROUP at nice LOW_SHARE_NICE


# How long the lab machines' fabric trains after Fabric Manager starts (docs/lab-machines.md): shorter than a real
# board's minute, which every boot and GPU reset of those tiers would wait out, yet long enough that the provision
# tier's waits meet a fabric still training. The environment's own value wins.
FABRIC_TRAINING_VAR = "OPSCTL_LAB_FABRIC_TRAINING_S"


def fabric_training(seconds: int) -> dict[str, str]:
    return {FABRIC_TRAINING_VAR: os.environ.get(FABRIC_TRAINING_VAR) or str(seconds)}


STREAMS = [
    StreamSpec("provision", ["-m", "provision", "tests/integration"],
               {"OPSCTL_LAB_DIR": PROVISION_LAB_DIR, **fabric_training(20)}, yields_cpu=False),
    StreamSpec("lab", ["-m", "lab", "tests/integration"]),
    StreamSpec("lint+component+machines+unit", ["-m", "not (provision or lab)"], fabric_training(10),
               lint_first=True),
]
STREAM_NAMES = [s.name for s in STREAMS]


@dataclass(frozen=True)
class StreamResult:
    name: str
    wall_seconds: float
    cpu_seconds: float
    exit_code: int | None  # None: never started; negative: killed by that signal
    log: Path
    counted: bool = True  # whether its exit code counts for the run's


def run_exit_code(results: Sequence[StreamResult], stopped_by: int | None = None) -> int:
    """0 when every counted stream ran and passed; 128+N when the run was stopped by signal N; else 1."""
    if stopped_by is not None:
        return 128 + stopped_by
    return 0 if all(r.exit_code == 0 for r in results if r.counted) else 1


def describe_exit(code: int | None) -> str:
    if code is None:
        return "not run"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return str(code)


def summary_table(results: Sequence[StreamResult], total_seconds: float) -> str:
    """The run's closing table: each stream's wall and CPU seconds, exit code and log."""
    names = [r.name if r.counted else f"{r.name} (not counted)" for r in results]
    width = max(len("stream"), *(len(n) for n in names))
    lines = [f"==== tests/run.py: {total_seconds:.0f} s in all",
             f"{'stream':{width}}  {'wall s':>7}  {'CPU s':>7}  {'exit':>7}  log"]
    for name, r in zip(names, results, strict=True):
        lines.append(f"{name:{width}}  {r.wall_seconds:7.0f}  {r.cpu_seconds:7.0f}  "
                     f"{describe_exit(r.exit_code):>7}  {r.log}")
    lines.append("(CPU s: the stream's processes that it waited for; daemons it left running are not counted)")
    return "\n".join(lines)


def parse_selections(overrides: Sequence[str], streams: Sequence[str]) -> dict[str, list[str]]:
    """--tests NAME=ARGS: NAME's pytest selection replaced by ARGS (split as a shell does)."""
    selections = {s.name: s.selection for s in STREAMS if s.name in streams}
    for override in overrides:
        name, sep, args = override.partition("=")
        if not sep or name not in selections:
            raise ValueError(f"--tests {override!r}: expected NAME=ARGS with NAME one of {', '.join(selections)}")
        selections[name] = shlex.split(args)
    return selections


def parse_streams(value: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in STREAM_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{value!r}: streams are {', '.join(STREAM_NAMES)}")
    return names


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tests/run.py", description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=Path, default=os.environ.get("OPSCTL_TEST_LOGS") or None,
                        help="the directory of the streams' logs (default: $OPSCTL_TEST_LOGS, else a new one in /tmp)")
    parser.add_argument("--streams", type=parse_streams, default=STREAM_NAMES,
                        help=f"the streams to run, comma-separated (default: all of {', '.join(STREAM_NAMES)})")
    parser.add_argument("--tests", action="append", default=[], metavar="NAME=ARGS",
                        help="run ARGS (pytest arguments) as stream NAME's selection instead of its tiers")
    parser.add_argument("--stream-limit", type=float, default=STREAM_LIMIT_SECONDS, metavar="SECONDS",
                        help=f"stop a stream that runs longer (default {STREAM_LIMIT_SECONDS:.0f})")
    parser.add_argument("--no-chroot-build", action="store_true",
                        help="do not build the Slurm chroots beside the streams (for selections that use none)")
    parser.add_argument("pytest_args", nargs="*", metavar="-- PYTEST_ARGS",
                        help="`make lint`, then one plain pytest with these arguments, instead of the streams")
    return parser.parse_args(argv)


def join_low_cpu_share() -> str:
    """Moves this process into LOW_SHARE_GROUP and to nice LOW_SHARE_NICE, so that everything it starts from
    now on runs there too (see "CPU weighting" above). Says what it did; where no cpu cgroup can be made (no
    root, no cpu controller), nice only."""
    if Path("/sys/fs/cgroup/cpu/cpu.shares").is_file():  # cgroup v1's cpu controller
        group, weight_file, weight = Path("/sys/fs/cgroup/cpu") / LOW_SHARE_GROUP, "cpu.shares", "1024"
    else:
        group, weight_file, weight = Path("/sys/fs/cgroup") / LOW_SHARE_GROUP, "cpu.weight", "100"
    try:
        group.mkdir(exist_ok=True)
        (group / weight_file).write_text(weight)
        (group / "cgroup.procs").write_text(str(os.getpid()))
        where = f"cpu cgroup {group} ({weight_file} {weight})"
    except OSError as exc:
        where = f"no cpu cgroup ({exc})"
    os.nice(LOW_SHARE_NICE)  # the main thread's, which every child inherits (Linux nice is per thread)
    return f"every stream but provision runs in {where} at nice {LOW_SHARE_NICE}"


@dataclass
class Running:
    """One started process group (a stream, a step of one, or the chroot build) and its log."""
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    started: float
    counted: bool = True
    ended: float | None = None
    exit_code: int | None = None
    cpu_seconds: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)

    def reap(self) -> None:
        """Waits for the process, in a thread of its own, so that its end time is its own."""
        try:
            _, status, usage = os.wait4(self.proc.pid, 0)
            self.exit_code = os.waitstatus_to_exitcode(status)
            self.cpu_seconds = usage.ru_utime + usage.ru_stime
        except ChildProcessError:
            self.exit_code = None
        self.proc.returncode = self.exit_code  # Popen must not wait for it again
        self.ended = time.monotonic()
        self.done.set()

    def signal(self, signum: int) -> None:
        if not self.done.is_set():
            try:
                os.killpg(self.proc.pid, signum)
            except ProcessLookupError:
                pass

    def stop_after(self, limit: float) -> None:
        """In a thread of its own: past `limit` seconds, SIGINT, then SIGKILL after STOP_GRACE_SECONDS."""
        if self.done.wait(limit):
            return
        line = f"\n==== tests/run.py: {self.name} ran past its {limit:.0f} s: SIGINT, its log says where it was\n"
        with self.log.open("ab") as out:
            out.write(line.encode())
        os.write(1, line.encode())  # os.write: the main thread may be inside a write to sys.stdout
        self.signal(signal.SIGINT)
        if not self.done.wait(STOP_GRACE_SECONDS):
            self.signal(signal.SIGKILL)

    def result(self) -> StreamResult:
        wall = (self.ended or time.monotonic()) - self.started
        return StreamResult(self.name, wall, self.cpu_seconds, self.exit_code, self.log, self.counted)


class Run:
    """The processes of one run, each started in a process group of its own: a stop reaches all of a
    stream's processes, and Ctrl-C on the terminal reaches only this runner, which passes it on."""

    def __init__(self, logs: Path, limit: float = STREAM_LIMIT_SECONDS) -> None:
        self.logs = logs
        self.limit = limit
        self.started = time.monotonic()
        self.running: list[Running] = []
        self.stopped_by: int | None = None

    def start(self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None,
              counted: bool = True, live: bool = False, append: bool = False) -> Running:
        """Starts argv with its output into log (live: through a pipe, for run_live to show and copy)."""
        with log.open("ab" if append else "wb") as out:
            proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE if live else out, stderr=subprocess.STDOUT,
                                    process_group=0)
        running = Running(name, proc, log, time.monotonic(), counted)
        self.running.append(running)
        threading.Thread(target=running.reap, daemon=True).start()
        threading.Thread(target=running.stop_after, args=(self.limit,), daemon=True).start()
        return running

    def run_live(self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None,
                 append: bool = False) -> Running:
        """Runs argv to its end, its output shown as it comes and written to log."""
        running = self.start(name, argv, log, env, live=True, append=append)
        assert running.proc.stdout is not None
        with log.open("ab") as out:
            _copy_live(running.proc.stdout, out)
        running.done.wait()
        self.running.remove(running)
        return running

    def stop(self, signum: int = signal.SIGINT) -> None:
        """SIGINT to every process group: pytest then tears down (the lab's `down`) and ends."""
        for running in self.running:
            running.signal(signum)

    def wait_all(self, grace: float | None = None) -> None:
        """Waits for every process; those still running after grace seconds are killed."""
        deadline = None if grace is None else time.monotonic() + grace
        for running in self.running:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not running.done.wait(left):
                running.signal(signal.SIGKILL)
                running.done.wait()

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        # os.write, not print: the main thread may be inside a write to sys.stdout.
        if self.stopped_by is None:
            self.stopped_by = signum
            os.write(1, f"\n==== tests/run.py: {signal.Signals(signum).name}: stopping every stream "
                        "(once more: kill them)\n".encode())
            self.stop()
        else:
            self.stop(signal.SIGKILL)


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _copy_live(source: IO[bytes], log: IO[bytes]) -> None:
    """Copies a child's output to this terminal and its log as it comes (pytest's progress is not in lines)."""
    while chunk := os.read(source.fileno(), 65536):
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
        log.write(chunk)
        log.flush()
    source.close()


def log_dir(given: Path | None) -> Path:
    if given is None:
        return Path(tempfile.mkdtemp(prefix="opsctl-tests-", dir="/tmp"))
    given.mkdir(parents=True, exist_ok=True)
    return given


def run_streams(args: argparse.Namespace, selections: dict[str, list[str]]) -> int:
    specs = [s for s in STREAMS if s.name in args.streams]
    live = next((s for s in specs if s.lint_first), None)
    run = Run(log_dir(args.logs), args.stream_limit)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, run.on_signal)
    say(f"==== tests/run.py: streams {', '.join(s.name for s in specs)}; their logs in {run.logs}")

    def pytest_argv(spec: StreamSpec) -> list[str]:
        return [PYTEST, *STREAM_PYTEST_OPTIONS, *selections[spec.name]]

    def log_of(spec: StreamSpec) -> Path:
        return run.logs / f"{spec.name}.log"

    # The provisioning stream starts before this runner joins the low-share group; the rest after, in it.
    for spec in specs:
        if not spec.yields_cpu:
            run.start(spec.name, pytest_argv(spec), log_of(spec), spec.env)
    say(f"==== tests/run.py: {join_low_cpu_share()}")
    if not args.no_chroot_build:
        run.start("slurm chroot build", CHROOT_BUILD, run.logs / "slurm-chroots.log", counted=False)
    for spec in specs:
        if spec.yields_cpu and spec is not live:
            run.start(spec.name, pytest_argv(spec), log_of(spec), spec.env)

    live_result = None
    lint_failed = False
    if live is not None and run.stopped_by is None:
        started = time.monotonic()
        lint = run.run_live(live.name, LINT, log_of(live))
        steps = [lint]
        if lint.exit_code == 0 and run.stopped_by is None:
            lint_seconds = f"{time.monotonic() - run.started:.1f}"  # conftest prints it with the tiers' times
            steps.append(run.run_live(live.name, pytest_argv(live), log_of(live),
                                      {**live.env, "OPSCTL_LINT_SECONDS": lint_seconds}, append=True))
        elif run.stopped_by is None:
            lint_failed = True
            say(f"==== tests/run.py: `make lint` failed ({describe_exit(lint.exit_code)}): stopping every stream")
            run.stop()
        live_result = StreamResult(live.name, time.monotonic() - started, sum(s.cpu_seconds for s in steps),
                                   steps[-1].exit_code, log_of(live))
    elif live is not None:  # stopped before it started
        live_result = StreamResult(live.name, 0.0, 0.0, None, log_of(live))
    run.wait_all(STOP_GRACE_SECONDS if lint_failed else None)

    if not lint_failed:
        # The other streams' logs, in the order they ended (the longest last, just above the table).
        for running in sorted(run.running, key=lambda r: r.ended or 0.0):
            if running.counted:
                say(f"==== the {running.name} stream ====")
                sys.stdout.buffer.write(running.log.read_bytes())
                sys.stdout.buffer.flush()
    results = [r.result() for r in run.running if r.counted]
    if live_result is not None:
        results.append(live_result)
    results += [r.result() for r in run.running if not r.counted]
    say(summary_table(results, time.monotonic() - run.started))
    return run_exit_code(results, run.stopped_by)


def run_plain(pytest_args: list[str]) -> int:
    """`make lint`, then one plain pytest with pytest_args: what `make test PYTEST_ARGS=...` does."""
    started = time.monotonic()
    if subprocess.run(LINT, cwd=REPO).returncode != 0:
        return 1
    os.chdir(REPO)
    os.execve(PYTEST, [PYTEST, *pytest_args],
              {**os.environ, "OPSCTL_LINT_SECONDS": f"{time.monotonic() - started:.1f}"})


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    if args.pytest_args:
        try:
            return run_plain(args.pytest_args)
        except KeyboardInterrupt:
            return 128 + signal.SIGINT
    try:
        selections = parse_selections(args.tests, args.streams)
    except ValueError as exc:
        sys.stderr.write(f"tests/run.py: {exc}\n")
        return 2
    return run_streams(args, selections)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
