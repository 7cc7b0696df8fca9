"""`opsctl validate --preflight N` (opsctl/validate/preflight.py): the reservation, the multi-node stage over
the fabric test's pairing with nccl-tests' real output format, the hand-over, and the srun/scontrol calls
(opsctl/slurm/cli.py). The lab tier runs it whole on real Slurm and Prometheus
(tests/integration/lab/test_lab_validate.py)."""

import argparse
import json
import subprocess
import time
from pathlib import Path

import pytest

from opsctl.config import parse_config
from opsctl.errors import SourceUnavailable
from opsctl.prom.client import Sample
from opsctl.slurm.base import NodesBusy, StepSpec
from opsctl.slurm.cli import SlurmCliImpl
from opsctl.validate import preflight as pf
from opsctl.validate.node import RESULT_HEADER, pairs_metrics_text, pairs_textfile
from opsctl.validate.sweep import NodeValidation, Sweep
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.hwtools import all_reduce_perf as emulated
from tests.unit.fakes import FakeProm, gpu_nodes, node
from tests.unit.test_validate import JumpingClock


def config(tmp_path=None):
    env = {"OPSCTL_STATE_DIR": str(tmp_path / "state")} if tmp_path else {}
    return parse_config({"validate": {"nccl_bytes": "1G"}}, "t", env)


class FakeSlurm:
    def __init__(self, *reads):
        self.reads = list(reads)

    def nodes(self):
        return self.reads.pop(0) if len(self.reads) > 1 else self.reads[0]


class FakeReservations:
    """scontrol's reservations and srun's steps; each step answers with the lab emulator's rendering of the
    two nodes' hardware (nccl-tests' format), or `fail` for every step."""

    def __init__(self, hardware=None, busy=0, fail=None):
        self.hardware = hardware or {}
        self.busy = busy
        self.fail = fail
        self.calls = []
        self.steps: list[StepSpec] = []

    def reserve(self, name, nodes, minutes):
        self.calls.append(("reserve", name, list(nodes)))
        if self.busy:
            self.busy -= 1
            raise NodesBusy("Slurm: scontrol create failed: Error creating the reservation: Requested nodes are busy")

    def hand_over(self, name, nodes, users, minutes):
        self.calls.append(("hand_over", name, list(nodes), list(users)))

    def release(self, name):
        self.calls.append(("release", name))

    def cancel(self, ids):
        self.calls.append(("cancel", list(ids)))

    def run_step(self, spec, timeout):
        self.steps.append(spec)
        if self.fail:
            return self.fail
        env = dict(spec.env)
        rail = int(env["CUDA_VISIBLE_DEVICES"])
        hw = [self.hardware.get(n) or NodeHardware(node=n) for n in spec.nodes]
        args = argparse.Namespace(stepfactor=2, warmup_iters=5, iters=20, check=1, ngpus=1)
        return 0, emulated.report([emulated.Rank(h, rail) for h in hw], [env["NCCL_IB_HCA"].lstrip("=")],
                                  [1 << 30], args)


def passed(*names) -> pf.Preflight:
    found = pf.Preflight("pf", 8, Sweep())
    for name in names:
        found.sweep.nodes[name] = NodeValidation(name, job="1", result="pass")
    return found


