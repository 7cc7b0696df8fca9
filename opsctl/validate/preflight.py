"""`opsctl validate --preflight N`: validate nodes for a large run before it starts (docs/validate.md).

1. Choose idle GPU nodes with no flag and no reason (within --nodes when given), N and some spares, by
   name, and reserve them: a MAINT reservation for root, so that no user's job starts on them meanwhile.
   A node that took a job between the read and the reservation is left out and the reservation asked
   again. From its creation on (a Ctrl-C during the create call included) an error or Ctrl-C deletes it.
2. The single-node checks of `opsctl validate --idle` run inside the reservation as one job per node
   (`opsctl node validate`: dcgmi diag, all_reduce_perf over the node's GPUs), their results read from
   Prometheus as the sweep reads them.
3. The nodes that passed are paired by the fabric test's pairing (opsctl.fabrictest.pairing), and each
   pair runs nccl-tests across the two nodes one rail at a time: one GPU per node (GPU i for rail i, as
   the rails are cabled), NCCL_IB_HCA pinned to that rail's HCA, so a slow result is one rail of one
   pair. The pairing retests suspects against proven partners and names the node and rail that fail
   with two partners; what it cannot decide stays not checked, never a pass. Each decided node's verdict
   goes to its textfile with the time it was written, and is read only once Prometheus shows that time: an
   earlier preflight's pass reads the same as a new one.
4. The first N good nodes are handed over: the reservation keeps them alone, for the caller, no longer
   MAINT, for `validate.preflight_hold` (one `scontrol update`, so no node is free in between). The
   other nodes leave it; with no good node the reservation is deleted. Then `opsctl health --drain`
   runs over the nodes validated, as after a sweep: a single-node failure is drained by its rule.
"""

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from opsctl.config.schema import Config, duration_seconds
from opsctl.errors import SourceUnavailable
from opsctl.fabrictest.pairing import DEAD, GOOD, SLOW, Isolator, Measurement, Test, Thresholds
from opsctl.gpu.nccl_tests import all_reduce_verdict, parse_all_reduce
from opsctl.prom.client import PromQuery
from opsctl.slurm import Slurm
from opsctl.slurm.base import NodesBusy, SlurmReservations, StepSpec
from opsctl.slurm.hostlist import hostlist_expression
from opsctl.slurm.partitions import select_partitions
from opsctl.validate.node import NCCL_PAIR, NCCL_TIMEOUT_S
from opsctl.validate.sweep import (
    CLOCK_SKEW_S,
    Clock,
    Sweep,
    await_jobs,
    await_results,
    choose,
    record_validated,
    require_node_job,
    submit,
)

STEP_NAME = "opsctl-preflight"
RESERVE_TRIES = 3
MAX_ROUNDS = 4
PAIRS_AT_ONCE = 16
MAINT_CLEAR_S = 30.0
STEP_MINUTES = max(1, math.ceil(NCCL_TIMEOUT_S / 60))  # a step's Slurm time limit


@dataclass
class RailFinding:
    node: str
    hca: str
    verdict: str  # slow, dead or unknown
    evidence: list[tuple[str, float]] = field(default_factory=list)  # (partner, GB/s) of each test

    @property
    def words(self) -> str:
        seen = ", ".join(f"{gbps:.1f}GB/s with {peer}" for peer, gbps in self.evidence)
        return f"{self.hca} {self.verdict}" + (f": {seen}" if seen else "")


@dataclass
class Preflight:
    reservation: str
    wanted: int
    sweep: Sweep = field(default_factory=Sweep)
    handed_over: list[str] = field(default_factory=list)
    rails: list[RailFinding] = field(default_factory=list)
    paired: set[str] = field(default_factory=set)  # the nodes that took part in the multi-node stage
    rounds: int = 0
    reserved: bool = False  # the reservation may exist: it is deleted on an error or Ctrl-C

    @property
    def handed_over_hostlist(self) -> str:
        """The nodes handed over, as one hostlist expression (`gpu[001-002,004]`)."""
        return ",".join(hostlist_expression(self.handed_over))


def default_spares(wanted: int) -> int:
    """A quarter more than asked, at least 2: enough to hand over N when a node or two fail."""
    return max(2, math.ceil(wanted / 4))


def _reserve(config: Config, slurm: Slurm, jobs: SlurmReservations, preflight: Preflight, want: int,
             scope: set[str] | None, minutes: int) -> Sweep:
    """Choose and reserve; a node that became busy meanwhile is left out and the rest asked again.
    `preflight.reserved` holds from the call to Slurm on: a call that Ctrl-C cut short may have made the
    reservation. An answer that is an error clears it: Slurm refused, and a name in use is someone else's."""
    for attempt in range(RESERVE_TRIES):
        cluster = select_partitions(slurm.nodes(), config.slurm.partitions)
        # last validated: none, so that "validated recently" never holds a node back from a preflight
        sweep = choose(cluster, {}, scope, time.time(), config, limit=want)
        chosen = [n for n, v in sweep.nodes.items() if not v.result]
        if not chosen:
            return sweep
        preflight.reserved = True
        try:
            jobs.reserve(preflight.reservation, chosen, minutes)
            return sweep
        except NodesBusy:
            preflight.reserved = False
            if attempt == RESERVE_TRIES - 1:
                raise
        except Exception:
            preflight.reserved = False
            raise
    raise AssertionError("unreachable")


