"""`opsctl health`, `drain`, `resume`, `history` and `--watch` end to end through the CLI, with fakes of
the PromQuery and Slurm protocols passed in click's context object: one test per outcome and exit
code. The lab tier runs the same behaviours against real Slurm (22.05, 24.11, 26.05), Prometheus and
VictoriaMetrics."""

import json
import re
import threading

import pytest

from opsctl.actor.lock import RunLock
from opsctl.actor.state import HandledEvents, State
from opsctl.errors import SourceUnavailable
from tests.unit.fakes import IB_REASON, ISO, World, node


@pytest.fixture
def world(tmp_path):
    return World(tmp_path)


def test_a_healthy_cluster_exits_0(world):
    code, nodes, summary = world.json()
    # Presence, scrape age, identity, the recorded rule results and presence again: every rule was recorded
    # and fresh.
    assert code == 0 and summary["ok"] == 64 and summary["queries"] == 5
    assert summary["rule_results"] == "precomputed" and summary["rule_results_note"] is None


def test_failing_nodes_exit_1_and_a_read_only_run_changes_nothing(world):
    world.prom.breach("xid-79", "gpu040", "3")
    code, nodes, _ = world.json()
    assert (code, nodes["gpu040"]["status"], nodes["gpu040"]["action"]) == (1, "fail", "none")
    assert world.slurm.calls == [] and world.audit() == []


def test_drain_drains_audits_values_and_remembers_the_event(world):
    world.prom.breach("xid-79", "gpu040", "3")
    code, nodes, summary = world.json("--drain")
    assert (code, nodes["gpu040"]["action"], summary["drained"]) == (1, "drain", 1)
    assert world.slurm.calls == [("drain", ("gpu040",), "opsctl:xid-79 gpu3 xid=79 count=1")]
    [record] = world.audit()
    assert record["event"] == "drain" and record["values"] == [
        {"rule": "xid-79", "device": "gpu3", "value": 1.0, "threshold": 0.0}]
    [handled] = State(world.tmp / "state").handled.load().records
    assert (handled.node, handled.rule, handled.device, handled.settled) == ("gpu040", "xid-79", "gpu3", True)


def test_dry_run_shows_the_plan_and_changes_nothing(world):
    world.prom.breach("xid-79", "gpu040", "3")
    code, nodes, _ = world.json("--dry-run")
    assert (code, nodes["gpu040"]["action"]) == (1, "would-drain") and world.slurm.calls == []
    assert [r["event"] for r in world.audit()] == ["would-drain"]


def test_after_a_person_resumes_only_a_new_event_drains_again(world):
    world.prom.breach("xid-79", "gpu040", "3")
    world.run("health", "--drain")
    world.slurm.resume(["gpu040"])  # a person reset the GPU and resumed the node
    code, nodes, _ = world.json("--drain")
    assert (code, nodes["gpu040"]["status"], nodes["gpu040"]["checks"][0]["status"]) == (0, "ok", "handled")
    world.prom.breaching["xid-79"] = [("gpu040", "3", 2.0)]  # the count went up: a new XID
    code, nodes, _ = world.json("--drain")
    assert nodes["gpu040"]["action"] == "drain"


def test_partial_answers_act_on_nothing_and_exit_3(world):
    world.prom.breach("xid-79", "gpu040", "3")
    world.prom.partial = ["store gateway 3 unreachable"]
    code, nodes, summary = world.json("--drain")
    assert code == 3 and nodes["gpu040"]["action"] == "none" and world.slurm.calls == []
    assert "store gateway 3 unreachable" in summary["warnings"][0]
    assert world.audit()[-1]["event"] == "refuse"
    assert world.run("health") == 3 and "warning: the source may have answered partially" in world.stdout


@pytest.mark.parametrize("broken", ["prom", "slurm"])
def test_a_source_down_is_exit_3_with_one_line_and_nothing_done(world, broken):
    world.prom.breach("xid-79", "gpu040", "3")
    if broken == "prom":
        world.prom.fail_with = SourceUnavailable("Prometheus at http://p:9090: cannot connect (refused)")
    else:
        world.slurm.nodes = lambda: (_ for _ in ()).throw(SourceUnavailable("Slurm: scontrol show failed: x"))
    assert world.run("health", "--drain") == 3
    assert world.stdout == "" and world.stderr.count("\n") == 1 and world.stderr.startswith("opsctl: error: ")
    assert world.slurm.calls == []


