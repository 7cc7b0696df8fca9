"""The remediation ladder on the provisioned machines: `opsctl health --drain` drains a pending row remap, the
head's `opsctl remediate` asks for a reset, the node's own opsctl-node-check.service (node_check role,
--remediate-self) resets the GPU, runs the diag and answers on its Slurm reason, and the head resumes it.

The simulated lab proves every path of the ladder (tests/integration/lab/test_health_remediation_lab.py);
this proves that the installed pieces take its steps: the units and their configs, the node's Slurm client
and root's rights there, the head's audit log. The service's command is run by hand, its timer stopped,
rather than waited for once a minute; `opsctl remediate` is run by hand because the lab inventory, like the
role's default, does not run it on the health timer.
"""

import json

import pytest

from opsctl_lab.machines.settings import DCGM_PORT, HW_STATE
from tests.integration.provision.support import NEEDS_MACHINES, NEEDS_ROOT, lab_cli, wait_until

pytestmark = [NEEDS_ROOT, NEEDS_MACHINES, pytest.mark.provision]

NODE = "gpu1"
OPSCTL = "/opt/opsctl/bin/opsctl"  # opsctl_venv of the opsctl role
NODE_CHECK_UNIT = "/etc/systemd/system/opsctl-node-check.service"  # node_check role
NODE_CONFIG = "/etc/opsctl/node-check.yaml"  # node_check role: the node's audit log is set there


def remediate(machines) -> dict:
    out = machines.ssh(machines.head, f"{OPSCTL} remediate --json")
    return {n["node"]: n for n in json.loads(out.stdout)["nodes"]}


def health_drain(machines):
    """A health run as the head's timer runs it (test_provision_5_observability.py waits for the timer), for
    this node alone; its state and reason once drained."""
    machines.ssh(machines.head, f"{OPSCTL} health --drain --nodes {NODE}", check=False)
    return machines.drained(NODE)


def test_a_pending_row_remap_is_reset_by_the_nodes_own_service_and_resumed_by_the_head(machines):
    wait_until(lambda: machines.node_state(NODE)[0] == "idle", 90, f"{NODE} idle")
    machines.ssh(NODE, "systemctl stop opsctl-node-check.timer")  # the test takes the node's step itself
    lab_cli("inject", NODE, "row-remap-pending", "--gpu", "2")
    try:
        _, reason = wait_until(lambda: health_drain(machines), 60, f"{NODE} drained", interval=3)
        assert reason.startswith("opsctl:row-remap-pending gpu2"), reason
        assert remediate(machines)[NODE]["action"] == "reset"
        assert machines.node_state(NODE)[1].startswith("opsctl:reset gpu2 row-remap-pending")

        # The installed service's own command, --remediate-self included (a `systemctl start` of it at times
        # fails with 219/CGROUP in the lab's nspawn machines: test_provision_7_storage.py).
        machines.ssh(NODE, f"$(sed -n 's/^ExecStart=//p' {NODE_CHECK_UNIT})")
        assert machines.node_state(NODE)[1] == "opsctl:validated-pass gpu2 row-remap-pending after-reset pass"
        assert remediate(machines)[NODE]["action"] == "resume"
        assert wait_until(lambda: machines.node_state(NODE)[0] == "idle", 60, f"{NODE} back in service")
        # The reset applied the remap: the machine's emulated hardware has no fault left.
        assert json.loads(machines.ssh(NODE, f"cat {HW_STATE}").stdout)["active"] == []
        history = [json.loads(line) for line in machines.on_head(f"{OPSCTL} history {NODE} --json").splitlines()]
        # The head's health timer may run between the resume and this read; on data scraped before the resume
        # it leaves the node alone and says so (plan_drains: resumed-since-data, or slurm-state while a loaded
        # machine's slurmd is late to answer the controller), which is the ladder working.
        left_alone = ("resumed-since-data", "slurm-state")
        steps = [r["event"] for r in history if not (r["event"] == "refuse" and r["detail"].startswith(left_alone))]
        assert steps[-3:] == ["drain", "reset", "resume"], history[-5:]
    finally:
        lab_cli("clear", NODE)
        machines.ssh(NODE, "systemctl start opsctl-node-check.timer")
        if machines.drained(NODE):
            machines.resume(NODE)


# A known defect of the ladder, not of this test: on the lab machines the node's answer after this reboot is refused
# by its own compare and set ("Slurm changed since the plan (now DOWN)"; slurmctld logged "node gpu1 returned to
# service" at the registration), each time it ran; the simulated lab's same path passes
# (test_health_remediation_lab.py). Remove the mark with the fix.
@pytest.mark.xfail(reason="the node's validated answer after a reboot is refused on the lab machines: Slurm's state "
                          "changes under the step after registration", strict=False)
