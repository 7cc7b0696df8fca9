"""The ladder's power cycle: a reboot that never came back (slurmctld's `reboot timed out` after ResumeTimeout, or
a node still not answering past the step's timeout) is powered off and on through the node's BMC, as a reboot that
spends the reboots' budget and counts for the breaker; the node then validates its whole board as after a reboot.
Without a BMC, or when the power cycle did not bring it back either, it is a person's. Over fakes of opsctl's own
Slurm and PowerControl protocols; the lab tier proves it against real slurmctld and sushy-tools' Redfish BMC."""

import time
from dataclasses import replace

from opsctl.actor.audit import AuditLog
from opsctl.errors import SourceUnavailable
from opsctl.ladder.node_step import due
from tests.unit.fakes import World, node
from tests.unit.test_remediate import events, node_validates

NODE = "gpu040"
BMC = {"bmc": {"protocol": "redfish", "url": "https://{node}-bmc", "system": "1", "user": "opsctl",
               "password_file": "/dev/null"}}


class FakeBmc:
    def __init__(self, fails=False):
        self.cycled, self.fails = [], fails

    def power_cycle(self, node):
        if self.fails:
            raise SourceUnavailable(f"BMC POST https://{node}-bmc/redfish/v1/Systems/1/Actions/"
                                    "ComputerSystem.Reset: HTTP 503")
        self.cycled.append(node)
        return "BMC power cycle: ForceOff, Off after 4s, On, On after 6s"


def rebooted(tmp_path, raw=None, **limits):
    """A node drained for XID 79 and rebooted through Slurm, whose reboot then timed out in slurmctld."""
    raw = {**(raw or {}), "remediation": limits} if limits else raw
    w = World(tmp_path, raw=raw)
    w.prom.breach("xid-79", NODE, "3")
    assert w.run("health", "--drain") == 1
    assert w.run("remediate") == 0 and w.slurm.calls[-1][0] == "reboot"
    timed_out(w, NODE)
    return w


def timed_out(w, name):
    """set_node_down_ptr(node, "reboot timed out"): DOWN, slurmctld's words appended, slurmd not answering."""
    seen = w.slurm.state[name]
    w.slurm.state[name] = replace(seen, state="down", flags=("NOT_RESPONDING",),
                                  reason=f"{seen.reason} : reboot issued : reboot timed out")


def test_a_reboot_that_timed_out_is_power_cycled_then_validated_and_resumed(tmp_path):
    w = rebooted(tmp_path, BMC)
    w.power = FakeBmc()
    assert due(w.slurm.state[NODE]) is None  # it never came back: the node has nothing to validate
    assert w.run("remediate") == 0
    assert w.power.cycled == [NODE]
    reason = w.slurm.state[NODE].reason
    assert reason.startswith("opsctl:power-cycle gpu3 xid-79 the reboot did not come back in "), reason
    assert w.run("remediate") == 0 and w.power.cycled == [NODE]  # under way: nothing more
    # Back: slurmd registered, DOWN with the power cycle's reason; the node checks its whole board.
    w.slurm.state[NODE] = replace(w.slurm.state[NODE], flags=())
    rung = due(w.slurm.state[NODE])
    assert rung is not None and rung.step == "power-cycle"
    node_validates(w, NODE, "pass")
    assert w.slurm.state[NODE].reason.startswith("opsctl:validated-pass gpu3 xid-79 after-power-cycle")
    assert w.run("remediate") == 0 and w.slurm.calls[-1] == ("resume", (NODE,))
    assert events(w, NODE) == ["drain", "reboot", "power-cycle", "resume"]
    record = [r for r in w.audit() if r["event"] == "power-cycle"][0]
    assert "ForceOff, Off after 4s, On, On after 6s" in record["detail"]


def test_a_power_cycle_spends_the_reboot_budget(tmp_path):
    w = rebooted(tmp_path, BMC, max_reboots_per_hour=1)
    w.power = FakeBmc()
    assert w.run("remediate") == 4  # the one reboot of the hour is spent: a safety stop, nothing powered
    assert w.power.cycled == [] and "budget" in w.stdout + w.stderr


def test_without_a_bmc_a_reboot_that_never_came_back_is_a_persons(tmp_path):
    w = rebooted(tmp_path)
    assert w.run("remediate") == 0
    assert w.slurm.state[NODE].reason.startswith(
        "opsctl:unvalidated gpu3 xid-79 the reboot did not come back and no BMC is configured")


def test_a_bmc_that_fails_leaves_the_reboots_reason_and_says_so(tmp_path):
    w = rebooted(tmp_path, BMC)
    before = w.slurm.state[NODE].reason
    w.power = FakeBmc(fails=True)
    assert w.run("remediate") == 3
    assert w.slurm.state[NODE].reason == before
    failed = [r for r in w.audit() if r["event"] == "power-cycle-failed"]
    assert failed and "HTTP 503" in failed[0]["detail"]


def test_a_power_cycle_that_did_not_bring_the_node_back_is_a_persons(tmp_path):
    """Still not answering an hour (remediation.step_timeout) after the power cycle: nothing more to try."""
    w = World(tmp_path, raw=BMC, gpu031=node("gpu031", state="down", flags=("NOT_RESPONDING",),
                                             reason="opsctl:power-cycle gpu1 xid-79 the reboot did not come back"))
    w.power = FakeBmc()
    AuditLog(w.config.audit_log).write("power-cycle", node="gpu031", now=time.time() - 3700)
    assert w.run("remediate") == 0
    assert w.slurm.state["gpu031"].reason == \
        "opsctl:unvalidated gpu1 xid-79 the power cycle did not bring it back in 62m"
    assert w.power.cycled == []