def test_slurm_is_read_while_prometheus_answers(world):
    """At thousands of nodes each read takes seconds: Slurm's nodes are read while the queries run, not
    before them (a Slurm read that finds no query asked within 5 s tells the run was sequential)."""
    asked, overlapped = threading.Event(), []
    query, nodes = world.prom.query, world.slurm.nodes

    def prom_query(expr, at=None):
        asked.set()
        return query(expr, at)

    def slurm_nodes():
        overlapped.append(asked.wait(5))
        return nodes()

    world.prom.query, world.slurm.nodes = prom_query, slurm_nodes
    assert world.run("health") == 0 and overlapped == [True]


@pytest.mark.parametrize("slurm_fault,code,told", [
    ("down", 3, "opsctl: error: Slurm: scontrol show failed: x\n"),
    ("scope", 2, "opsctl: error: --nodes: not Slurm nodes of the judged partitions (slurm.partitions): gpu999\n")])
def test_with_prometheus_down_too_slurms_fault_is_the_one_told(world, slurm_fault, code, told):
    """As when Slurm was read first: its failure, or a --nodes outside it, is told, not Prometheus'."""
    world.prom.fail_with = SourceUnavailable("Prometheus at http://p:9090: cannot connect (refused)")
    if slurm_fault == "down":
        world.slurm.nodes = lambda: (_ for _ in ()).throw(SourceUnavailable("Slurm: scontrol show failed: x"))
    assert world.run("health", "--drain", "--nodes", "gpu999" if slurm_fault == "scope" else "gpu001") == code
    assert world.stderr == told and world.slurm.calls == []


@pytest.mark.parametrize("failure,code", [
    (SourceUnavailable("cannot connect to http://p:9090: connection refused"), 3),
    (RuntimeError("boom"), 3)])
def test_with_json_an_error_is_a_json_object_on_stdout_too(world, failure, code):
    world.prom.fail_with = failure
    assert world.run("health", "--json") == code
    doc = json.loads(world.stdout)
    assert doc == {"schema": 1, "error": doc["error"], "exit_code": code, "done": []}
    assert world.stderr == f"opsctl: error: {doc['error']}" + (
        "\n" if code == 3 and isinstance(failure, SourceUnavailable) else
        " (run with opsctl --debug for the traceback)\n")
    assert str(failure) in doc["error"]


def test_a_config_error_is_exit_2(tmp_path):
    w = World(tmp_path, raw={"slurm": {"partitions": ["nope"]}})
    assert w.run("health", "--drain") == 2
    assert w.stderr == "opsctl: error: config key slurm.partitions: no Slurm partition nope (Slurm has: gpu)\n"


def test_a_job_without_targets_is_exit_2_naming_it_and_the_jobs_there_are(world):
    world.prom.up = {k: v for k, v in world.prom.up.items() if k[1] != "node"}
    assert world.run("health") == 2
    assert world.stderr.startswith("opsctl: error: config key prometheus.jobs.node: Prometheus has no target of job "
                                   "'node'") and "its jobs are: dcgm, node, other" in world.stderr


def test_the_breaker_stops_everything_and_exits_4(world):
    for i in range(33, 40):
        world.prom.breach("xid-79", f"gpu{i:03d}", "0")
    code, nodes, summary = world.json("--drain")
    assert code == 4 and "circuit breaker" in summary["safety_stop"] and world.slurm.calls == []


def test_two_scoped_runs_do_not_drain_what_one_full_run_refuses(world):
    for i in range(33, 40):
        world.prom.breach("xid-79", f"gpu{i:03d}", "0")
    assert world.run("health", "--drain", "--nodes", "gpu[033-035]") == 4
    assert world.run("health", "--drain", "--nodes", "gpu[036-039]") == 4
    assert world.slurm.calls == []


def test_too_many_unknown_nodes_exit_4_in_a_read_only_run_too(world):
    for i in range(1, 34):
        world.prom.up[(f"gpu{i:03d}", "dcgm")] = 0.0
    code, _, summary = world.json()
    assert code == 4 and "no usable data" in summary["safety_stop"]