def test_a_slow_rail_is_named_by_node_and_rail_with_its_partners_numbers_and_the_others_pass():
    names = [f"gpu{i:03d}" for i in range(1, 17)]
    slow = NodeHardware(node="gpu005")
    slow.inject("ib-slow", hca="mlx5_3")
    jobs = FakeReservations({"gpu005": slow})
    found = passed(*names)
    pf._pairs(config(), jobs, found, warn=None)
    results = {n: v.result for n, v in found.sweep.nodes.items()}
    assert [n for n, r in results.items() if r != "pass"] == ["gpu005"]
    assert [(f.node, f.hca, f.verdict) for f in found.rails] == [("gpu005", "mlx5_3", "slow")]
    evidence = found.rails[0].evidence
    assert len({peer for peer, _ in evidence}) >= 2 and all(20 < gbps < 25 for _, gbps in evidence)
    assert found.sweep.nodes["gpu005"].detail.startswith("nccl-pair mlx5_3 slow: ")
    # one GPU per node on that rail, its HCA alone, two ranks in the reservation
    step = next(s for s in jobs.steps if dict(s.env)["NCCL_IB_HCA"] == "=mlx5_3")
    assert dict(step.env)["CUDA_VISIBLE_DEVICES"] == "3" and len(step.nodes) == 2
    assert step.argv[1:] == ("-b", "1G", "-e", "1G", "-f", "2", "-g", "1", "-c", "1") and step.reservation == "pf"
    assert found.rounds >= 2  # a round to suspect, a round to name


def test_a_rail_no_step_could_measure_is_not_checked_and_each_failure_is_told_in_one_line():
    jobs = FakeReservations(fail=(1, "srun: error: Unable to allocate resources: Invalid reservation\n"))
    told = []
    found = passed("gpu001", "gpu002", "gpu003", "gpu004")
    pf._pairs(config(), jobs, found, warn=told.append)
    assert {v.result for v in found.sweep.nodes.values()} == {"not-checked"}
    assert "fail" not in {v.result for v in found.sweep.nodes.values()}  # a broken step names no node bad
    assert told and all(line.count("\n") == 0 and "srun: error: Unable to allocate" in line for line in told)


def test_a_lone_node_that_passed_has_no_partner_and_is_not_checked():
    found = passed("gpu001")
    pf._pairs(config(), FakeReservations(), found, warn=None)
    assert (found.sweep.nodes["gpu001"].result, found.sweep.nodes["gpu001"].detail) == (
        "not-checked", "no partner for the multi-node test")


def test_a_node_that_took_a_job_is_left_out_and_the_reservation_asked_again():
    first = gpu_nodes(6)
    second = gpu_nodes(6, gpu002=node("gpu002", "allocated"))
    jobs = FakeReservations(busy=1)
    found = pf.Preflight("pf", 4)
    sweep = pf._reserve(config(), FakeSlurm(first, second), jobs, found, 4, None, 60)
    assert [c[2] for c in jobs.calls] == [["gpu001", "gpu002", "gpu003", "gpu004"],
                                          ["gpu001", "gpu003", "gpu004", "gpu005"]]
    assert sweep.nodes["gpu002"].result == "skip:busy" and sweep.nodes["gpu006"].result == "skip:sweep-full"
    assert found.reserved


def _stages(monkeypatch, results: dict[str, str], fail_at=None):
    """run_preflight with the job and Prometheus stages replaced by what they would leave."""
    def submit(config, jobs, sweep, reservation=""):
        for number, entry in enumerate(sweep.nodes.values()):
            if not entry.result:
                entry.result, entry.job = "ended", str(100 + number)

    def await_jobs(*_):
        if fail_at == "jobs":
            raise SourceUnavailable("Slurm: squeue failed: slurm_load_jobs error: Unable to contact slurm controller")

    def await_results(config, prom, sweep, since, clock, needed=()):
        for name, entry in sweep.nodes.items():
            if entry.result == "ended":
                entry.result = results.get(name, "pass")
    monkeypatch.setattr(pf, "submit", submit)
    monkeypatch.setattr(pf, "await_jobs", await_jobs)
    monkeypatch.setattr(pf, "await_results", await_results)
    monkeypatch.setattr(pf, "_record", lambda *_: None)


