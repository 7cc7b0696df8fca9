"""`opsctl rollout drain|resume`: provisioning's rolling changes take a batch out of service through the one
actor, wait for its jobs without ever cancelling one, put back a node whose jobs outlast the wait, leave
every drain that is not the rollout's own as it is, and spend no drain budget. With a FakeSlurm whose jobs
end after a number of reads; the lab machines run the same commands from the nvidia role under real jobs
(tests/integration/provision/test_provision_4_nodes.py)."""

import json
from pathlib import Path

from click.testing import CliRunner

from opsctl.cli import main
from opsctl.clients import Clients
from opsctl.config.schema import parse_config
from opsctl.rollout.batch import drain_batch, reboot_batch, resume_batch
from tests.unit.fakes import FakeSlurm, gpu_nodes, node

CHANGE = "nvidia driver 570.172.08"
REASON = f"opsctl:provision {CHANGE}"


class JobsEnd(FakeSlurm):
    """Each node in `ends` runs a job until that many reads of the nodes have passed (None: never ends)."""

    def __init__(self, nodes, ends: dict[str, int | None]):
        super().__init__(nodes)
        self.ends = ends

    def nodes(self):
        current = super().nodes()
        for name, after in self.ends.items():
            busy = after is None or self.reads <= after
            base = ("mixed" if busy else "idle")
            self.state[name] = current[name] = node(name, base, current[name].flags, current[name].reason)
        return current


class Clock:
    def __init__(self):
        self.now, self.slept = 0.0, []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def config(tmp_path):
    return parse_config({}, "t", env={"OPSCTL_STATE_DIR": str(tmp_path / "state")})


def drain(tmp_path, slurm, hostlist, wait_s=600.0):
    clock = Clock()
    outcome = drain_batch(config(tmp_path), slurm, hostlist, CHANGE, wait_s, poll_s=5, clock=clock,
                          sleep=clock.sleep, now=1000.0)
    return outcome, clock


def audit(tmp_path):
    return [json.loads(line) for line in config(tmp_path).audit_log.read_text().splitlines()]


def test_the_batch_is_drained_and_ready_once_its_jobs_end_by_themselves(tmp_path):
    slurm = JobsEnd(gpu_nodes(4), {"gpu001": 6, "gpu002": 0})
    outcome, clock = drain(tmp_path, slurm, "gpu[001-002]")
    assert (outcome.drained, outcome.ready, outcome.skipped) == (["gpu001", "gpu002"], ["gpu001", "gpu002"], {})
    assert slurm.calls == [("drain", ("gpu001", "gpu002"), REASON)]  # nothing else: no job is cancelled
    assert clock.slept and sum(clock.slept) < 600  # it waited for gpu001's job, not for the timeout
    assert {n: slurm.state[n].reason for n in ("gpu003", "gpu004")} == {"gpu003": "", "gpu004": ""}
    assert [(r["event"], r["node"], r["checks"]) for r in audit(tmp_path)] == [
        ("drain", "gpu001", ["provision"]), ("drain", "gpu002", ["provision"])]
    # A planned drain spends no budget: `opsctl health --drain` keeps all of it for faults.
    budget = Path(tmp_path / "state" / "budget.json")
    assert not budget.exists() or json.loads(budget.read_text())["drains"] == []


def test_a_node_whose_jobs_outlast_the_wait_is_put_back_in_service_unchanged(tmp_path):
    slurm = JobsEnd(gpu_nodes(4), {"gpu001": None, "gpu002": 0})
    outcome, clock = drain(tmp_path, slurm, "gpu001,gpu002", wait_s=30)
    assert outcome.ready == ["gpu002"] and list(outcome.skipped) == ["gpu001"], outcome
    assert "never forced" in outcome.skipped["gpu001"] and outcome.exit_code == 1
    assert sum(clock.slept) == 30
    assert slurm.calls == [("drain", ("gpu001", "gpu002"), REASON), ("resume", ("gpu001",))]
    assert not slurm.state["gpu001"].drained and slurm.state["gpu001"].state == "mixed"
    assert slurm.state["gpu002"].reason == REASON


def test_a_node_out_of_service_for_another_reason_is_skipped_and_never_touched(tmp_path):
    earlier = "opsctl:provision nvidia driver 570.133.20"
    held = {"gpu001": node("gpu001", flags=("DRAIN",), reason="ticket-9 bad dimm"),
            "gpu002": node("gpu002", flags=("DRAIN",), reason="opsctl:hw-mismatch gpus 7 (profile 8)"),
            "gpu003": node("gpu003", flags=("DRAIN",), reason=earlier),
            "gpu004": node("gpu004", "down", flags=("NOT_RESPONDING",))}
    slurm = FakeSlurm(gpu_nodes(5, **held))
    outcome, _ = drain(tmp_path, slurm, "gpu[001-005]")
    assert sorted(outcome.held) == ["gpu001", "gpu002", "gpu004"] and "ticket-9" in outcome.held["gpu001"]
    assert sorted(outcome.skipped) == sorted(outcome.held) and outcome.exit_code == 1
    assert "left as it is until it is back in service" in outcome.skipped["gpu002"]
    assert outcome.drained == ["gpu003", "gpu005"] and outcome.ready == ["gpu003", "gpu005"]
    assert slurm.calls == [("drain", ("gpu005",), REASON)]
    assert "kept gpu003: drained by an earlier rollout" in "\n".join(outcome.lines)
    resumed, lines = resume_batch(config(tmp_path), slurm, "gpu[001-005]", now=1000.0)
    assert resumed == ["gpu003", "gpu005"], lines
    assert {n: slurm.state[n].reason for n in ("gpu001", "gpu002")} == {
        n: held[n].reason for n in ("gpu001", "gpu002")}
    assert slurm.state["gpu004"].state == "down"


