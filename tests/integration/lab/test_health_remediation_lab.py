"""The remediation ladder on the simulated cluster, end to end, with no person: an XID 79 injected with
`opsctl lab inject`, `opsctl health --drain` acting on it through real Slurm, `opsctl remediate` rebooting
the node through real Slurm (`scontrol reboot ASAP nextstate=DOWN`; the lab's RebootProgram restarts the
node's slurmd with -b and reboots its emulated hardware), the node's own `opsctl node check
--remediate-self` running the emulated `dcgmi diag -j` and answering on its reason, and `opsctl remediate`
resuming it. `opsctl history NODE` shows each step."""

import json
import os
import subprocess
import sys
import time

import pytest
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


def node_check(h, node):
    """The node's timer: `opsctl node check --remediate-self` with the lab node's config and a state directory
    and audit log of its own (a real node keeps them on its own disk), against the lab's Slurm."""
    node_dir = h.lab.lab_dir / "nodes" / node
    config = yaml.safe_load((node_dir / "node-check.yaml").read_text())
    config.update(state_dir=str(h.tmp / node), audit_log=str(h.tmp / node / "audit.jsonl"))
    path = h.tmp / f"{node}.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in h.lab.env.items() if k not in ("OPSCTL_STATE_DIR", "OPSCTL_CONFIG")}
    proc = subprocess.run([sys.executable, "-m", "opsctl", "node", "check", "--remediate-self", "--node", node,
                           "--config", str(path), "--textfile", str(h.tmp / "node-check.prom")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    assert proc.returncode in (0, 1), proc.stderr
    return proc.stdout, [json.loads(line)["event"] for line in (h.tmp / node / "audit.jsonl").read_text().splitlines()]


def test_xid_79_is_drained_rebooted_validated_and_resumed_with_no_person(h):
    started = time.monotonic()
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


def test_a_persons_drain_is_never_reset_or_rebooted(h):
    h.inject(NODE, "xid:79", gpu=3)
    h.touched.add(NODE)
    h.scontrol("update", f"nodename={NODE}", "state=drain", "reason=opsctl:manual xid-79 gpu3 vendor swap")
    proc = h.opsctl("remediate", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["nodes"] == []
    assert h.slurm()[NODE].reason == "opsctl:manual xid-79 gpu3 vendor swap"
