"""`opsctl health --changes-only`, what the timer writes to the journal: the verdicts that changed since
the previous run of the same kind, every action and refusal, and one summary line a run; the record
lives in the state directory and only a complete run replaces it."""

import re

import pytest

from opsctl.actor.state import State
from opsctl.errors import SourceUnavailable
from tests.unit.fakes import IB_REASON, ISO, World, node

XID = "xid-79 gpu3 xid=79 count=1"
SUMMARY = r"64 nodes: (\d+) ok, 0 warn, (\d+) fail, 0 unknown(; out of service: [^;]+)?; \d+ queries in \d+\.\d\ds"


@pytest.fixture
def world(tmp_path):
    return World(tmp_path)


def lines(w: World) -> list[str]:
    """stdout without the time stamp, after checking that every line has one, and the same one."""
    out = w.stdout.splitlines()
    assert all(re.match(rf"{ISO} ", line) for line in out), out
    assert len({line.split(" ", 1)[0] for line in out}) == 1
    return [line.split(" ", 1)[1] for line in out]


def changes(w: World, *args: str) -> list[str]:
    w.code = w.run("health", "--changes-only", *args)
    return lines(w)


def test_the_first_run_logs_each_node_that_is_not_ok_once(world):
    world.prom.breach("xid-79", "gpu040", "3")
    first = changes(world)
    assert world.code == 1 and first[0] == f"gpu040 fail: {XID}" and len(first) == 2
    assert re.fullmatch(SUMMARY, first[1]) and first[1].startswith("64 nodes: 63 ok, 0 warn, 1 fail")


def test_a_second_identical_run_prints_only_the_summary_line(world):
    world.prom.breach("xid-79", "gpu040", "3")
    changes(world)
    world.prom.breaching["xid-79"] = [("gpu040", "3", 1.0)]  # same event, same verdict
    again = changes(world)
    assert world.code == 1 and len(again) == 1 and re.fullmatch(SUMMARY, again[0])
    world.run("health")
    timing = re.compile(r"in \d+\.\d\ds")
    assert timing.sub("", again[0]) == timing.sub("", world.stdout.splitlines()[-1])  # the table's own summary


def test_a_node_going_fail_prints_one_change_line_and_going_ok_another(world):
    assert changes(world)[0].startswith("64 nodes: 64 ok") and world.code == 0
    world.prom.breach("xid-79", "gpu040", "3")
    assert changes(world)[:-1] == [f"gpu040 ok -> fail: {XID}"]
    world.prom.breaching = {}
    assert changes(world)[:-1] == ["gpu040 fail -> ok"]
    assert changes(world)[:-1] == []


def test_a_new_rule_on_a_failing_node_is_a_change_a_new_value_is_not(world):
    world.prom.breach("xid-79", "gpu040", "3")
    changes(world)
    world.prom.breach("ib-down", "gpu040")
    assert changes(world)[:-1] == [f"gpu040 fail -> fail: ib-down mlx5_0 DOWN (state_id=1); {XID}"]
    world.prom.breaching["xid-79"] = [("gpu040", "3", 2.0)]  # count=2: the same rule on the same GPU
    assert changes(world)[:-1] == []


def test_every_action_prints_and_a_drained_node_reads_ok_as_handled(world):
    world.prom.breach("xid-79", "gpu040", "3")
    out = changes(world, "--drain")
    assert out[:-1] == [f"gpu040 fail: {XID}", f"drain gpu040: opsctl:{XID}"] and out[-1].endswith("; 1 drained")
    assert changes(world, "--drain")[:-1] == [f"gpu040 fail -> ok (handled: {XID})"]
    assert changes(world, "--drain")[:-1] == []


def test_a_resume_says_which_reason_it_lifted(tmp_path):
    w = World(tmp_path, raw={"safety": {"resume_after": "0s"}},
              gpu040=node("gpu040", flags=("DRAIN",), reason=IB_REASON))
    assert changes(w, "--resume")[:-1] == [f"resume gpu040: was {IB_REASON}, ok for 0s"]
    assert changes(w, "--resume")[:-1] == [] and w.code == 0