def run(tmp_path, slurm, *args):
    return CliRunner().invoke(main, ["rollout", *args], obj=Clients(config=config(tmp_path), slurm=slurm))


def test_the_cli_prints_the_batch_as_json_and_exits_1_for_a_skipped_node(tmp_path):
    slurm = JobsEnd(gpu_nodes(2), {"gpu001": None})
    result = run(tmp_path, slurm, "drain", "gpu[001-002]", "--change", CHANGE, "--wait", "0", "--json")
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    assert (data["ready"], list(data["skipped"]), data["drained"], data["held"]) == (
        ["gpu002"], ["gpu001"], ["gpu001", "gpu002"], {})
    assert "resumed gpu001: its jobs outlasted the rollout's wait" in data["actions"]
    result = run(tmp_path, slurm, "resume", "gpu[001-002]", "--json")
    assert result.exit_code == 0 and json.loads(result.output)["resumed"] == ["gpu002"], result.output


def test_an_unknown_node_or_an_empty_change_is_a_usage_error_and_drains_nothing(tmp_path):
    slurm = FakeSlurm(gpu_nodes(2))
    unknown = run(tmp_path, slurm, "drain", "gpu[002-003]", "--change", CHANGE)
    assert unknown.exit_code == 2 and "unknown Slurm node(s): gpu003" in unknown.output
    empty = run(tmp_path, slurm, "drain", "gpu001", "--change", "  ")
    assert empty.exit_code == 2 and "--change" in empty.output
    assert slurm.calls == []


class Reboots(FakeSlurm):
    """A reboot through Slurm: the node shows REBOOT_REQUESTED, then NOT_RESPONDING, and `back_after` reads
    after the request registers again DOWN with the reboot's reason (nextstate=DOWN); None: never."""

    def __init__(self, nodes, back_after: int | None):
        super().__init__(nodes)
        self.back_after, self.asked = back_after, None

    def reboot(self, names, reason):
        super().reboot(names, reason)
        self.asked = self.reads

    def nodes(self):
        current = super().nodes()
        if self.asked is not None:
            for name, seen in current.items():
                if "REBOOT_REQUESTED" not in seen.flags and "NOT_RESPONDING" not in seen.flags:
                    continue
                back = self.back_after is not None and self.reads > self.asked + self.back_after
                self.state[name] = current[name] = node(name, "down", () if back else ("NOT_RESPONDING",),
                                                        seen.reason)
        return current


def test_a_drained_node_without_jobs_reboots_through_slurm_and_is_resumed_once_it_registers(tmp_path):
    busy = node("gpu003", "mixed", flags=("DRAIN",), reason=REASON)
    slurm = Reboots(gpu_nodes(3, gpu001=node("gpu001", flags=("DRAIN",), reason=REASON),
                              gpu002=node("gpu002", flags=("DRAIN",), reason="ticket-9 bad dimm"), gpu003=busy),
                    back_after=4)
    clock = Clock()
    back, lines = reboot_batch(config(tmp_path), slurm, "gpu[001-003]", CHANGE, 600, clock=clock, sleep=clock.sleep,
                               now=1000.0)
    assert back == ["gpu001"] and slurm.calls == [("reboot", ("gpu001",), REASON)], lines
    assert [line.split(":")[0] for line in lines] == ["refused gpu002", "refused gpu003", "back gpu001"]
    assert 0 < sum(clock.slept) < 600  # it waited for the node to register, not for the timeout
    assert slurm.state["gpu001"].state == "down" and slurm.state["gpu001"].reason == REASON
    resumed, lines = resume_batch(config(tmp_path), slurm, "gpu[001-002]", now=1000.0)
    assert resumed == ["gpu001"] and slurm.calls[-1] == ("resume", ("gpu001",)), lines
    assert slurm.state["gpu002"].reason == "ticket-9 bad dimm" and slurm.state["gpu003"].drained
    assert [(r["event"], r["node"]) for r in audit(tmp_path)] == [("reboot", "gpu001"), ("resume", "gpu001")]


def test_a_node_that_does_not_come_back_from_its_reboot_stays_out_of_service(tmp_path):
    slurm = Reboots(gpu_nodes(1, gpu001=node("gpu001", flags=("DRAIN",), reason=REASON)), back_after=None)
    result = run(tmp_path, slurm, "reboot", "gpu001", "--change", CHANGE, "--wait", "0", "--json")
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    assert data["back"] == [] and data["actions"][0].startswith("not back gpu001"), data
    resumed = run(tmp_path, slurm, "resume", "gpu001", "--json")
    assert resumed.exit_code == 0 and json.loads(resumed.output)["resumed"] == [], resumed.output
    assert slurm.calls == [("reboot", ("gpu001",), REASON)] and slurm.state["gpu001"].reason == REASON


def test_a_reboot_that_slurm_timed_out_is_not_back(tmp_path):
    """slurm.conf's ResumeTimeout passed: Slurm marks the node DOWN, its reason ending "reboot timed out"."""

    class TimedOut(FakeSlurm):
        def reboot(self, names, reason):
            super().reboot(names, reason)
            for name in names:
                self.state[name] = node(name, "down", (), f"{reason} : reboot timed out")

    slurm = TimedOut(gpu_nodes(1, gpu001=node("gpu001", flags=("DRAIN",), reason=REASON)))
    clock = Clock()
    back, lines = reboot_batch(config(tmp_path), slurm, "gpu001", CHANGE, 20, clock=clock, sleep=clock.sleep)
    assert back == [] and lines == ["not back gpu001: not registered with Slurm again within 20 s (still rebooting "
                                    "or not responding, or its reboot timed out); left DOWN"]
