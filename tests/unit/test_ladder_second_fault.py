"""A new fault on a node the remediation ladder holds: the health run audits it, remembers it and adds its GPU and
rule to the ladder's reason (opsctl/health/ladder_reason.py); the ladder's parsers read the lists, and the node's
step resets and validates every GPU listed (opsctl/ladder/node_step.py), answering a pass only when each passed."""

import json
import time

from opsctl.actor.audit import AuditLog
from opsctl.actor.state import State
from opsctl.config import parse_config
from opsctl.health.xid import xid_catalog
from opsctl.ladder.node_step import take_step
from opsctl.ladder.reasons import fault_of, rung_of, step_reason
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.hwtools.nvidia_smi import gpu_serial
from tests.unit.emulated_gpus import NOW, EmulatedGpus
from tests.unit.fakes import FakeSlurm, World, node

ON_THE_LADDER = "opsctl:reboot gpu1 xid-79 xid=79 count=1"


def test_defect_3_a_new_xid_under_the_ladder_is_audited_remembered_and_added_to_the_reason(tmp_path):
    w = World(tmp_path, gpu040=node("gpu040", flags=("DRAIN", "REBOOT_REQUESTED"), reason=ON_THE_LADDER))
    w.prom.breach("xid-48", "gpu040", "3")
    code, nodes, summary = w.json("--drain")
    reason = "opsctl:reboot gpu1,gpu3 xid-79,xid-48 xid=79 count=1; gpu3 xid=48 count=1"
    assert nodes["gpu040"]["action"] == "escalate" and summary["escalated"] == 1
    assert w.slurm.calls == [("reason", ("gpu040",), reason)]
    [record] = w.audit()
    assert (record["event"], record["node"], record["checks"]) == ("escalate", "gpu040", ["xid-48"])
    assert "gpu3 xid=48" in record["evidence"] and record["detail"] == "new fault under the ladder: gpu3 xid-48"
    [handled] = State(w.tmp / "state").handled.load().records
    assert (handled.rule, handled.device, handled.settled) == ("xid-48", "gpu3", True)
    w.json("--drain")  # the next run: the same XID is in the reason and in memory, nothing is added again
    assert len(w.slurm.calls) == 1 and len(w.audit()) == 1
    rung = rung_of(w.slurm.state["gpu040"])
    assert rung.step == "reboot" and rung.fault.gpus == ("gpu1", "gpu3") and rung.fault.rules == ("xid-79", "xid-48")


def test_defect_3_a_pass_that_did_not_check_the_new_gpu_is_no_pass_any_more(tmp_path):
    passed = "opsctl:validated-pass gpu1 xid-48 after-reset pass"
    w = World(tmp_path, gpu040=node("gpu040", flags=("DRAIN",), reason=passed))
    w.prom.breach("xid-79", "gpu040", "3")
    w.json("--drain")
    [(_, _, reason)] = w.slurm.calls
    assert reason == "opsctl:validated-unchecked gpu1,gpu3 xid-48,xid-79 after-reset new fault under the ladder: " \
                     "gpu3 xid=79 count=1"


def test_defect_3_the_ladder_takes_every_gpu_an_entry_drain_names():
    catalog = xid_catalog()
    # The same XID on two GPUs at once: the ladder validates both, not the first alone.
    two = fault_of(node("a", flags=("DRAIN",), reason="opsctl:xid-79 gpu1 xid=79 count=1; gpu3 xid=79 count=1"),
                   catalog)
    assert step_reason("reboot", two, "x") == "opsctl:reboot gpu1,gpu3 xid-79 x"
    entry = fault_of(node("gpu040", flags=("DRAIN",), reason="opsctl:xid-48 gpu1 xid=48 count=1"), catalog)
    assert (entry.gpus, entry.action) == (("gpu1",), "reset")
    both = fault_of(node("gpu040", flags=("DRAIN",), reason="opsctl:xid-48,xid-79 gpu1 xid=48 count=1; gpu3 xid=79 "
                         "count=1"), catalog)
    assert (both.gpus, both.rules, both.action) == (("gpu1", "gpu3"), ("xid-48", "xid-79"), "reboot")
    assert step_reason("reboot", both, "x") == "opsctl:reboot gpu1,gpu3 xid-48,xid-79 x"
    # A reason cut short cannot name every GPU: a person's.
    assert fault_of(node("a", flags=("DRAIN",), reason="opsctl:xid-79 gpu1 xid=79 count=1; gpu3 xid=7..."),
                    catalog) is None


