"""`opsctl remediate` and `opsctl hold` over fakes of opsctl's Slurm and Prometheus protocols: the ladder's
steps, its safety rails, and what `opsctl history NODE` shows of it."""

import json
import re
import time
from dataclasses import replace

from opsctl.actor.audit import AuditLog
from opsctl.health.xid import xid_catalog
from opsctl.ladder.reasons import fault_of, rung_of, validated_reason
from tests.unit.fakes import ISO, World, node


def back_from_reboot(world, name):
    """What Slurm shows once the rebooted node registered again (nextstate=DOWN): DOWN, opsctl's reason."""
    world.slurm.state[name] = replace(world.slurm.state[name], state="down", flags=())


def node_validates(world, name, result, detail=""):
    """What the node's own checks set on its reason after the step (opsctl node check)."""
    seen = world.slurm.state[name]
    rung = rung_of(seen)
    world.slurm.state[name] = replace(seen, reason=validated_reason(result, rung.fault, rung.step, detail))


def events(world, name):
    assert world.run("history", name, "--json") == 0
    return [json.loads(line)["event"] for line in world.stdout.splitlines()]


def test_xid_79_is_drained_rebooted_validated_and_resumed_with_no_person(tmp_path):
    w = World(tmp_path)
    w.prom.breach("xid-79", "gpu040", "3")
    assert w.run("health", "--drain") == 1  # a failing node: exit 1, drained
    assert w.slurm.state["gpu040"].reason == "opsctl:xid-79 gpu3 xid=79 count=1"
    assert w.run("remediate") == 0
    assert w.slurm.calls[-1] == ("reboot", ("gpu040",), "opsctl:reboot gpu3 xid-79 xid=79 count=1")
    assert w.slurm.config_reads == 1  # ReturnToService asked once: by the plan, and the actor kept the answer
    assert w.run("remediate") == 0 and len(w.slurm.calls) == 2  # rebooting: nothing to do
    back_from_reboot(w, "gpu040")
    assert w.run("remediate") == 0 and len(w.slurm.calls) == 2  # back, waiting for its own checks
    node_validates(w, "gpu040", "pass")
    assert w.run("remediate") == 0
    assert w.slurm.calls[-1] == ("resume", ("gpu040",)) and w.slurm.state["gpu040"].reason == ""
    assert events(w, "gpu040") == ["drain", "reboot", "resume"]


def test_a_pending_row_remap_is_reset_validated_and_resumed_without_a_reboot(tmp_path):
    w = World(tmp_path)
    w.prom.breach("row-remap-pending", "gpu007", "2")
    assert w.run("health", "--drain") == 1  # a failing node: exit 1, drained
    assert w.run("remediate") == 0
    assert w.slurm.state["gpu007"].reason.startswith("opsctl:reset gpu2 row-remap-pending")
    node_validates(w, "gpu007", "pass")
    assert w.run("remediate") == 0
    assert [c[0] for c in w.slurm.calls] == ["drain", "reason", "resume"]
    assert events(w, "gpu007") == ["drain", "reset", "resume"]


def test_a_sticky_row_remap_failure_climbs_to_rma_with_a_bundle_and_stays(tmp_path):
    w = World(tmp_path)
    w.prom.breach("row-remap-failure", "gpu009", "5")
    assert w.run("health", "--drain") == 1  # a failing node: exit 1, drained
    assert w.run("remediate") == 0 and w.slurm.state["gpu009"].reason.startswith("opsctl:reset gpu5")
    node_validates(w, "gpu009", "fail", "memory gpu5: row remap failure")
    assert w.run("remediate") == 0 and w.slurm.calls[-1][0] == "reboot"
    back_from_reboot(w, "gpu009")
    node_validates(w, "gpu009", "fail", "serial=1650924060005 memory gpu5: row remap failure")
    assert w.run("remediate") == 0
    reason = w.slurm.state["gpu009"].reason
    assert reason.startswith("opsctl:rma gpu5 row-remap-failure failed its checks after the reboot: "
                             "serial=1650924060005 memory")
    [bundle] = (tmp_path / "state" / "rma").iterdir()
    summary = json.loads((bundle / "summary.json").read_text())
    assert (summary["node"], summary["gpu"], summary["rule"], summary["gpu_serial"]) == (
        "gpu009", "gpu5", "row-remap-failure", "1650924060005")
    history = [json.loads(line)["event"] for line in (bundle / "history.jsonl").read_text().splitlines()]
    assert history == ["drain", "reset", "reboot", "rma"]
    calls = len(w.slurm.calls)
    for _ in range(2):  # later runs, the ladder's and the health run's, leave it as it is
        assert w.run("remediate") == 0 and len(w.slurm.calls) == calls
        w.run("health", "--drain", "--resume")
    assert w.slurm.state["gpu009"].reason == reason