class RailSteps:
    """Measures a round of the pairing: per pair, one srun step per rail, pairs side by side."""

    def __init__(self, config: Config, jobs: SlurmReservations, reservation: str,
                 warn: Callable[[str], None] | None = None) -> None:
        self._config = config
        self._jobs = jobs
        self._reservation = reservation
        self._warn = warn

    def measure(self, tests: list[Test]) -> list[Measurement]:
        with ThreadPoolExecutor(max_workers=max(1, min(len(tests), PAIRS_AT_ONCE))) as pool:
            return [m for found in pool.map(self._pair, tests) for m in found]

    def _pair(self, test: Test) -> list[Measurement]:
        return [Measurement(test.a, test.b, rail, self._rail(test, rail, hca))
                for rail, hca in enumerate(self._config.ib.rails)]

    def _rail(self, test: Test, rail: int, hca: str) -> float:
        v = self._config.validate
        size = v.nccl_bytes
        spec = StepSpec(STEP_NAME, (test.a, test.b), v.partition, self._reservation,
                        (v.all_reduce_perf, "-b", size, "-e", size, "-f", "2", "-g", "1", "-c", "1"),
                        (("CUDA_VISIBLE_DEVICES", str(rail)), ("NCCL_IB_HCA", f"={hca}")),
                        STEP_MINUTES, v.srun_mpi, self._config.hardware.gpus_per_node)
        code, out = self._jobs.run_step(spec, NCCL_TIMEOUT_S + 30)
        try:
            result = parse_all_reduce(out)
        except SourceUnavailable as err:
            detail = str(err)
        else:
            # two ranks: a slow rail is a measurement for the pairing to weigh, not this step's verdict
            verdict, detail = all_reduce_verdict(result, 0.0, 2)
            if code == 0 and verdict == "pass" and result.last is not None:
                return result.last.busbw
        if self._warn is not None:
            said = next((line.strip() for line in out.splitlines() if "error" in line.lower()
                         or "failure" in line.lower() or "warn" in line.lower()), detail)
            self._warn(f"{hca} {test.a} {test.b}: not measured, counted as 0 GB/s: exit {code}: {said}")
        return 0.0


def _pairs(config: Config, jobs: SlurmReservations, preflight: Preflight, warn: Callable[[str], None] | None) -> None:
    """The multi-node stage over the nodes that passed alone; a rail it names fails its node."""
    passed = [n for n, v in preflight.sweep.nodes.items() if v.result == "pass"]
    if len(passed) < 2:
        for name in passed:
            entry = preflight.sweep.nodes[name]
            entry.result, entry.detail = "not-checked", "no partner for the multi-node test"
        return
    rails = config.ib.rails
    isolator = Isolator(passed, len(rails), Thresholds(config.validate.nccl_rail_busbw_floor_gbps, 1.0), MAX_ROUNDS)
    steps = RailSteps(config, jobs, preflight.reservation, warn)
    preflight.paired = set(passed)
    while tests := isolator.next_round():
        isolator.record(steps.measure(tests))
    preflight.rounds = isolator.rounds
    for name, verdicts in isolator.verdicts().items():
        findings = [RailFinding(name, rails[rail], found.verdict,
                                [(m.b if m.a == name else m.a, m.gbps) for m in found.evidence])
                    for rail, found in verdicts.items() if found.verdict != GOOD]
        if not findings:
            continue
        preflight.rails += findings
        entry = preflight.sweep.nodes[name]
        bad = [f for f in findings if f.verdict in (SLOW, DEAD)]
        entry.result = "fail" if bad else "not-checked"
        entry.detail = "nccl-pair " + "; ".join(f.words for f in bad) if bad else \
            f"nccl-pair not checked on {','.join(f.hca for f in findings)} (no partner proven on the rail)"