def test_defect_3_an_entry_drain_gains_the_new_gpus_evidence(tmp_path):
    w = World(tmp_path, gpu040=node("gpu040", flags=("DRAIN",), reason="opsctl:xid-48 gpu1 xid=48 count=1"))
    w.prom.breach("xid-79", "gpu040", "3")
    w.json("--drain")
    assert w.slurm.calls == [("reason", ("gpu040",), "opsctl:xid-48,xid-79 gpu1 xid=48 count=1; gpu3 xid=79 count=1")]


def _two_gpu_node(tmp_path, reason, state="down", flags=()):
    config = parse_config({}, "t", {"OPSCTL_STATE_DIR": str(tmp_path / "state")})
    hw = NodeHardware(node="gpu007")
    hw.inject("row-remap-failure", gpu=3, now=NOW - 60)  # sticky: gpu3's diagnostics fail
    slurm = FakeSlurm({"gpu007": node("gpu007", state=state, flags=flags, reason=reason)})
    return config, slurm, EmulatedGpus(hw)


def test_defect_3_the_node_validates_every_gpu_listed_and_fails_on_the_second(tmp_path):
    config, slurm, gpus = _two_gpu_node(tmp_path, "opsctl:reset gpu1,gpu3 xid-48,row-remap-pending xid=48 count=1",
                                        "idle", ("DRAIN",))
    step = take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    assert any(call.startswith("diag -r 2 -j -i 1,3") for call in gpus.calls), gpus.calls
    assert step.reason.startswith(f"opsctl:validated-fail gpu1,gpu3 xid-48,row-remap-pending after-reset serial="
                                  f"{gpu_serial('gpu007', 3)} fail")
    [record] = [json.loads(line) for line in (tmp_path / "state" / "audit.jsonl").read_text().splitlines()]
    assert record["checks"] == ["xid-48", "row-remap-pending"] and record["evidence"] == "gpu1,gpu3"


def test_defect_3_a_reset_asked_for_two_gpus_resets_both(tmp_path):
    config, slurm, gpus = _two_gpu_node(tmp_path, "opsctl:reset gpu1,gpu3 xid-48 xid=48 count=1", "idle", ("DRAIN",))
    take_step(config, slurm, "gpu007", True, "", run=gpus, now=NOW, pace=gpus)
    assert [c for c in gpus.calls if c.startswith("-r")] == ["-r -i 1", "-r -i 3"]


def test_defect_3_a_persons_step_keeps_its_reason(tmp_path):
    rma = "opsctl:rma gpu1 xid-79 failed its checks after the reboot: serial=1650924123456"
    w = World(tmp_path, gpu040=node("gpu040", flags=("DRAIN",), reason=rma))
    w.prom.breach("xid-48", "gpu040", "3")
    _, nodes, _ = w.json("--drain")
    assert nodes["gpu040"]["action"] == "skip:already-drained" and w.slurm.calls == []


def test_defect_3_a_fault_a_reset_does_not_clear_that_joins_a_reset_takes_the_node_to_a_reboot(tmp_path):
    joined = "opsctl:reset gpu1,gpu3 xid-48,xid-79 xid=48 count=1; gpu3 xid=79 count=1"
    w = World(tmp_path, gpu040=node("gpu040", flags=("DRAIN",), reason=joined))
    assert w.run("remediate") == 0
    [(event, names, reason)] = w.slurm.calls
    assert (event, names) == ("reboot", ("gpu040",))
    assert reason.startswith("opsctl:reboot gpu1,gpu3 xid-48,xid-79 reset: a fault a reset does not clear")


def test_defect_3_a_fault_that_joined_under_the_ladder_counts_towards_rma_on_its_gpu(tmp_path):
    w = World(tmp_path)
    audit = AuditLog(w.config.audit_log)
    for hours_ago in (20, 10):  # XID 48 joined gpu3 twice today while gpu1's XID 79 had the node on the ladder
        audit.write("escalate", node="gpu040", checks=["xid-48"], now=time.time() - hours_ago * 3600,
                    evidence="gpu1,gpu3 xid-79,xid-48 xid=79 count=1; gpu3 xid=48 count=1")
    w.slurm.state["gpu040"] = node("gpu040", flags=("DRAIN",), reason="opsctl:xid-48 gpu3 xid=48 count=1")
    audit.write("drain", node="gpu040", checks=["xid-48"], evidence="gpu3 xid=48 count=1")
    assert w.run("remediate") == 0
    assert w.slurm.state["gpu040"].reason == "opsctl:rma gpu3 xid-48 drained 3 times for xid-48 on gpu3 within 1d"