def test_the_same_xid_three_times_in_a_day_on_one_gpu_is_an_rma_on_the_third(tmp_path):
    w = World(tmp_path)
    audit = AuditLog(w.config.audit_log)
    for hours_ago in (20, 10):
        audit.write("drain", node="gpu012", checks=["xid-79"], evidence="gpu1 xid=79 count=1",
                    now=time.time() - hours_ago * 3600)
    audit.write("drain", node="gpu012", checks=["xid-79"], evidence="gpu6 xid=79 count=1", now=time.time() - 3600)
    w.slurm.state["gpu012"] = node("gpu012", flags=("DRAIN",), reason="opsctl:xid-79 gpu1 xid=79 count=1")
    audit.write("drain", node="gpu012", checks=["xid-79"], evidence="gpu1 xid=79 count=1")
    assert w.run("remediate") == 0
    assert w.slurm.state["gpu012"].reason == "opsctl:rma gpu1 xid-79 drained 3 times for xid-79 on gpu1 within 1d"
    assert w.slurm.calls[0][0] == "reason"


def test_many_nodes_at_once_trip_the_breaker_and_nothing_is_reset_or_rebooted(tmp_path):
    w = World(tmp_path)
    for i in range(1, 21):
        w.slurm.state[f"gpu{i:03d}"] = node(f"gpu{i:03d}", flags=("DRAIN",),
                                            reason="opsctl:xid-79 gpu0 xid=79 count=1")
    assert w.run("remediate") == 4
    assert w.slurm.calls == [] and "circuit breaker" in w.stderr
    assert {r["detail"] for r in w.audit() if r["event"] == "refuse"} == {"breaker"}


def test_a_persons_drain_a_maintenance_reservation_and_a_hold_are_never_touched(tmp_path):
    xid = "opsctl:xid-79 gpu3 xid=79 count=1"
    w = World(tmp_path, gpu001=node("gpu001", flags=("DRAIN",), reason="bad psu, ticket 42"),
              gpu002=node("gpu002", flags=("DRAIN",), reason="opsctl:manual xid-79 gpu3 swap it"),
              gpu003=node("gpu003", flags=("DRAIN", "MAINT"), reason=xid),
              gpu004=node("gpu004", flags=("DRAIN",), reason=xid))
    assert w.run("hold", "gpu004", "--reason", "vendor on site") == 0
    held = [("reason", ("gpu004",), "opsctl:held xid-79 gpu3 xid=79 count=1")]  # the node reads the hold there
    assert w.run("remediate") == 0 and w.slurm.calls == held
    assert {r["node"]: r["detail"] for r in w.audit() if r["event"] == "refuse"} == {
        "gpu003": "slurm-state: held by Slurm: MAINT", "gpu004": "held: opsctl hold: a person has it"}
    assert w.run("hold", "gpu004", "--release") == 0
    assert w.run("remediate") == 0
    assert w.slurm.calls == [*held, ("reason", ("gpu004",), xid),
                             ("reboot", ("gpu004",), "opsctl:reboot gpu3 xid-79 xid=79 count=1")]
    assert events(w, "gpu004") == ["hold", "refuse", "release", "reboot"]


def test_a_reset_waits_for_the_jobs_and_a_reboot_budget_stops_the_rest(tmp_path):
    xid = "opsctl:xid-79 gpu0 xid=79 count=1"
    busy = node("gpu010", state="mixed", flags=("DRAIN",), reason="opsctl:xid-95 gpu2 xid=95 count=1")
    w = World(tmp_path, gpu010=busy, **{f"gpu02{i}": node(f"gpu02{i}", flags=("DRAIN",), reason=xid) for i in range(3)})
    assert w.run("remediate", "--json") == 4
    doc = json.loads(w.stdout)
    actions = {n["node"]: n["action"] for n in doc["nodes"]}
    assert actions == {"gpu010": "wait", "gpu020": "reboot", "gpu021": "reboot", "gpu022": "skip:budget"}
    assert doc["stop"].startswith("reboot budget spent")


def test_dry_run_says_what_it_would_do_and_changes_nothing(tmp_path):
    w = World(tmp_path, gpu005=node("gpu005", flags=("DRAIN",), reason="opsctl:xid-reset gpu4 xid=46 count=1"))
    assert w.run("remediate", "--dry-run") == 0
    assert "would-reset" in w.stdout and "opsctl:reset gpu4 xid-reset xid=46 count=1" in w.stdout
    assert w.slurm.calls == [] and [r["event"] for r in w.audit()] == ["would-reset"]