def test_xid_79_reboots_through_slurm_waits_for_the_fabric_validates_and_resumes(machines):
    """XID 79 (the GPU fell off the bus: NVIDIA's catalog says reboot) on a machine whose Fabric Manager takes 60 s
    to train the fabric after a boot, as an HGX board's does. The head drains it and reboots it through Slurm; the
    machine boots with the fault gone, and slurmd registers only once the fabric trained. The node's own step waits
    for the fabric too, checks every GPU (a reboot restarted the whole board), passes, and the head resumes it:
    never opsctl:rma. The node's audit record says how long the step waited. The node check's timer is kept from
    starting at the boot, so that the test takes the step itself once, as the timer would."""
    wait_until(lambda: machines.node_state(NODE)[0] == "idle", 90, f"{NODE} idle")
    machines.ssh(NODE, "systemctl disable --now opsctl-node-check.timer")
    training = json.loads(machines.ssh(NODE, "opsctl-hw show").stdout)["fabric_training_s"]
    machines.ssh(NODE, "opsctl-hw fabric-training 60")
    booted = machines.ssh(NODE, "cat /proc/sys/kernel/random/boot_id").stdout

    def back_from_reboot():
        """Registered again: slurmctld appends "reboot complete" then (sinfo shows a rebooting node DOWN too, and its
        slurmd waits for the fabric before it registers)."""
        state, reason = machines.node_state(NODE)
        new_boot = machines.ssh(NODE, "cat /proc/sys/kernel/random/boot_id", check=False).stdout not in ("", booted)
        return (state, reason) if state == "down" and reason.endswith("reboot complete") and new_boot else None

    lab_cli("inject", NODE, "xid:79", "--gpu", "1")
    try:
        _, reason = wait_until(lambda: health_drain(machines), 90, f"{NODE} drained", interval=3)
        assert reason.startswith("opsctl:xid-79 gpu1"), reason
        assert remediate(machines)[NODE]["action"] == "reboot"
        state, reason = wait_until(back_from_reboot, 300, f"{NODE} back from its reboot")
        assert reason.startswith("opsctl:reboot gpu1 xid-79"), (state, reason)
        ready = machines.ssh(NODE, "journalctl -b -u slurmd -o cat | grep 'opsctl-gpus-ready: GPUs'").stdout
        assert "GPUs ready after" in ready, ready
        machines.ssh(NODE, f"$(sed -n 's/^ExecStart=//p' {NODE_CHECK_UNIT})", timeout=900)
        assert machines.node_state(NODE)[1] == "opsctl:validated-pass gpu1 xid-79 after-reboot pass"
        record = json.loads(machines.ssh(NODE, f"{OPSCTL} history {NODE} --json --config {NODE_CONFIG}")
                            .stdout.splitlines()[-1])
        assert record["event"] == "validated" and "ready after" in record["detail"], record
        assert "diag on GPU 0,1,2,3,4,5,6,7; all-reduce busbw" in record["detail"], record
        assert remediate(machines)[NODE]["action"] == "resume"
        assert wait_until(lambda: machines.node_state(NODE)[0] == "idle", 60, f"{NODE} back in service")
        events = [json.loads(line)["event"] for line in
                  machines.on_head(f"{OPSCTL} history {NODE} --json").splitlines()]
        assert "rma" not in events and events[-3:] == ["drain", "reboot", "resume"], events[-6:]
    finally:
        lab_cli("clear", NODE)
        machines.ssh(NODE, f"opsctl-hw fabric-training {training}", check=False)
        machines.ssh(NODE, "systemctl enable --now opsctl-node-check.timer", check=False)
        if machines.drained(NODE) or machines.node_state(NODE)[0].startswith("down"):
            machines.resume(NODE)


def test_xid_48_is_reset_with_dcgm_stopped_validated_and_resumed_and_the_exporter_serves_again(machines):
    """XID 48 on gpu2 while nv-hostengine (nvidia-dcgm, the lab's DCGM package) and dcgm-exporter run, as they always
    do: each holds every GPU, so the emulated `nvidia-smi -r` refuses while systemd says either is active. The node's
    step stops both, resets, starts them again: the reset ran (validated-pass, not unchecked), both are active
    afterwards and the exporter serves gpu2's metrics again."""
    wait_until(lambda: machines.node_state(NODE)[0] == "idle", 90, f"{NODE} idle")
    units = "nvidia-dcgm dcgm-exporter"
    assert machines.ssh(NODE, f"systemctl is-active {units}").stdout.split() == ["active", "active"]
    machines.ssh(NODE, "systemctl stop opsctl-node-check.timer")
    lab_cli("inject", NODE, "xid:48", "--gpu", "2")
    try:
        _, reason = wait_until(lambda: health_drain(machines), 90, f"{NODE} drained", interval=3)
        assert reason.startswith("opsctl:xid-48 gpu2"), reason
        assert remediate(machines)[NODE]["action"] == "reset"
        machines.ssh(NODE, f"$(sed -n 's/^ExecStart=//p' {NODE_CHECK_UNIT})")
        assert machines.node_state(NODE)[1] == "opsctl:validated-pass gpu2 xid-48 after-reset pass"
        assert machines.ssh(NODE, f"systemctl is-active {units}").stdout.split() == ["active", "active"]
        url = f"http://{machines.addr(NODE)}:{DCGM_PORT}/metrics"
        metrics = f"python3 -c \"import urllib.request; print(urllib.request.urlopen('{url}').read().decode())\""
        wait_until(lambda: 'gpu="2"' in machines.ssh(NODE, metrics, check=False).stdout, 60,
                   "dcgm-exporter serving gpu2 again")
        assert remediate(machines)[NODE]["action"] == "resume"
        assert wait_until(lambda: machines.node_state(NODE)[0] == "idle", 60, f"{NODE} back in service")
    finally:
        lab_cli("clear", NODE)
        machines.ssh(NODE, "systemctl start opsctl-node-check.timer")
        if machines.drained(NODE):
            machines.resume(NODE)
