"""The remediation ladder on the simulated cluster, end to end, with no person: an XID 79 injected with
`opsctl lab inject`, `opsctl health --drain` acting on it through real Slurm, `opsctl remediate` rebooting
the node through real Slurm (`scontrol reboot ASAP nextstate=DOWN`; the lab's RebootProgram restarts the
node's slurmd with -b and reboots its emulated hardware), the node's own `opsctl node check
--remediate-self` running the emulated `dcgmi diag -j` and answering on its reason, and `opsctl remediate`
resuming it. `opsctl history NODE` shows each step."""

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import requests
import yaml

from tests.integration.lab.health_support import HealthLab

pytestmark = pytest.mark.lab
NODE = "gpu043"  # the health tests' range; their table module (test_health_lab.py, run before) has cleared it
LADDER_MINUTES = 5


@pytest.fixture
def h(lab, tmp_path):
    helper = HealthLab(lab, tmp_path)
    yield helper
    helper.cleanup()


def node_check(h, node, **settings):
    """The node's timer: `opsctl node check --remediate-self` with the lab node's config (and `settings` over it)
    and a state directory and audit log of its own (a real node keeps them on its own disk), against the lab's
    Slurm."""
    node_dir = h.lab.lab_dir / "nodes" / node
    config = yaml.safe_load((node_dir / "node-check.yaml").read_text())
    config.update(state_dir=str(h.tmp / node), audit_log=str(h.tmp / node / "audit.jsonl"), **settings)
    path = h.tmp / f"{node}.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in h.lab.env.items() if k not in ("OPSCTL_STATE_DIR", "OPSCTL_CONFIG")}
    proc = subprocess.run([sys.executable, "-m", "opsctl", "node", "check", "--remediate-self", "--node", node,
                           "--config", str(path), "--textfile", str(h.tmp / "node-check.prom")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    assert proc.returncode in (0, 1), proc.stderr
    audit = h.tmp / node / "audit.jsonl"
    return proc.stdout, [json.loads(line)["event"] for line in audit.read_text().splitlines()] if audit.exists() else []


def node_records(h, node):
    """The node's own audit log (`opsctl history` on the node), as node_check keeps it."""
    return [json.loads(line) for line in (h.tmp / node / "audit.jsonl").read_text().splitlines()]


def fabric_training(h, node, seconds):
    """How long the node's emulated Fabric Manager trains its GPUs after a boot or a reset; returns the old."""
    path = h.lab.lab_dir / "nodes" / node / "hardware.json"
    raw = json.loads(path.read_text())
    old, raw["fabric_training_s"] = raw.get("fabric_training_s"), seconds
    path.write_text(json.dumps(raw))
    return old


def test_xid_79_is_drained_rebooted_validated_and_resumed_with_no_person(h):
    started = time.monotonic()
    trained = fabric_training(h, NODE, 12.0)  # a board whose fabric trains for a while after the boot
    try:
        xid_79_ladder(h, started)
    finally:
        fabric_training(h, NODE, trained)


def xid_79_ladder(h, started):
    h.inject(NODE, "xid:79", gpu=3)
    h.wait_statuses(NODE, {NODE: "fail"}, {NODE: "xid-79"})
    _, nodes = h.health_json("--drain", "--nodes", NODE)
    assert nodes[NODE]["action"] == "drain" and h.slurm()[NODE].reason == "opsctl:xid-79 gpu3 xid=79 count=1"

    remediated = h.opsctl("remediate", "--json")
    assert remediated.returncode == 0, remediated.stderr
    assert [(n["node"], n["action"]) for n in json.loads(remediated.stdout)["nodes"]] == [(NODE, "reboot")]
    back = h.lab.wait_until(lambda: h.slurm()[NODE].back_from_reboot and h.slurm()[NODE], 90,
                            "the node to come back from its reboot", interval=1)
    assert back.state == "down" and back.reason.startswith("opsctl:reboot gpu3 xid-79")

    answered, node_audit = node_check(h, NODE)
    assert "checked: pass" in answered and node_audit == ["validated"], answered
    assert h.slurm()[NODE].reason == "opsctl:validated-pass gpu3 xid-79 after-reboot pass"
    # It waited for the fabric before its diag (a diag before it would have failed every GPU), then checked all 8,
    # then ran nccl-tests' all-reduce over them.
    waited = re.fullmatch(r"pass; ready after (\d+)s; diag on GPU 0,1,2,3,4,5,6,7; all-reduce busbw \d+GB/s",
                          node_records(h, NODE)[0]["detail"])
    assert waited and int(waited.group(1)) >= 1, node_records(h, NODE)
    assert h.opsctl("remediate").returncode == 0
    # Resumed: idle, and responding once slurmctld's next ping reaches the restarted slurmd.
    after = h.lab.wait_until(lambda: not h.slurm()[NODE].out_of_service and h.slurm()[NODE], 60,
                             "the node back in service", interval=1)
    assert after.state == "idle" and after.reason == "", after
    assert time.monotonic() - started < LADDER_MINUTES * 60

    history = h.opsctl("history", NODE, "--json")
    assert [json.loads(line)["event"] for line in history.stdout.splitlines()] == ["drain", "reboot", "resume"]
    table = h.opsctl("history", NODE).stdout
    assert "reboot" in table and "validated after the reboot" in table


def test_a_fabric_that_never_trains_after_the_reboot_is_a_persons_never_rma(h):
    node = "gpu055"
    assert drained_by_health(h, node, "xid:79", 3, "xid-79").startswith("opsctl:xid-79 gpu3")
    assert remediate(h)[node]["action"] == "reboot"
    h.lab.wait_until(lambda: h.slurm()[node].back_from_reboot, 90, "the node back from its reboot", interval=1)
    h.inject(node, "fabric-stuck", gpu=3)  # Fabric Manager never finishes this GPU's training
    answered, node_audit = node_check(h, node, remediation={"ready_timeout": "10s"})
    assert node_audit == ["validated"], answered
    # The wait ends with the query that passes its bound: 10 s and that query's time (seconds on a loaded machine).
    waited = r"not ready after (1[0-9])s: fabric In Progress on GPU 3"
    assert re.fullmatch(rf"opsctl:validated-unchecked gpu3 xid-79 after-reboot {waited}", h.slurm()[node].reason)
    assert not (h.tmp / node / "validation").exists()  # no diag ran: nothing failed
    assert remediate(h)[node]["action"] == "unvalidated"
    assert re.fullmatch(rf"opsctl:unvalidated gpu3 xid-79 the checks could not run after the reboot: {waited}",
                        h.slurm()[node].reason)
    assert events(h, node) == ["drain", "reboot", "unvalidated"]


def drained_by_health(h, node, fault, gpu, rule):
    """The fault injected, then drained by `opsctl health --drain` for `rule`; returns the drain's reason."""
    h.inject(node, fault, gpu=gpu)
    h.wait_statuses(node, {node: "fail"}, {node: rule})
    _, nodes = h.health_json("--drain", "--nodes", node)
    assert nodes[node]["action"] == "drain", nodes[node]
    return h.slurm()[node].reason


def remediate(h, expected_rc=0):
    proc = h.opsctl("remediate", "--json")
    assert proc.returncode == expected_rc, proc.stderr
    return {n["node"]: n for n in json.loads(proc.stdout)["nodes"]}


def hardware(h, node):
    return json.loads((h.lab.lab_dir / "nodes" / node / "hardware.json").read_text())


def events(h, node):
    return [json.loads(line)["event"] for line in h.opsctl("history", node, "--json").stdout.splitlines()]


def test_a_pending_row_remap_is_reset_validated_and_resumed_without_a_reboot(h):
    node = "gpu044"
    booted = hardware(h, node)["booted"]
    assert drained_by_health(h, node, "row-remap-pending", 2, "row-remap-pending").startswith(
        "opsctl:row-remap-pending gpu2")
    assert remediate(h)[node]["action"] == "reset"
    assert h.slurm()[node].reason.startswith("opsctl:reset gpu2 row-remap-pending")
    answered, node_audit = node_check(h, node)
    assert "reset of gpu2 checked: pass" in answered and node_audit == ["validated"], answered
    assert h.slurm()[node].reason == "opsctl:validated-pass gpu2 row-remap-pending after-reset pass"
    assert remediate(h)[node]["action"] == "resume"
    after = h.lab.wait_until(lambda: not h.slurm()[node].out_of_service and h.slurm()[node], 60,
                             "the node back in service", interval=1)  # responding, after a lab reset too
    assert after.state == "idle" and after.reason == "", after
    # The reset applied the remap: the fault is gone; the node never rebooted.
    assert hardware(h, node)["active"] == [] and hardware(h, node)["booted"] == booted
    assert events(h, node) == ["drain", "reset", "resume"]
    # DCGM's host engine and dcgm-exporter were stopped for the reset (the emulated nvidia-smi -r refuses while
    # they hold the GPU), started again after it, and the exporter serves the GPU's metrics again.
    assert hardware(h, node)["monitoring"] == {"nvidia-dcgm": True, "dcgm-exporter": True}
    assert h.lab.wait_until(lambda: 'gpu="2"' in dcgm_metrics(h, node), 30, "dcgm-exporter answering", interval=1)
    assert re.fullmatch(r"pass; ready after \d+s; diag on GPU 2", node_records(h, node)[0]["detail"])


def dcgm_metrics(h, node):
    try:
        with urllib.request.urlopen(f"http://{h.lab.address(node)}:9400/metrics", timeout=5) as answer:
            return answer.read().decode()
    except OSError:
        return ""


def test_a_sticky_row_remap_failure_goes_from_reset_and_reboot_to_rma_with_the_gpus_serial_and_stays(h):
    node = "gpu045"
    drained_by_health(h, node, "row-remap-failure", 5, "row-remap-failure")
    assert remediate(h)[node]["action"] == "reset"
    answered, _ = node_check(h, node)
    assert "reset of gpu5 checked: fail" in answered, answered
    assert remediate(h)[node]["action"] == "reboot"
    h.lab.wait_until(lambda: h.slurm()[node].back_from_reboot, 90, "the node back from its reboot", interval=1)
    answered, node_audit = node_check(h, node)
    assert "reboot of gpu5 checked: fail" in answered and node_audit == ["validated", "validated"], answered
    assert remediate(h)[node]["action"] == "rma"
    serial = nvidia_smi_serial(h, node, 5)
    reason = h.slurm()[node].reason
    assert reason.startswith(f"opsctl:rma gpu5 row-remap-failure failed its checks after the reboot: serial={serial}")
    [bundle] = (h.state / "rma").iterdir()
    summary = json.loads((bundle / "summary.json").read_text())
    assert (summary["node"], summary["gpu"], summary["gpu_serial"]) == (node, "gpu5", serial)
    history = [json.loads(line)["event"] for line in (bundle / "history.jsonl").read_text().splitlines()]
    assert history == ["drain", "reset", "reboot", "rma"]
    # The node kept the failing diag's JSON and nvidia-smi -q with the same serial, after each step.
    kept = sorted((h.tmp / node / "validation").iterdir())
    assert [d.name.rsplit("-", 1)[1] for d in kept] == ["reset", "reboot"]
    assert re.search(rf"Serial Number\s+: {serial}\n", (kept[1] / "nvidia-smi-q.txt").read_text())
    assert json.loads((kept[1] / "dcgmi-diag.json").read_text())["DCGM Diagnostic"]
    for _ in range(2):  # later runs, the ladder's, the node's and the health run's, leave it as it is
        assert remediate(h)[node]["action"] == "skip:rma"
        node_check(h, node)
        h.health_json("--drain", "--resume", "--nodes", node)
    assert h.slurm()[node].reason == reason and events(h, node)[-1] == "rma"


def test_the_same_xid_on_one_gpu_three_times_in_a_day_goes_to_rma_on_the_third(h):
    node, fault = "gpu046", "opsctl:xid-48 gpu3 xid=48"
    for count in (1, 2):  # drained, reset, validated and resumed, twice
        assert drained_by_health(h, node, "xid:48", 3, "xid-48") == f"{fault} count={count}"
        assert remediate(h)[node]["action"] == "reset"
        answered, _ = node_check(h, node)
        assert "reset of gpu3 checked: pass" in answered, answered
        assert remediate(h)[node]["action"] == "resume"
        h.lab.wait_until(lambda: not h.slurm()[node].out_of_service, 60, "the node back in service", interval=1)
    # The reset ended each XID, but dcgm-exporter's window still counts it: the third reads count=3.
    assert drained_by_health(h, node, "xid:48", 3, "xid-48") == f"{fault} count=3"
    decided = remediate(h)[node]
    assert decided["action"] == "rma", decided
    rma = "opsctl:rma gpu3 xid-48 drained 3 times for xid-48 on gpu3 within 1d"
    assert h.slurm()[node].reason == rma
    assert events(h, node) == ["drain", "reset", "resume"] * 2 + ["drain", "rma"]
    # Nothing automatic touches it again.
    assert remediate(h).get(node, {}).get("action") in (None, "skip:rma")
    assert h.slurm()[node].reason == rma and events(h, node)[-1] == "rma"


def nvidia_smi_serial(h, node, gpu):
    """The GPU's serial as the node's nvidia-smi says it."""
    nvidia_smi = yaml.safe_load((h.lab.lab_dir / "nodes" / node / "node-check.yaml").read_text())["gpu"]["nvidia_smi"]
    proc = subprocess.run([nvidia_smi, "--query-gpu=serial", "--format=csv,noheader", "-i", str(gpu)],
                          capture_output=True, text=True, timeout=30, env={**os.environ, **h.lab.env}, check=True)
    return proc.stdout.strip()


def test_xid_79_on_20_of_64_nodes_at_once_trips_the_breaker_and_nothing_is_reset_or_rebooted(h):
    # Not gpu036: the health table's DBE there stays a new DBE for its 10 m hold (the counter keeps its
    # value after the fault ends, as a GPU's does until its driver reloads), so it would name two rules.
    scope = "gpu[033-035,037-053]"
    nodes = [f"gpu{i:03d}" for i in [*range(33, 36), *range(37, 54)]]
    h.inject_many(nodes, "xid:79", gpu=0)
    h.wait_statuses(scope, dict.fromkeys(nodes, "fail"))
    # The health run's own breaker stops the drains; a site that raised its limits has them all drained.
    assert h.health_json("--drain", "--nodes", scope)[0] == 4
    raw = yaml.safe_load(h.config.read_text())
    loose = {"breaker_min_nodes": 64, "max_drains_per_run": 20, "max_drains_per_hour": 20,
             "max_out_of_service_fraction": 1.0}
    h.config.write_text(yaml.safe_dump({**raw, "safety": loose}))
    h.health_json("--drain", "--nodes", scope)
    assert {h.slurm()[n].reason for n in nodes} == {"opsctl:xid-79 gpu0 xid=79 count=1"}
    # The ladder's breaker, at the default limits: 20 reboots at once is a shared cause, not 20 GPUs.
    h.config.write_text(yaml.safe_dump(raw))
    decided = remediate(h, expected_rc=4)
    assert {decided[n]["action"] for n in nodes} == {"skip:breaker"}
    after = h.slurm()
    drained = ("IDLE+DRAIN", "opsctl:xid-79 gpu0 xid=79 count=1")
    assert {(after[n].state_text, after[n].reason) for n in nodes} == {drained}
    assert {r["event"] for r in h.audit() if r.get("node") in nodes} == {"drain", "refuse"}


def test_a_persons_drain_a_maintenance_reservation_and_a_hold_are_never_touched(h):
    xid = "opsctl:xid-48 gpu3 xid=48 count=1"  # a reset's fault: handed back, the step is a reason, no reboot
    person, maint, held = "gpu047", "gpu048", "gpu049"
    h.inject_many([person, maint, held], "xid:48", gpu=3)
    # As `opsctl health --drain` would have drained them, and a person took the first over.
    h.scontrol("update", f"nodename={person}", "state=drain", "reason=opsctl:manual xid-48 gpu3 vendor swap")
    h.scontrol("update", f"nodename={maint},{held}", "state=drain", f"reason={xid}")
    h.scontrol("create", "reservation", "reservationname=opsctl-ladder-maint", "starttime=now", "duration=10",
               f"nodes={maint}", "flags=maint", "users=root")
    try:  # slurmctld marks the node MAINTENANCE+RESERVED within a second of the reservation (measured)
        h.lab.wait_until(lambda: "MAINTENANCE" in h.slurm()[maint].flags, 10, "the reservation on the node")
        assert h.opsctl("hold", held, "--reason", "vendor on site").returncode == 0
        decided = remediate(h)
        assert person not in decided, decided  # a person's drain is not on the ladder at all
        assert decided[held]["action"] == "skip:held" and decided[maint]["action"] == "skip:slurm-state"
        nodes = h.slurm()
        assert nodes[person].reason == "opsctl:manual xid-48 gpu3 vendor swap"
        assert nodes[maint].reason == xid and nodes[held].reason == "opsctl:held xid-48 gpu3 xid=48 count=1"
    finally:
        h.scontrol("delete", "reservationname=opsctl-ladder-maint")
    assert h.opsctl("hold", held, "--release").returncode == 0
    assert remediate(h)[held]["action"] == "reset"  # handed back: the ladder takes it
    assert events(h, held) == ["hold", "refuse", "release", "reset"]


def test_a_hold_while_the_reason_asks_for_a_reset_reaches_the_node_which_runs_no_reset(h):
    """The hold is in the node's Slurm reason, the one thing the node reads: its timer's `node check
    --remediate-self` takes no step while it is there, and takes the step once it is released."""
    node = "gpu050"  # test_health_lab.py's, cleared by its module
    drained_by_health(h, node, "row-remap-pending", 1, "row-remap-pending")
    assert remediate(h)[node]["action"] == "reset"
    asked = h.slurm()[node].reason
    assert asked.startswith("opsctl:reset gpu1 row-remap-pending")
    assert h.opsctl("hold", node, "--reason", "vendor on site").returncode == 0
    assert h.slurm()[node].reason == "opsctl:held " + asked.removeprefix("opsctl:")
    answered, node_audit = node_check(h, node)
    assert f"nothing asked of {node}" in answered and node_audit == [], answered
    assert [f["fault"] for f in hardware(h, node)["active"]] == ["row-remap-pending"]  # no reset ended it
    assert h.opsctl("hold", node, "--release").returncode == 0
    assert h.slurm()[node].reason == asked
    answered, node_audit = node_check(h, node)
    assert "reset of gpu1 checked: pass" in answered and node_audit == ["validated"], answered
    assert hardware(h, node)["active"] == []
    assert remediate(h)[node]["action"] == "resume"
    assert events(h, node) == ["drain", "reset", "hold", "release", "resume"]


def test_a_reboot_that_hangs_is_power_cycled_through_the_bmc_validated_and_resumed(h):
    """XID 79 on a node whose graceful reboot never finishes (`reboot-hang`): slurmctld gives up after ResumeTimeout
    (60 s in the lab) and appends `reboot timed out`; `opsctl remediate` power-cycles the node through its BMC, the
    lab's real Redfish emulator (sushy-tools), whose power on boots the node's emulated board and slurmd; the node
    checks its whole board as after a reboot, and the head resumes it. Never RMA."""
    node = "gpu064"
    # .ci/run installs sushy-tools (the `test` extra): a lab without it is someone's own, started without it.
    if "bmc" not in yaml.safe_load((h.lab.lab_dir / "opsctl.yaml").read_text()):
        pytest.skip("the lab has no BMC (sushy-emulator is not installed)")
    try:
        power_cycled_and_back(h, node)
    finally:  # powered on whatever happened, so that the lab's later tests have all 64 nodes
        power_on(h, node)


def power_cycled_and_back(h, node):
    assert drained_by_health(h, node, "xid:79", 1, "xid-79").startswith("opsctl:xid-79 gpu1")
    h.inject(node, "reboot-hang")
    assert remediate(h)[node]["action"] == "reboot"
    timed_out = h.lab.wait_until(lambda: h.slurm()[node].reboot_timed_out and h.slurm()[node], 150,
                                 "slurmctld to give up on the reboot", interval=2)
    assert timed_out.state == "down" and timed_out.reason.startswith("opsctl:reboot gpu1 xid-79"), timed_out
    assert remediate(h)[node]["action"] == "power-cycle"
    assert h.slurm()[node].reason.startswith("opsctl:power-cycle gpu1 xid-79 the reboot did not come back in")
    h.lab.wait_until(lambda: h.slurm()[node].back_from_reboot, 90, "the node back from its power cycle", interval=1)
    answered, node_audit = node_check(h, node)
    assert node_audit == ["validated"], answered
    assert h.slurm()[node].reason == "opsctl:validated-pass gpu1 xid-79 after-power-cycle pass"
    assert "diag on GPU 0,1,2,3,4,5,6,7" in node_records(h, node)[0]["detail"]
    assert remediate(h)[node]["action"] == "resume"
    assert events(h, node) == ["drain", "reboot", "power-cycle", "resume"]
    cycled = [json.loads(line) for line in h.opsctl("history", node, "--json").stdout.splitlines()][2]
    assert re.search(r"BMC power cycle: ForceOff, Off after \d+s, On, On after \d+s", cycled["detail"]), cycled


def power_on(h, node):
    """The node's power on through the lab's BMC (a no-op for a node that is on)."""
    bmc = yaml.safe_load((h.lab.lab_dir / "opsctl.yaml").read_text())["bmc"]
    secret = Path(bmc["password_file"]).read_text().strip()
    system, auth = f"{bmc['url']}/redfish/v1/Systems/{node}", (bmc["user"], secret)
    requests.post(f"{system}/Actions/ComputerSystem.Reset", json={"ResetType": "On"}, auth=auth, timeout=10)
    # The emulator applies the action on a read, 1 to 11 s later.
    h.lab.wait_until(lambda: requests.get(system, auth=auth, timeout=10).json().get("PowerState") == "On", 30,
                     f"{node} powered on", interval=1)