def test_the_out_of_service_limit_exits_4(tmp_path):
    w = World(tmp_path, **{f"gpu{i:03d}": node(f"gpu{i:03d}", "down", reason="psu") for i in range(1, 13)})
    w.prom.breach("xid-79", "gpu040", "0")
    code, nodes, _ = w.json("--drain")
    assert code == 4 and nodes["gpu040"]["action"] == "skip:out-of-service-limit" and w.slurm.calls == []


def test_a_held_lock_exits_4(world):
    world.prom.breach("xid-79", "gpu040", "3")
    with RunLock(world.tmp / "state"):
        assert world.run("health", "--drain") == 4
    assert "another acting opsctl holds" in world.stderr and world.slurm.calls == []
    assert world.run("health", "--drain") == 1 and world.slurm.calls  # released again: the next run acts


def test_a_state_directory_others_can_write_is_exit_2(world):
    (world.tmp / "state").mkdir(mode=0o777)
    (world.tmp / "state").chmod(0o777)
    assert world.run("health", "--drain") == 2 and "writable by group or others (mode 0777)" in world.stderr


def test_an_unexpected_error_is_exit_3_with_one_line_and_a_traceback_only_with_debug(world):
    world.prom.fail_with = RuntimeError("boom")
    assert world.run("health") == 3
    assert world.stderr == ("opsctl: error: unexpected error: RuntimeError: boom "
                            "(run with opsctl --debug for the traceback)\n")
    assert world.run("--debug", "health") == 3 and "Traceback" in world.stderr


def test_an_error_after_some_changes_lists_exactly_which_were_done(world):
    world.prom.breach("xid-79", "gpu040", "3")
    world.prom.breach("ib-down", "gpu041")
    world.slurm.raise_on_change = PermissionError(13, "Permission denied")
    assert world.run("health", "--drain") == 3
    assert world.stdout == "done before the error: drain gpu040: opsctl:xid-79 gpu3 xid=79 count=1\n"
    assert world.stderr.count("\n") == 1 and "PermissionError" in world.stderr
    events = [(r["event"], r["node"]) for r in world.audit()]
    assert events[0] == ("drain", "gpu040") and events[-1][0] == "error" and "done before it: drain gpu040" in \
        world.audit()[-1]["detail"]
    assert not world.slurm.state["gpu041"].drained


def test_a_refused_scontrol_forgets_the_intent_and_exits_3(world):
    world.prom.breach("xid-79", "gpu040", "3")
    world.slurm.fail_change = 1
    assert world.run("health", "--drain") == 3
    assert State(world.tmp / "state").handled.load().records == []  # not drained: nothing to remember
    assert [r["event"] for r in world.audit()][:1] == ["drain-failed"]


def test_slurm_changing_under_the_plan_leaves_the_node_alone(world):
    world.prom.breach("xid-79", "gpu040", "3")
    reads = []
    original = world.slurm.nodes

    def nodes():
        reads.append(1)
        if len(reads) == 2:  # the re-read right before scontrol: a person drained it in between
            world.slurm.state["gpu040"] = node("gpu040", flags=("DRAIN",), reason="bad dimm")
        return original()

    world.slurm.nodes = nodes
    code, nodes_out, _ = world.json("--drain")
    assert nodes_out["gpu040"]["action"] == "skip:changed" and world.slurm.calls == []
    assert world.slurm.state["gpu040"].reason == "bad dimm"
    assert any(r["event"] == "refuse" and "changed" in r["detail"] for r in world.audit())


def test_resume_needs_positive_evidence_and_audits_how_long_the_node_was_healthy(tmp_path):
    w = World(tmp_path, raw={"safety": {"resume_after": "0s"}},
              gpu040=node("gpu040", flags=("DRAIN",), reason=IB_REASON))
    w.prom.vanish("ib-down", "gpu040")  # the metric is gone: not "ok"
    code, nodes, _ = w.json("--resume")
    assert nodes["gpu040"]["action"] == "skip:no-data" and w.slurm.calls == []
    del w.prom.raw["ib-down"]
    code, nodes, summary = w.json("--resume")
    assert (code, nodes["gpu040"]["action"], summary["resumed"]) == (0, "resume", 1)
    assert w.slurm.calls == [("resume", ("gpu040",))]
    record = w.audit()[-1]
    assert record["event"] == "resume" and record["healthy_seconds"] == 0 and record["values"][0]["rule"] == "ib-down"