def test_the_first_n_good_nodes_are_handed_over_in_one_update_and_the_failures_left_out(monkeypatch, tmp_path):
    _stages(monkeypatch, {"gpu002": "fail"})
    jobs = FakeReservations()
    found = pf.run_preflight(config(tmp_path), FakeSlurm(gpu_nodes(8)), jobs, None, 4, None, "big-run",
                             ["alice"], spares=2)
    assert jobs.calls[0] == ("reserve", "big-run", ["gpu001", "gpu002", "gpu003", "gpu004", "gpu005", "gpu006"])
    assert jobs.calls[-1] == ("hand_over", "big-run", ["gpu001", "gpu003", "gpu004", "gpu005"], ["alice"])
    assert found.handed_over == ["gpu001", "gpu003", "gpu004", "gpu005"]


def test_with_no_good_node_the_reservation_is_deleted(monkeypatch, tmp_path):
    _stages(monkeypatch, {f"gpu{i:03d}": "fail" for i in range(1, 9)})
    jobs = FakeReservations()
    found = pf.run_preflight(config(tmp_path), FakeSlurm(gpu_nodes(3)), jobs, None, 2, None, "big-run", ["a"], 1)
    assert jobs.calls[-1] == ("release", "big-run") and found.handed_over == []


def test_an_error_midway_deletes_the_reservation_and_is_raised(monkeypatch, tmp_path):
    _stages(monkeypatch, {}, fail_at="jobs")
    jobs = FakeReservations()
    with pytest.raises(SourceUnavailable, match="Unable to contact"):
        pf.run_preflight(config(tmp_path), FakeSlurm(gpu_nodes(4)), jobs, None, 2, None, "big-run", ["a"], 1)
    assert jobs.calls[-2:] == [("cancel", ["100", "101", "102"]), ("release", "big-run")]


def test_a_hand_over_slurm_refuses_frees_every_node(monkeypatch, tmp_path):
    _stages(monkeypatch, {})
    jobs = FakeReservations()

    def refuse(*_):
        raise SourceUnavailable("Slurm: scontrol update failed: slurm_update error: Invalid user id")
    jobs.hand_over = refuse
    with pytest.raises(SourceUnavailable, match="Invalid user id"):
        pf.run_preflight(config(tmp_path), FakeSlurm(gpu_nodes(4)), jobs, None, 2, None, "big-run", ["ghost"], 1)
    assert jobs.calls[-1] == ("release", "big-run")


def test_reservations_and_steps_go_through_scontrol_and_srun_next_to_it():
    calls = []

    def run(argv, **_):
        calls.append(argv)
        if argv[1:3] == ["create", "reservation"] and "Nodes=gpu002" in argv:
            busy = "Error creating the reservation: Requested nodes are busy\n"
            return subprocess.CompletedProcess(argv, 1, "", busy)
        return subprocess.CompletedProcess(argv, 0, "rank 0 says\n", "")
    slurm = SlurmCliImpl(scontrol="/opt/slurm/bin/scontrol", run=run, environ={"SLURM_CONF": "/dev/null"})
    slurm.reserve("pf", ["gpu001", "gpu003"], 90)
    with pytest.raises(NodesBusy):
        slurm.reserve("pf", ["gpu002"], 90)
    slurm.hand_over("pf", ["gpu001"], ["alice", "bob"], 75)
    slurm.release("pf")
    step = StepSpec("opsctl-preflight", ("gpu001", "gpu003"), "validate", "pf", ("all_reduce_perf", "-g", "1"),
                    (("CUDA_VISIBLE_DEVICES", "3"), ("NCCL_IB_HCA", "=mlx5_3")), 5, "pmix", 8)
    assert slurm.run_step(step, 60) == (0, "rank 0 says\n")
    assert calls[0] == ["/opt/slurm/bin/scontrol", "create", "reservation", "ReservationName=pf", "StartTime=now",
                        "Duration=90", "Nodes=gpu001,gpu003", "Users=root", "Flags=MAINT"]
    assert calls[2] == ["/opt/slurm/bin/scontrol", "update", "ReservationName=pf", "Nodes=gpu001",
                        "Users=alice,bob", "Duration=75", "Flags-=MAINT"]
    assert calls[3] == ["/opt/slurm/bin/scontrol", "delete", "ReservationName=pf"]
    assert calls[4] == ["/opt/slurm/bin/srun", "--job-name=opsctl-preflight", "--partition=validate",
                        "--reservation=pf", "--nodelist=gpu001,gpu003", "--nodes=2", "--ntasks-per-node=1",
                        "--exclusive", "--gres=gpu:8", "--time=5", "--mpi=pmix", "--chdir=/", "--quiet", "env",
                        "CUDA_VISIBLE_DEVICES=3", "NCCL_IB_HCA==mlx5_3", "all_reduce_perf", "-g", "1"]