def test_a_refusal_prints_on_every_run_even_when_no_verdict_changed(tmp_path):
    w = World(tmp_path, gpu062=node("gpu062", flags=("DRAIN",), reason="maintenance"))
    w.prom.breach("xid-79", "gpu062", "3")
    refused = "refused gpu062: not-owned: IDLE+DRAIN with a reason opsctl did not set"
    assert changes(w, "--drain")[1:-1] == [refused]
    assert changes(w, "--drain")[:-1] == [refused] and w.slurm.calls == []


def test_the_breaker_prints_its_refusal_and_the_safety_stop_and_keeps_the_record(world):
    changes(world, "--drain")
    for i in range(33, 40):
        world.prom.breach("xid-79", f"gpu{i:03d}", "0")
    out = changes(world, "--drain")
    nodes = ", ".join(f"gpu{i:03d}" for i in range(33, 40))
    assert world.code == 4 and len(out) == 7 + 1 + 2 and world.slurm.calls == []
    assert out[7].startswith(f"refused {nodes}: circuit-breaker: 7 nodes newly fail")
    assert out[9].startswith("safety stop: circuit breaker: 7 nodes newly fail")
    assert changes(world, "--drain")[:7] == out[:7]  # a safety stop is no complete run: compared again


def test_a_failed_run_prints_its_one_line_and_keeps_the_previous_record(world):
    world.prom.breach("xid-79", "gpu040", "3")
    changes(world, "--drain")
    state = State(world.tmp / "state")
    kept = state.last_runs.get("drain")
    world.prom.breaching = {}
    world.prom.fail_with = SourceUnavailable("cannot connect to http://p:9090: connection refused")
    assert world.run("health", "--changes-only", "--drain") == 3
    assert world.stdout == "" and world.stderr == "opsctl: error: cannot connect to http://p:9090: connection refused\n"
    world.prom.fail_with, world.prom.partial = None, ["store gateway 3 unreachable"]
    out = changes(world, "--drain")  # exit 3 with a result: no node changes from a partial answer
    assert world.code == 3 and out[0].startswith("64 nodes: 64 ok") and len(out) > 1
    assert all(line.startswith("warning: the source may have answered partially") for line in out[1:])
    assert state.last_runs.get("drain") == kept and list(kept["nodes"]) == ["gpu040"]
    world.prom.partial, world.prom.warnings = [], []
    assert changes(world, "--drain")[:-1] == ["gpu040 fail -> ok"]  # against the last complete run


def test_each_kind_of_run_has_its_own_record(world):
    world.prom.breach("xid-79", "gpu040", "3")
    changes(world)  # a read-only run by hand
    assert changes(world, "--dry-run")[:-1] == [f"gpu040 fail: {XID}", f"would-drain gpu040: opsctl:{XID}"]
    assert changes(world, "--nodes", "gpu[040-041]")[0] == f"gpu040 fail: {XID}"
    state = State(world.tmp / "state")
    assert all(state.last_runs.get(kind) for kind in ("drain dry-run", "read-only", "read-only nodes=gpu[040-041]"))
    assert state.last_runs.get("drain") is None


def test_a_watch_round_prints_its_changes_and_keeps_the_record(world):
    world.prom.breach("xid-79", "gpu040", "3")
    world.slurm.sigterm_on_read = 1  # SIGTERM during the first round: it finishes, then the loop ends
    assert world.run("health", "--changes-only", "--watch", "1") == 0
    out = lines(world)
    assert out[0] == f"gpu040 fail: {XID}" and len(out) == 2 and re.fullmatch(SUMMARY, out[1])
    assert changes(world)[:-1] == []  # the next run compares with that round


def test_changes_only_does_not_mix_with_json_or_all(world):
    assert world.run("health", "--changes-only", "--json") == 2
    assert world.run("health", "--changes-only", "--all") == 2
    assert world.stderr == ("opsctl: error: --changes-only prints what changed since the last run, not every node: "
                            "leave out --json and --all\n")


def test_an_unreadable_record_stops_the_run_before_it_acts(world):
    world.prom.breach("xid-79", "gpu040", "3")
    (world.tmp / "state").mkdir(mode=0o700)
    for torn in ('{"drain": []}', '{"drain": {"nodes": {"gpu040": {}}}}', "[]"):
        (world.tmp / "state" / "last_runs.json").write_text(torn)
        assert world.run("health", "--changes-only", "--drain") == 2
        assert "last_runs.json is unreadable" in world.stderr and world.slurm.calls == []