def test_resume_queries_grow_with_rules_not_nodes(tmp_path):
    drained = {f"gpu{i:03d}": node(f"gpu{i:03d}", flags=("DRAIN",), reason=IB_REASON) for i in range(40, 50)}
    raw = {"safety": {"resume_after": "0s", "max_resumes_per_run": 20, "max_resumes_per_hour": 20}}
    w = World(tmp_path, raw=raw, **drained)
    code, _, summary = w.json("--resume")
    assert summary["resumed"] == 10 and summary["queries"] == 5 + 1  # and one for the resume evidence
    direct = World(tmp_path / "direct", raw=raw, **drained)
    direct.prom.recorded = {}  # no recording rules: every rule is queried directly
    _, _, summary = direct.json("--resume")
    assert summary["resumed"] == 10 and summary["queries"] == 5 + len(w.prom.rules) + 1


def test_the_resume_budget_exits_4(tmp_path):
    drained = {f"gpu{i:03d}": node(f"gpu{i:03d}", flags=("DRAIN",), reason=IB_REASON) for i in range(40, 46)}
    w = World(tmp_path, raw={"safety": {"resume_after": "0s"}}, **drained)
    code, _, summary = w.json("--resume")
    assert code == 4 and summary["resumed"] == 4 and "resume budget" in summary["safety_stop"]


def test_an_xid_during_an_auto_resumable_drain_turns_it_into_one_that_needs_a_person(tmp_path):
    w = World(tmp_path, raw={"safety": {"resume_after": "0s"}},
              gpu040=node("gpu040", flags=("DRAIN",), reason=IB_REASON))
    w.prom.breach("xid-79", "gpu040", "3")
    code, nodes, summary = w.json("--drain", "--resume")
    assert nodes["gpu040"]["action"] == "escalate" and summary["escalated"] == 1
    assert w.slurm.calls == [("reason", ("gpu040",), "opsctl:ib-down,xid-79 mlx5_0 state_id=1; gpu3 xid=79 count=1")]
    w.prom.breaching = {}  # the XID left its window, the port is fine again
    code, nodes, _ = w.json("--drain", "--resume")
    assert nodes["gpu040"]["action"] == "skip:needs-person" and len(w.slurm.calls) == 1


def test_nodes_outside_the_judged_partitions_are_not_judged_counted_or_touched(tmp_path):
    cpu = {f"cpu{i:03d}": node(f"cpu{i:03d}", partitions=("cpu",)) for i in range(1, 4)}
    w = World(tmp_path, n=8, **cpu)
    for name in cpu:
        w.slurm.state[name] = w.slurm.state[name].__class__(name, "idle", partitions=("cpu",))
    w.prom.breach("xid-79", "cpu001", "0")
    code, nodes, summary = w.json("--drain")
    assert "cpu001" not in nodes and summary["nodes"] == 8 and w.slurm.calls == []


def test_manual_drain_and_resume_refuse_foreign_reasons(tmp_path):
    w = World(tmp_path, gpu062=node("gpu062", flags=("DRAIN",), reason="maintenance"))
    assert w.run("drain", "gpu062", "--reason", "mine now") == 4 and w.slurm.calls == []
    assert w.run("drain", "gpu061", "--reason", "bad fan") == 0
    assert w.slurm.state["gpu061"].reason == "opsctl:manual bad fan"
    assert w.run("resume", "gpu062") == 4
    assert w.run("resume", "gpu062", "--force") == 0 and not w.slurm.state["gpu062"].drained


def test_history_skips_a_torn_last_line_with_a_warning(world):
    world.run("drain", "gpu061", "--reason", "bad fan")
    with open(world.tmp / "state" / "audit.jsonl", "a") as out:
        out.write('{"event": "dr')
    assert world.run("history") == 0
    assert "torn last line skipped" in world.stderr and "opsctl:manual bad fan" in world.stdout