def test_a_rails_verdict_is_written_beside_the_nodes_own_results():
    assert pairs_textfile(Path("/tf/opsctl-validate.prom")) == Path("/tf/opsctl-validate-pairs.prom")
    failed = pairs_metrics_text(["mlx5_3"], 1_800_000_000.0)
    assert failed.endswith('opsctl_node_validate{test="nccl-pair",device="mlx5_3"} 1800000000.000\n')
    assert pairs_metrics_text([], 1.0).endswith('opsctl_node_validate{test="nccl-pair",device="node"} 0\n')
    # the file's own time, which the preflight waits for: a pass reads the same from every preflight
    assert "\nopsctl_node_validate_pairs_timestamp_seconds 1800000000.000\n" in failed
    # the same HELP and TYPE as the node's own file: node_exporter merges one family from both files
    family = [line for line in failed.splitlines() if line.startswith("#") and " opsctl_node_validate " in line]
    assert family == RESULT_HEADER


def _command(monkeypatch, tmp_path, handed_over: list[str], health_code, wanted=4):
    """`opsctl validate --preflight` with the preflight and the health run replaced by their outcomes."""
    from click.testing import CliRunner

    from opsctl.actor.result import ActionResult
    from opsctl.cli import main
    from opsctl.clients import Clients
    from opsctl.commands import validate as command
    from opsctl.errors import ExitCode
    from opsctl.validate import run as feature

    def preflight(config, slurm, jobs, prom, n, scope, reservation, users, spares, dry_run, warn=None):
        found = pf.Preflight(reservation, n, Sweep(), handed_over=handed_over)
        for name in ["gpu001", "gpu002", "gpu003", "gpu004", "gpu005", "gpu006"]:
            found.sweep.nodes[name] = NodeValidation(name, "1", "pass" if name in handed_over else "fail")
        found.calls = (n, reservation, users, spares)
        preflight.found = found
        return found

    class Health:
        exit_code = ExitCode(health_code)
        action = ActionResult(done=["drain gpu005: opsctl:nccl-busbw"] if health_code else [])
    monkeypatch.setattr(feature, "run_preflight", preflight)
    monkeypatch.setattr(feature, "run_health", lambda *_: Health())
    monkeypatch.setattr(command, "render_json", lambda _: "{}")
    monkeypatch.setattr(command, "render_table", lambda *_: "")
    monkeypatch.setenv("SUDO_USER", "alice")
    result = CliRunner().invoke(main, ["validate", "--preflight", str(wanted), "--json"],
                                obj=Clients(config(tmp_path), object(), object(), object()))
    return result, preflight.found


def test_n_good_nodes_handed_over_exit_0_though_others_failed_and_were_drained(monkeypatch, tmp_path):
    result, found = _command(monkeypatch, tmp_path, ["gpu001", "gpu002", "gpu003", "gpu004"], health_code=1)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["preflight"]["handed_over"] == ["gpu001", "gpu002", "gpu003", "gpu004"]
    # what the health run over the validated nodes did: the failed node's drain
    assert (doc["done"], doc["would"], doc["refused"], doc["skipped"]) == (
        ["drain gpu005: opsctl:nccl-busbw"], [], {}, {})
    assert found.calls[0] == 4 and found.calls[1].startswith("opsctl-preflight-")
    assert found.calls[2:] == (["alice"], 2)  # the caller behind sudo; max(2, N/4) spares


