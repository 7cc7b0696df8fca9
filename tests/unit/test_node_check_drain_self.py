"""`opsctl node check --drain-self` over a fake of the Slurm protocol: the node drains itself for its own
failed checks, never for a failure shaped like a shared cause, never past the cluster's out-of-service
limit, and resumes only a drain that names node-check alone, each after re-reading the node (compare and
set). The lab tier runs the same command against real Slurm on every node at once."""

import json
import subprocess
from dataclasses import replace

from opsctl.actor.audit import AuditLog
from opsctl.config import parse_config
from opsctl.errors import ExitCode
from opsctl.ib.check import h200_ndr, judge
from opsctl.ib.collect import live_snapshot
from opsctl.nodecheck import REASON_PREFIX, CheckResult, drain_self, results
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.ib_sysfs import write_tree
from tests.unit.fakes import FakeSlurm, gpu_nodes, node

T0 = 1_800_000_000.0
PASSING = [CheckResult("ib-port-state", "node", False)]


def checked(tmp_path, *faults, firmware=None):
    """(results, report) of gpu007's emulated sysfs tree with the faults injected."""
    hw = NodeHardware(node="gpu007")
    for fault, hca in faults:
        hw.inject(fault, hca=hca, now=T0)
    write_tree(tmp_path / "sys", hw, now=T0)
    report = judge(live_snapshot(tmp_path / "sys"), h200_ndr(firmware=firmware))
    return results(report), report


def self_check(*args):
    """(exit code, the line it printed) of one --drain-self."""
    outcome = drain_self(*args)
    return outcome.exit_code, "\n".join(outcome.lines)


def config_for(tmp_path, raw=None):
    return parse_config(raw or {}, "t", env={"OPSCTL_STATE_DIR": str(tmp_path / "state")})


def test_a_failing_node_drains_itself_once_and_resumes_itself_when_it_passes(tmp_path):
    config = config_for(tmp_path)
    slurm = FakeSlurm(gpu_nodes(64))
    failing, report = checked(tmp_path, ("ib-down", "mlx5_2"))
    code, line = self_check(config, slurm, "gpu007", failing, report)
    assert code == ExitCode.FAILING
    assert slurm.nodes()["gpu007"].reason == f"{REASON_PREFIX} ib-port-state mlx5_2"
    assert line == f"drained gpu007: {REASON_PREFIX} ib-port-state mlx5_2"
    assert self_check(config, slurm, "gpu007", failing, report)[1].startswith("gpu007 stays drained")
    assert self_check(config, slurm, "gpu007", PASSING) == (ExitCode.OK, "resumed gpu007: every node check passes")
    assert not slurm.nodes()["gpu007"].drained
    events = [(r["event"], r["checks"]) for r in AuditLog(config.audit_log).read()[0]]
    assert events == [("drain", ["node-check"]), ("resume", ["node-check"])]


def test_a_drain_someone_else_set_is_left_alone_either_way(tmp_path):
    config = config_for(tmp_path)
    slurm = FakeSlurm(gpu_nodes(64, gpu007=node("gpu007", flags=["DRAIN"], reason="ticket-123 bad dimm")))
    failing, report = checked(tmp_path, ("ib-down", "mlx5_2"))
    assert self_check(config, slurm, "gpu007", failing, report)[1].startswith("gpu007 left alone")
    assert self_check(config, slurm, "gpu007", PASSING) == (ExitCode.OK, "")
    assert slurm.nodes()["gpu007"].reason == "ticket-123 bad dimm" and slurm.calls == []


def test_a_drain_that_names_another_rule_too_is_never_resumed_by_a_passing_self_check(tmp_path):
    """`opsctl health` joins rule ids: node-check and an XID 79 on the same node need a person."""
    config = config_for(tmp_path)
    reason = "opsctl:node-check,xid-79 ib-port-state mlx5_2; gpu 3 xid 79"
    slurm = FakeSlurm(gpu_nodes(64, gpu007=node("gpu007", flags=["DRAIN"], reason=reason)))
    assert self_check(config, slurm, "gpu007", PASSING) == (ExitCode.OK, "")
    assert slurm.nodes()["gpu007"].reason == reason and slurm.calls == []


def test_a_storage_check_never_drains_the_node_itself_and_still_fails(tmp_path):
    """A storage outage fails every node at once: only `opsctl health` and its breaker may act on it."""
    config = config_for(tmp_path)
    slurm = FakeSlurm(gpu_nodes(64))
    found, report = checked(tmp_path)
    storage = [CheckResult("lustre-import-down", "lustre-OST0002", True), CheckResult("storage-mount-hung", "/home",
                                                                                      True)]
    code, line = self_check(config, slurm, "gpu007", found + storage, report)
    assert code == ExitCode.FAILING and line.startswith("gpu007 not drained: lustre-import-down lustre-OST0002")
    assert "opsctl health" in line and slurm.calls == []


def test_every_rail_in_init_is_the_subnet_manager_and_drains_no_node(tmp_path):
    config = config_for(tmp_path)
    slurm = FakeSlurm(gpu_nodes(64))
    found, report = checked(tmp_path, ("sm-down", None))
    assert any(r.failed and r.check == "ib-port-state" for r in found)
    code, line = self_check(config, slurm, "gpu007", found, report)
    assert code == ExitCode.FAILING and "every rail is INIT" in line and line.startswith("gpu007 not drained")
    assert slurm.calls == []