def test_history_of_one_node_lists_its_events_in_time_order(world):
    world.run("drain", "gpu061", "--reason", "bad fan")
    world.run("drain", "gpu062", "--reason", "loose cable")
    world.run("resume", "gpu061")
    assert world.run("history", "gpu061") == 0
    lines = world.stdout.splitlines()
    assert lines[0].split() == ["TIME", "USER", "EVENT", "NODE", "CHECKS", "DETAIL"]
    assert [line.split()[2] for line in lines[1:]] == ["drain", "resume"] and "gpu062" not in world.stdout
    assert world.run("history", "gpu061", "--json") == 0
    records = [json.loads(line) for line in world.stdout.splitlines()]
    assert [r["event"] for r in records] == ["drain", "resume"] and {r["node"] for r in records} == {"gpu061"}
    assert records[0]["time"] <= records[1]["time"]
    assert world.run("history", "gpu061", "--node", "gpu062") == 2 and "differ" in world.stderr


def test_watch_goes_on_after_a_failed_round_and_ends_with_exit_0_on_sigterm(world):
    world.prom.breach("xid-79", "gpu040", "3")
    world.slurm.sigterm_on_read = 3  # the third round's Slurm read: SIGTERM, as systemd stops the unit
    failures = iter([SourceUnavailable("Prometheus at x: cannot connect"), None, None])
    original = world.prom.query

    def query(expr, at=None):
        failure = next(failures, None) if expr.startswith("up{") else None
        if failure:
            raise failure
        return original(expr, at)

    world.prom.query = query
    assert world.run("health", "--watch", "1", "--json") == 0
    assert world.stdout.count('"summary"') == 2 and "cannot connect (exit 3); retrying in 1s" in world.stderr
    assert re.fullmatch(rf"{ISO} opsctl: Prometheus at x: cannot connect \(exit 3\); retrying in 1s\n", world.stderr)
    error, *rounds = json.loads("[" + world.stdout.replace("}\n{", "},\n{") + "]")
    assert (error["error"], error["exit_code"], error["schema"]) == ("Prometheus at x: cannot connect", 3, 1)
    assert re.fullmatch(ISO, error["time"]) and all(re.fullmatch(ISO, r["summary"]["time"]) for r in rounds)


def test_every_watch_line_of_the_table_starts_with_the_time_of_its_round(world):
    world.prom.breach("xid-79", "gpu040", "3")
    world.slurm.sigterm_on_read = 2
    assert world.run("health", "--watch", "1") == 0
    lines = world.stdout.splitlines()
    assert len(lines) == 6 and all(re.match(rf"{ISO} ", line) for line in lines)  # two rounds of three lines
    assert lines[0].endswith(" NODE    STATUS  ACTION  EVIDENCE") and " 64 nodes: " in lines[2]
    assert len({line.split()[0] for line in lines[:3]}) == 1  # one round, one time


def test_a_drain_only_run_keeps_the_healthy_clock_of_a_resume_run(tmp_path):
    w = World(tmp_path, raw={"safety": {"resume_after": "10m"}},
              gpu040=node("gpu040", flags=("DRAIN",), reason=IB_REASON))
    w.json("--resume")
    since = State(tmp_path / "state").healthy_since.load()
    assert list(since) == ["gpu040"]
    w.json("--drain")  # e.g. a separate timer: it must not reset the clock
    assert State(tmp_path / "state").healthy_since.load() == since


def test_a_crash_between_scontrol_and_settling_never_re_drains_after_a_persons_resume(world, monkeypatch):
    world.prom.breach("xid-79", "gpu040", "3")
    saves = []
    original = HandledEvents.save

    def save_handled(self, memory):
        saves.append(1)
        if len(saves) == 3:  # pruned memory, then the intent, then scontrol drained, then the disk filled up
            raise OSError(28, "No space left on device")
        original(self, memory)

    monkeypatch.setattr(HandledEvents, "save", save_handled)
    assert world.run("health", "--drain") == 3
    assert world.stdout == "done before the error: drain gpu040: opsctl:xid-79 gpu3 xid=79 count=1\n"
    assert world.audit()[0]["event"] == "drain" and world.audit()[-1]["event"] == "error"
    monkeypatch.setattr(HandledEvents, "save", original)
    world.slurm.resume(["gpu040"])  # a person repaired the GPU and resumed the node
    code, nodes, _ = world.json("--drain")
    assert nodes["gpu040"]["action"] == "none" and nodes["gpu040"]["checks"][0]["status"] == "handled"