def test_fewer_than_n_is_exit_1_and_a_safety_stop_is_exit_4(monkeypatch, tmp_path):
    assert _command(monkeypatch, tmp_path, ["gpu001", "gpu002", "gpu003"], health_code=0)[0].exit_code == 1
    assert _command(monkeypatch, tmp_path, ["gpu001", "gpu002", "gpu003", "gpu004"], health_code=4)[0].exit_code == 4


def test_the_last_line_says_what_the_caller_got():
    from opsctl.commands.validate import _handed_over_line

    assert _handed_over_line(pf.Preflight("big-run", 2)) == "preflight: no idle GPU node to reserve, nothing validated"
    found = passed("gpu001", "gpu002", "gpu004")
    found.handed_over = ["gpu001", "gpu002", "gpu004"]
    assert _handed_over_line(found) == "preflight: reservation pf: gpu[001-002,004] (3 of 8 asked)"
    found.handed_over = []
    assert _handed_over_line(found) == "preflight: no good node, reservation pf deleted"


def test_defect_10_ctrl_c_during_the_reservation_call_still_deletes_the_reservation(tmp_path):
    class Interrupted(FakeReservations):
        def reserve(self, name, nodes, minutes):
            super().reserve(name, nodes, minutes)  # Slurm made it; Ctrl-C came before scontrol's answer
            raise KeyboardInterrupt
    jobs = Interrupted()
    with pytest.raises(KeyboardInterrupt):
        pf.run_preflight(config(tmp_path), FakeSlurm(gpu_nodes(4)), jobs, None, 2, None, "big-run", ["a"], 1)
    assert jobs.calls[0][0] == "reserve" and jobs.calls[-1] == ("release", "big-run")


def test_a_reservation_slurm_refused_is_not_deleted_its_name_may_be_someone_elses(tmp_path):
    jobs = FakeReservations()

    def refuse(name, nodes, minutes):
        jobs.calls.append(("reserve", name, list(nodes)))
        raise SourceUnavailable("Slurm: scontrol create failed: Error creating the reservation: "
                                "Duplicate reservation name")
    jobs.reserve = refuse
    with pytest.raises(SourceUnavailable, match="Duplicate"):
        pf.run_preflight(config(tmp_path), FakeSlurm(gpu_nodes(4)), jobs, None, 2, None, "big-run", ["a"], 1)
    assert ("release", "big-run") not in jobs.calls


class ResultsProm(FakeProm):
    """Prometheus as a preflight reads its nodes' results: each node's own run fresh and passed, and its rails'
    result the previous preflight's pass (yesterday's), until a rails' result this run wrote (`written`)
    arrives, `delay` reads of the results later, at its own time; a failed rail is then judged by the rule."""

    def __init__(self, config, nodes, delay=3):
        super().__init__(config, nodes)
        self.ran = time.time()
        self.delay = delay
        self.values = {n: {("nccl", "node"): 0.0, ("dcgm-diag", "node"): 0.0, ("nccl-pair", "node"): 0.0}
                       for n in nodes}
        self.pairs_time = dict.fromkeys(nodes, self.ran - 86400.0)
        self.arriving: dict[str, tuple[list[str], int]] = {}  # node -> (failed HCAs, reads until it arrives)

    def written(self, node, failed):
        self.arriving[node] = (failed, self.delay)

    def _arrive(self):
        for name, (failed, left) in list(self.arriving.items()):
            if left:
                self.arriving[name] = (failed, left - 1)
                continue
            del self.arriving[name]
            stamp = time.time()
            self.pairs_time[name] = stamp
            mine = {k: v for k, v in self.values[name].items() if k[0] != "nccl-pair"}
            self.values[name] = {**mine, **({("nccl-pair", h): stamp for h in failed} or {("nccl-pair", "node"): 0.0})}
            for hca in failed:
                self.breach("validate", name, f"nccl-pair {hca}", stamp)

    def query(self, expr, at=None):
        if "opsctl_node_validate_timestamp_seconds" in expr:
            self._arrive()
            return [Sample(self._labels(n, "node"), self.ran) for n in self.nodes]
        if "opsctl_node_validate_pairs_timestamp_seconds" in expr:
            return [Sample(self._labels(n, "node"), t) for n, t in self.pairs_time.items()]
        if "(opsctl_node_validate{" in expr:
            return [Sample(self._labels(n, "node", {"test": t, "device": d}), v)
                    for n, found in self.values.items() for (t, d), v in found.items()]
        return super().query(expr, at)