def _record(config: Config, jobs: SlurmReservations, prom: PromQuery, preflight: Preflight, since: float,
            clock: Clock) -> None:
    """Each node the pairing decided gets its rails' verdict in its textfile (a step on that node alone), and
    Prometheus must show it, a failure judged by the catalog rule, before the hand-over and the health run:
    a rail named here is drained like any failed validation. The verdict counts only with the time these
    steps wrote beside it: an earlier preflight's pass still in Prometheus is not yet, and one never
    replaced leaves the node not checked, not handed over."""
    failed: dict[str, list[str]] = {}
    for f in preflight.rails:
        if f.verdict in (SLOW, DEAD):
            failed.setdefault(f.node, []).append(f.hca)
    # a rail the pairing could not decide leaves its node not checked: no result to record
    decided = sorted(n for n in preflight.paired if preflight.sweep.nodes[n].result in ("pass", "fail"))
    v = config.validate

    def record(node: str) -> tuple[str, int, str]:
        arg = ",".join(failed.get(node, [])) or "pass"
        spec = StepSpec(STEP_NAME, (node,), v.partition, preflight.reservation,
                        ("sh", "-c", f"{v.job_command} --record-pairs {arg}"), (), STEP_MINUTES, "none",
                        config.hardware.gpus_per_node)
        code, out = jobs.run_step(spec, NCCL_TIMEOUT_S)
        return node, code, out

    # The rails' file carries its own time: a result older than these steps is an earlier preflight's.
    written_since = time.time() - CLOCK_SKEW_S
    with ThreadPoolExecutor(max_workers=max(1, min(len(decided), PAIRS_AT_ONCE))) as pool:
        done = list(pool.map(record, decided))
    details = {}
    for node, code, out in done:
        entry = preflight.sweep.nodes[node]
        details[node] = entry.detail
        if code != 0:
            entry.result = "not-checked"
            last = out.strip().splitlines()[-1] if out.strip() else ""
            entry.detail = f"nccl-pair result not recorded: exit {code}: {last}".strip()
        else:
            entry.result = "ended"
    await_results(config, prom, preflight.sweep, since, clock, needed=(NCCL_PAIR,), needed_since=written_since)
    for node, detail in details.items():
        if preflight.sweep.nodes[node].result == "fail" and detail:
            preflight.sweep.nodes[node].detail = detail  # the rail with its numbers, not only its name


def _abandon(jobs: SlurmReservations, preflight: Preflight) -> None:
    """A preflight that stops on an error or Ctrl-C cancels its jobs and deletes its reservation: never
    nodes reserved for no one, nor jobs left pending in a reservation that is gone. A reservation whose
    creation was cut short is deleted by name; Slurm's "no such reservation" is then no error."""
    preflight.handed_over = []
    undos: list[Callable[[], None]] = [
        lambda: jobs.cancel(sorted(v.job for v in preflight.sweep.nodes.values() if v.job))]
    if preflight.reserved:
        undos.append(lambda: jobs.release(preflight.reservation))
    for undo in undos:
        try:
            undo()
        except SourceUnavailable:
            pass  # the error that stopped the preflight is the one to report


def _await_out_of_maintenance(slurm: Slurm, nodes: list[str], clock: Clock) -> None:
    """slurmctld drops a node's MAINTENANCE flag at its next reservation pass, seconds after the node left
    the reservation; until then the health run would leave a failed node alone (Slurm's, not opsctl's)."""
    deadline = clock.now() + MAINT_CLEAR_S
    while nodes and clock.now() < deadline:
        current = slurm.nodes()
        if not any("MAINTENANCE" in current[n].flags or "MAINT" in current[n].flags for n in nodes if n in current):
            return
        clock.sleep(1.0)


def run_preflight(config: Config, slurm: Slurm, jobs: SlurmReservations, prom: PromQuery, wanted: int,
                  scope: list[str] | None, reservation: str, users: list[str], spares: int,
                  dry_run: bool = False, clock: Clock | None = None,
                  warn: Callable[[str], None] | None = None) -> Preflight:
    clock = clock or Clock()
    require_node_job(config)
    preflight = Preflight(reservation, wanted)
    job_minutes = math.ceil(duration_seconds(config.validate.job_timeout) / 60)
    hold_minutes = math.ceil(duration_seconds(config.validate.preflight_hold) / 60)
    scope_set = set(scope) if scope is not None else None
    if dry_run:
        cluster = select_partitions(slurm.nodes(), config.slurm.partitions)
        preflight.sweep = choose(cluster, {}, scope_set, time.time(), config, limit=wanted + spares)
        for entry in preflight.sweep.nodes.values():
            entry.result = entry.result or "would-validate"
        return preflight
    began = clock.now()
    # The jobs' time, the pairing's rounds of eight rails, and the hold: a bound the hand-over shortens.
    reserve_minutes = 2 * job_minutes + MAX_ROUNDS * len(config.ib.rails) * 6 + hold_minutes
    # From the reservation's creation on, its own call included, an error or Ctrl-C deletes it.
    try:
        preflight.sweep = _reserve(config, slurm, jobs, preflight, wanted + spares, scope_set, reserve_minutes)
        if not preflight.reserved:
            return preflight
        since = time.time() - CLOCK_SKEW_S
        submit(config, jobs, preflight.sweep, reservation)
        await_jobs(config, jobs, preflight.sweep, clock)
        if any(v.result == "ended" for v in preflight.sweep.nodes.values()):
            await_results(config, prom, preflight.sweep, since, clock)
        _pairs(config, jobs, preflight, warn)
        _record(config, jobs, prom, preflight, since, clock)
        good = sorted(n for n, v in preflight.sweep.nodes.items() if v.result == "pass")
        preflight.handed_over = good[:wanted]
        if preflight.handed_over:
            elapsed = math.ceil((clock.now() - began) / 60)
            jobs.hand_over(reservation, preflight.handed_over, users, elapsed + hold_minutes)
        else:
            jobs.release(reservation)
    except BaseException:
        _abandon(jobs, preflight)
        raise
    left = [n for n, v in preflight.sweep.nodes.items() if v.job and n not in preflight.handed_over]
    _await_out_of_maintenance(slurm, left, clock)
    record_validated(config, preflight.sweep)
    return preflight