def test_a_state_directory_of_another_user_is_exit_2(world):
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root to give the directory away")
    (world.tmp / "state").mkdir(mode=0o700)
    os.chown(world.tmp / "state", 65534, 65534)
    assert world.run("health", "--drain") == 2 and "owned by uid 65534" in world.stderr


def test_every_audit_line_is_fsynced(world, monkeypatch):
    import os

    synced = []
    original = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), original(fd)))
    world.run("drain", "gpu061", "--reason", "bad fan")
    assert len(synced) >= 1 and world.audit()[0]["event"] == "drain"


def test_a_lustre_import_down_on_one_node_drains_it_with_the_rule_and_target(world):
    world.prom.breach("lustre-import-down", "gpu002", "lustre-OST0002")
    code, nodes, _ = world.json("--drain")
    assert code == 1 and nodes["gpu002"]["action"] == "drain"
    assert nodes["gpu002"]["checks"][0]["target"] == "lustre-OST0002"
    assert world.slurm.state["gpu002"].reason.startswith("opsctl:lustre-import-down lustre-OST0002")


def test_a_storage_outage_on_every_node_trips_the_breaker_naming_storage_not_the_nodes(world):
    for i in range(1, 65):
        world.prom.breach("lustre-import-down", f"gpu{i:03d}", "lustre-OST0002")
    code, _, summary = world.json("--drain")
    assert code == 4 and world.slurm.calls == [] and summary["outage"] == "storage"
    assert summary["safety_stop"].startswith("circuit breaker: storage (lustre-import-down lustre-OST0002), a storage "
                                             "outage rather than node faults; 64 nodes newly fail")
    assert world.run("health", "--drain") == 4
    rows = world.stdout.splitlines()
    assert rows[1].split() == ["storage", "fail", "skip:circuit-breaker", "64", "nodes"]
    assert not any(row.startswith("gpu") for row in rows)
    assert "safety stop: circuit breaker: storage (lustre-import-down lustre-OST0002)" in world.stdout


def test_a_breaker_of_node_faults_and_storage_together_names_no_storage(world):
    for i in range(1, 33):
        world.prom.breach("storage-mount-hung", f"gpu{i:03d}", "/home")
    for i in range(33, 40):
        world.prom.breach("xid-79", f"gpu{i:03d}", "0")
    code, _, summary = world.json("--drain")
    assert code == 4 and summary["outage"] is None and "storage" not in summary["safety_stop"]


def test_fabric_manager_down_on_every_node_trips_the_breaker_naming_the_fabric(world):
    for i in range(1, 65):
        world.prom.breach("fabric-manager-down", f"gpu{i:03d}", value=8)
    code, _, summary = world.json("--drain")
    assert code == 4 and world.slurm.calls == [] and summary["outage"] == "fabric"
    assert summary["safety_stop"].startswith("circuit breaker: fabric (fabric-manager-down), a fleet-wide NVSwitch "
                                             "fabric fault (Fabric Manager down or not matching the driver) rather "
                                             "than node faults; 64 nodes newly fail")
    assert world.run("health", "--drain") == 4
    assert world.stdout.splitlines()[1].split() == ["fabric", "fail", "skip:circuit-breaker", "64", "nodes"]


def test_a_breaker_of_storage_and_fabric_faults_together_names_neither(world):
    """Two shared domains failing at once are not one outage: the breaker lists the nodes."""
    for i in range(1, 33):
        world.prom.breach("storage-mount-hung", f"gpu{i:03d}", "/home")
    for i in range(33, 65):
        world.prom.breach("fabric-not-ready", f"gpu{i:03d}", "2", value=2)
    code, _, summary = world.json("--drain")
    assert code == 4 and summary["outage"] is None and world.slurm.calls == []
    assert not summary["safety_stop"].startswith(("circuit breaker: storage", "circuit breaker: fabric"))


def test_a_gpu_whose_fabric_is_stuck_is_drained_naming_the_gpu_and_the_fabric_state(world):
    world.prom.breach("fabric-not-ready", "gpu005", "2", value=2)
    code, nodes, _ = world.json("--drain")
    assert code == 1 and nodes["gpu005"]["action"] == "drain"
    assert world.slurm.state["gpu005"].reason.startswith("opsctl:fabric-not-ready gpu2 fabric In Progress")
