"""`opsctl node check`: its metrics for node_exporter's textfile collector, and --drain-self, which
drains the node for its own failed checks and resumes only its own drain (a fake of the Slurm protocol;
the lab tier runs the command against real Slurm)."""

from opsctl.config import parse_config
from opsctl.errors import ExitCode
from opsctl.fabric.check import h200_ndr, judge
from opsctl.fabric.collect import live_snapshot
from opsctl.nodecheck import REASON_PREFIX, CheckResult, drain_self, metrics_text, results, write_textfile
from opsctl.remediation.audit import AuditLog
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.ib_sysfs import write_tree
from tests.unit.fakes import FakeSlurm, node

T0 = 1_800_000_000.0


def found_on(tmp_path, *faults):
    hw = NodeHardware(node="gpu007")
    for fault, hca in faults:
        hw.inject(fault, hca=hca, now=T0)
    write_tree(tmp_path / "sys", hw, now=T0)
    return results(judge(live_snapshot(tmp_path / "sys"), h200_ndr()))


def test_metrics_name_each_failed_check_and_device_and_each_passed_check(tmp_path):
    text = metrics_text(found_on(tmp_path, ("ib-down", "mlx5_2"), ("pcie-x8", "mlx5_6")), now=T0)
    assert 'opsctl_node_check{check="ib-port-state",device="mlx5_2"} 1' in text
    assert 'opsctl_node_check{check="ib-pcie-link",device="mlx5_6"} 1' in text
    assert 'opsctl_node_check{check="ib-link-rate",device="node"} 0' in text
    assert 'check="ib-port-state",device="node"' not in text  # a failed check has no passing series
    assert 'check="ib-error-counters"' not in text  # not made (no window): no series, never a pass
    assert text.endswith(f"opsctl_node_check_timestamp_seconds {T0:.3f}\n")


def test_the_textfile_is_written_whole_and_only_as_prom(tmp_path):
    target = tmp_path / "opsctl_node_check.prom"
    write_textfile(target, "x 1\n")
    assert target.read_text() == "x 1\n" and [p.name for p in tmp_path.iterdir()] == [target.name]
    try:
        write_textfile(tmp_path / "checks.txt", "x 1\n")
    except Exception as err:  # noqa: BLE001
        assert "must be an absolute path ending in .prom" in str(err)
    else:
        raise AssertionError("a non-.prom textfile was accepted")


def config_for(tmp_path):
    return parse_config({}, "t", env={"OPSCTL_STATE_DIR": str(tmp_path / "state")})


def test_a_failing_node_drains_itself_once_and_resumes_itself_when_it_passes(tmp_path):
    config = config_for(tmp_path)
    slurm = FakeSlurm({"gpu007": node("gpu007")})
    failing = found_on(tmp_path, ("ib-down", "mlx5_2"))
    code, line = drain_self(config, slurm, "gpu007", failing)
    assert code == ExitCode.FAILING
    assert slurm.nodes()["gpu007"].reason == f"{REASON_PREFIX} ib-port-state mlx5_2"
    assert line == f"drained gpu007: {REASON_PREFIX} ib-port-state mlx5_2"
    assert drain_self(config, slurm, "gpu007", failing)[1].startswith("gpu007 stays drained")
    passing = [CheckResult("ib-port-state", "node", False)]
    assert drain_self(config, slurm, "gpu007", passing) == (ExitCode.OK, "resumed gpu007: every node check passes")
    assert not slurm.nodes()["gpu007"].drained
    events = [(r["event"], r["checks"]) for r in AuditLog(config.audit_log).read()[0]]
    assert events == [("drain", ["node-check"]), ("resume", ["node-check"])]


def test_a_drain_someone_else_set_is_left_alone_either_way(tmp_path):
    config = config_for(tmp_path)
    slurm = FakeSlurm({"gpu007": node("gpu007", flags=["DRAIN"], reason="ticket-123 bad dimm")})
    failing = found_on(tmp_path, ("ib-down", "mlx5_2"))
    assert drain_self(config, slurm, "gpu007", failing)[1].startswith("gpu007 left alone")
    assert drain_self(config, slurm, "gpu007", [CheckResult("ib-port-state", "node", False)]) == (ExitCode.OK, "")
    assert slurm.nodes()["gpu007"].reason == "ticket-123 bad dimm" and slurm.calls == []


def test_a_storage_check_never_drains_the_node_itself(tmp_path):
    """A storage outage fails every node at once: only `opsctl health` and its breaker may act on it."""
    config = config_for(tmp_path)
    slurm = FakeSlurm({"gpu007": node("gpu007")})
    storage = [CheckResult("lustre-import-down", "lustre-OST0002", True), CheckResult("storage-mount-hung", "/home",
                                                                                      True)]
    assert drain_self(config, slurm, "gpu007", found_on(tmp_path) + storage) == (ExitCode.OK, "")
    assert slurm.calls == [] and not slurm.nodes()["gpu007"].drained