def test_one_rail_down_among_active_ones_is_the_nodes_own_fault(tmp_path):
    """The shared-cause shape is every rail in one state: one DOWN rail still drains."""
    slurm = FakeSlurm(gpu_nodes(64))
    found, report = checked(tmp_path, ("ib-down", "mlx5_2"))
    assert self_check(config_for(tmp_path), slurm, "gpu007", found, report)[1].startswith("drained gpu007")


def test_a_firmware_off_the_pinned_one_or_a_missing_module_drains_no_node(tmp_path):
    config = config_for(tmp_path, {"ib": {"firmware": "28.39.1002"}})
    slurm = FakeSlurm(gpu_nodes(64))
    found, report = checked(tmp_path, firmware="28.39.1002")  # the emulated HCAs run another version
    assert any(r.failed and r.check == "ib-firmware" for r in found)
    code, line = self_check(config, slurm, "gpu007", found, report)
    assert code == ExitCode.FAILING and "pinned 28.39.1002" in line and slurm.calls == []
    module = [CheckResult("ib-kernel-modules", "node", True)]
    code, line = self_check(config, slurm, "gpu007", module, report)
    assert code == ExitCode.FAILING and "kernel module" in line and slurm.calls == []


def test_it_refuses_to_drain_past_the_out_of_service_limit_and_says_why(tmp_path):
    """64 GPU nodes, max_out_of_service_fraction 0.1: 6 out of service with an opsctl reason leave room for
    none (floor(6.4) = 6); a person's drain elsewhere does not count against a node's own check."""
    config = config_for(tmp_path, {"safety": {"max_out_of_service_fraction": 0.1}})
    held = {f"gpu0{i}": node(f"gpu0{i}", flags=["DRAIN"], reason=f"opsctl:node-check ib-port-state mlx5_{i % 8}")
            for i in range(40, 46)}
    slurm = FakeSlurm(gpu_nodes(64, **held))
    failing, report = checked(tmp_path, ("ib-down", "mlx5_2"))
    code, line = self_check(config, slurm, "gpu007", failing, report)
    assert code == ExitCode.FAILING and slurm.calls == []
    assert line == ("gpu007 not drained: 6 of 64 nodes are out of service with an opsctl reason; draining more "
                    "would pass safety.max_out_of_service_fraction 0.1")
    slurm.state["gpu045"] = node("gpu045", flags=["DRAIN"], reason="ticket-9 psu")
    assert self_check(config, slurm, "gpu007", failing, report)[1].startswith("drained gpu007")


class ChangesOnSecondRead(FakeSlurm):
    """Slurm as a person changes it between the check's read and the actor's (compare and set)."""

    def nodes(self):
        if self.reads == 1:
            self.state["gpu007"] = replace(self.state["gpu007"], flags=("DRAIN",), reason="ticket-7 reseat")
        return super().nodes()


def test_drain_and_resume_re_read_the_node_and_leave_a_changed_one_alone(tmp_path):
    config = config_for(tmp_path)
    slurm = ChangesOnSecondRead(gpu_nodes(64))
    failing, report = checked(tmp_path, ("ib-down", "mlx5_2"))
    code, line = self_check(config, slurm, "gpu007", failing, report)
    assert (code, line) == (ExitCode.FAILING, "gpu007 not drained: Slurm changed it meanwhile")
    assert slurm.calls == [] and slurm.nodes()["gpu007"].reason == "ticket-7 reseat"
    ours = node("gpu007", flags=["DRAIN"], reason=f"{REASON_PREFIX} ib-port-state mlx5_2")
    slurm = ChangesOnSecondRead(gpu_nodes(64, gpu007=ours))
    assert self_check(config, slurm, "gpu007", PASSING) == (ExitCode.OK, "gpu007 not resumed: Slurm changed it "
                                                                          "meanwhile")
    assert slurm.calls == []


def no_driver(argv, **_):
    """nvidia-smi on a node whose driver is not loaded (exit 9)."""
    return subprocess.CompletedProcess(argv, 9, "", "no driver\n")


def test_the_json_of_node_check_says_what_the_drain_did_beside_its_checks(tmp_path):
    """`opsctl node check --drain-self --json`: the drain in `done`, the older `action` line kept."""
    from click.testing import CliRunner

    from opsctl.cli import main
    from opsctl.clients import Clients

    config = parse_config({"gpu": {"kernel_log_path": str(tmp_path / "kmsg")}}, "t",
                          env={"OPSCTL_STATE_DIR": str(tmp_path / "state")})
    slurm = FakeSlurm(gpu_nodes(64))
    checked(tmp_path, ("ib-down", "mlx5_2"))
    result = CliRunner().invoke(main, ["node", "check", "--json", "--drain-self", "--node", "gpu007", "--window", "0",
                                       "--sysfs-root", str(tmp_path / "sys")],
                           obj=Clients(config=config, slurm=slurm, tools=no_driver))
    assert result.exit_code == ExitCode.FAILING, result.output
    data = json.loads(result.output)
    reason = f"{REASON_PREFIX} ib-port-state mlx5_2"
    assert data["action"] == f"drained gpu007: {reason}"
    assert (data["done"], data["would"], data["refused"]) == ([f"drain gpu007: {reason}"], [], {})
    assert isinstance(data["skipped"], list)  # the InfiniBand report's: the checks it could not make
    assert data["nvlink"] == {"links": [], "note": "nvidia-smi nvlink -s exited 9: no driver"}