class RecordingReservations(FakeReservations):
    """Rail steps as the emulator measures them, one rail `dead` on one node; a step that records a node's
    rails tells Prometheus what it wrote."""

    def __init__(self, prom, dead):
        super().__init__()
        self.prom = prom
        self.dead = dead  # (node, rail index)

    def run_step(self, spec, timeout):
        command = spec.argv[-1]
        if "--record-pairs" in command:
            found = command.rsplit(" ", 1)[-1]
            self.prom.written(spec.nodes[0], [] if found == "pass" else found.split(","))
            return 0, ""
        node_down, rail = self.dead
        if node_down in spec.nodes and dict(spec.env)["CUDA_VISIBLE_DEVICES"] == str(rail):
            return 1, "NCCL WARN NET/IB : Got completion with error 12, opcode 0, len 0, vendor err 129\n"
        return super().run_step(spec, timeout)


def _preflight_read_from(monkeypatch, cfg, delay):
    """run_preflight over 6 nodes for 4, gpu002's first rail dead, the single-node jobs ended at once and their
    results (passed) in Prometheus; the rails' results reach it `delay` reads after they were written."""
    prom = ResultsProm(cfg, [f"gpu{i:03d}" for i in range(1, 7)], delay)
    jobs = RecordingReservations(prom, dead=("gpu002", 0))

    def submit(config, jobs, sweep, reservation=""):
        for number, entry in enumerate(sweep.nodes.values()):
            if not entry.result:
                entry.result, entry.job = "ended", str(100 + number)
    monkeypatch.setattr(pf, "submit", submit)
    monkeypatch.setattr(pf, "await_jobs", lambda *_: None)
    return pf.run_preflight(cfg, FakeSlurm(gpu_nodes(6)), jobs, prom, 4, None, "big-run", ["alice"], spares=2,
                            clock=JumpingClock())


def test_defect_8_a_dead_rail_recorded_after_the_previous_preflights_pass_is_waited_for_and_never_handed_over(
        monkeypatch, tmp_path):
    cfg = config(tmp_path)
    found = _preflight_read_from(monkeypatch, cfg, delay=3)
    assert [(f.node, f.hca, f.verdict) for f in found.rails] == [("gpu002", cfg.ib.rails[0], "dead")]
    assert found.handed_over == ["gpu001", "gpu003", "gpu004", "gpu005"]
    assert found.sweep.nodes["gpu002"].result == "fail"
    assert found.sweep.nodes["gpu002"].detail.startswith(f"nccl-pair {cfg.ib.rails[0]} dead")


def test_rails_results_that_never_reach_prometheus_are_not_checked_and_no_node_is_handed_over(monkeypatch, tmp_path):
    found = _preflight_read_from(monkeypatch, config(tmp_path), delay=10**6)
    assert found.handed_over == []
    assert {v.result for v in found.sweep.nodes.values()} == {"not-checked"}
    assert found.sweep.nodes["gpu001"].detail == "no new nccl-pair results in Prometheus (see the job's node)"