def test_at_return_to_service_2_nothing_is_rebooted_and_a_dry_run_says_so(tmp_path):
    w = World(tmp_path, gpu040=node("gpu040", flags=("DRAIN",), reason="opsctl:xid-79 gpu3 xid=79 count=1"),
              gpu007=node("gpu007", flags=("DRAIN",), reason="opsctl:row-remap-pending gpu2 pending=1"))
    w.slurm.return_to_service_value = 2
    for dry_run in (["--dry-run"], []):
        assert w.run("remediate", "--json", *dry_run) == 4
        actions = {n["node"]: n["action"] for n in json.loads(w.stdout)["nodes"]}
        assert actions == {"gpu040": "skip:return-to-service",  # the reset needs no reboot: it goes on
                           "gpu007": "would-reset" if dry_run else "reset"}
    assert [c[0] for c in w.slurm.calls] == ["reason"] and w.slurm.state["gpu040"].reason.startswith("opsctl:xid-79")
    refusals = [r["detail"] for r in w.audit() if r["event"] == "refuse"]
    assert len(refusals) == 2 and all("ReturnToService=2" in d for d in refusals)


def test_no_validation_after_a_reset_leads_to_a_reboot_and_after_a_reboot_to_a_person(tmp_path):
    w = World(tmp_path, gpu030=node("gpu030", flags=("DRAIN",), reason="opsctl:reset gpu1 xid-62"),
              gpu031=node("gpu031", state="down", reason="opsctl:reboot gpu1 xid-79"))
    audit = AuditLog(w.config.audit_log)
    audit.write("reset", node="gpu030", now=time.time() - 3600)
    audit.write("reboot", node="gpu031", now=time.time() - 3600)
    assert w.run("remediate") == 0
    assert w.slurm.state["gpu030"].reason == "opsctl:reboot gpu1 xid-62 no validation 60m after the reset"
    assert w.slurm.state["gpu031"].reason == "opsctl:unvalidated gpu1 xid-79 no validation 60m after the reboot"


def test_the_ladder_reads_its_faults_and_steps_from_opsctls_own_reasons():
    catalog = xid_catalog()
    assert fault_of(node("a", reason="opsctl:xid-79 gpu3 xid=79 count=1"), catalog).action == "reboot"
    assert fault_of(node("a", reason="opsctl:xid-48 gpu3 xid=48 count=1"), catalog).action == "reset"
    assert fault_of(node("a", reason="opsctl:xid-inspect gpu3 xid=54 count=1"), catalog).xid == 54
    assert fault_of(node("a", reason="opsctl:xid-13 gpu3 xid=13 count=1"), catalog) is None  # the application's
    assert fault_of(node("a", reason="opsctl:xid-79,ib-down gpu3 xid=79; mlx5_0"), catalog) is None
    assert fault_of(node("a", reason="opsctl:ib-down mlx5_0 state_id=1"), catalog) is None
    assert fault_of(node("a", reason="opsctl:manual xid-79 gpu3"), catalog) is None
    rung = rung_of(node("a", reason="opsctl:validated-fail gpu5 row-remap-failure after-reboot memory gpu5"))
    assert (rung.step, rung.fault.gpu, rung.fault.rule, rung.after, rung.detail) == \
        ("validated-fail", "gpu5", "row-remap-failure", "reboot", "memory gpu5")


def test_a_node_in_service_with_a_leftover_ladder_reason_is_left_alone(tmp_path):
    """Slurm 24.11 keeps the reason through a resume: an idle node still reads `opsctl:validated-pass ...`."""
    w = World(tmp_path, gpu011=node("gpu011", reason="opsctl:validated-pass gpu3 xid-79 after-reboot pass"),
              gpu012=node("gpu012", state="mixed", reason="opsctl:xid-79 gpu1 xid=79 count=1"))
    assert w.run("remediate", "--json") == 0
    assert json.loads(w.stdout)["nodes"] == [] and w.slurm.calls == []


def test_watch_prints_each_step_made_with_its_time_and_ends_with_exit_0_on_sigterm(tmp_path):
    w = World(tmp_path, gpu040=node("gpu040", flags=("DRAIN",), reason="opsctl:xid-79 gpu3 xid=79 count=1"))
    w.slurm.sigterm_on_read = 4  # in the second round, as systemd stops the unit
    assert w.run("remediate", "--watch", "1") == 0
    # The reboot once; the second round, the node rebooting, prints nothing.
    assert re.fullmatch(rf"{ISO} gpu040 reboot opsctl:reboot gpu3 xid-79 xid=79 count=1\n", w.stdout), w.stdout
    assert [c[0] for c in w.slurm.calls] == ["reboot"]
    w.slurm.sigterm_on_read = w.slurm.reads + 1  # the first read: this round ends, and the watch
    assert w.run("remediate", "--watch", "1", "--json") == 0
    [doc] = map(json.loads, w.stdout.splitlines())
    assert re.fullmatch(ISO, doc["time"]) and doc["nodes"][0]["action"] == "wait"
