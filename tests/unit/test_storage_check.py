"""Storage health judged from what the readers read (opsctl.storage.check.judge, pure), its config, and its
results as `opsctl node check` metrics for node_exporter's textfile collector."""

import pytest

from opsctl.config import parse_config
from opsctl.errors import ConfigError
from opsctl.nodecheck import metrics_text, storage_results
from opsctl.storage.check import CHECKS, LustreView, judge
from opsctl.storage.lustre import Import, ServerCheck
from opsctl.storage.mountinfo import Mount
from opsctl.storage.mountstats import NfsStats
from opsctl.storage.probe import ProbeResult

HOME = {"path": "/home", "fstype": "nfs4", "probe_dir": "/home/.opsctl"}
LUSTRE = {"path": "/lustre", "fstype": "lustre"}


def storage(*mounts, **extra):
    return parse_config({"storage": {"mounts": list(mounts), **extra}}, "t", {}).storage


def table(**fstypes):
    return {f"/{name}": Mount(f"/{name}", fstype, "server:/x", "rw") for name, fstype in fstypes.items()}


def ok(*points):
    return {p: ProbeResult(p, "ok") for p in points}


def lustre_ok():
    return LustreView(imports=[Import("lustre-OST0000-osc-ffff1", "lustre-OST0000", "FULL"),
                               Import("lustre-OST0001-osc-ffff1", "lustre-OST0001", "IDLE")],
                      servers=[ServerCheck("lustre-OST0000-osc-ffff1", "lustre-OST0000", True, "active")])


def found(report):
    return [(f.check, f.device) for f in report.findings]


def test_healthy_mounts_pass_every_check():
    config = storage(HOME, LUSTRE)
    report = judge(config.mounts, ok("/home", "/lustre"), table(home="nfs4", lustre="lustre"), lustre_ok())
    assert report.passed and report.checked == CHECKS and report.skipped == {}


def test_a_missing_mount_and_one_of_another_type_are_missing():
    config = storage(HOME, LUSTRE)
    report = judge(config.mounts, ok("/home", "/lustre"), table(home="ext4"), lustre_ok())
    assert found(report) == [("storage-mount-missing", "/home"), ("storage-mount-missing", "/lustre")]
    assert report.findings[0].detail == "ext4 from server:/x, not nfs4"


def test_a_hung_and_a_failed_probe():
    config = storage(HOME, LUSTRE)
    probes = {"/home": ProbeResult("/home", "error", "PermissionError: [Errno 13] Permission denied"),
              "/lustre": ProbeResult("/lustre", "hung", "no answer within 5s")}
    report = judge(config.mounts, probes, table(home="nfs4", lustre="lustre"), lustre_ok())
    assert found(report) == [("storage-probe-failed", "/home"), ("storage-mount-hung", "/lustre")]


def test_a_lustre_import_down_names_the_target_once_from_both_sources():
    config = storage(LUSTRE)
    view = LustreView(imports=[Import("lustre-OST0002-osc-ffff1", "lustre-OST0002", "DISCONN"),
                               Import("lustre-MDT0000-mdc-ffff1", "lustre-MDT0000", "FULL")],
                      servers=[ServerCheck("lustre-OST0002-osc-ffff1", "lustre-OST0002", False,
                                           "Transport endpoint is not connected (107)")])
    report = judge(config.mounts, ok("/lustre"), table(lustre="lustre"), view)
    assert found(report) == [("lustre-import-down", "lustre-OST0002")]
    assert report.findings[0].detail == ("import DISCONN; lfs check servers: Transport endpoint is not connected "
                                         "(107)")


def test_checks_that_could_not_be_made_are_skipped_never_passed():
    assert judge((), {}, {}).skipped == {check: "no storage.mounts configured" for check in CHECKS}
    config = storage(HOME)
    assert judge(config.mounts, ok("/home"), table(home="nfs4")).skipped == {
        "lustre-import-down": "no Lustre mount configured"}
    config = storage(LUSTRE)
    report = judge(config.mounts, ok("/lustre"), table(lustre="lustre"), LustreView(unavailable="lctl not found"))
    assert report.skipped == {"lustre-import-down": "lctl not found"}
    assert "lustre-import-down" not in report.checked


def test_node_check_metrics_carry_storage_results_and_nfs_retransmissions():
    config = storage(HOME, LUSTRE)
    nfs = {"/home": NfsStats("/home", "10.0.0.5:/srv/home", ops=1000, transmissions=1012, major_timeouts=1)}
    report = judge(config.mounts, {**ok("/home"), "/lustre": ProbeResult("/lustre", "hung", "no answer")},
                   table(home="nfs4", lustre="lustre"), lustre_ok(), nfs)
    text = metrics_text(storage_results(report), 1.8e9, report)
    assert 'opsctl_node_check{check="storage-mount-hung",device="/lustre"} 1' in text
    assert 'opsctl_node_check{check="storage-mount-missing",device="node"} 0' in text
    assert 'opsctl_node_check{check="lustre-import-down",device="node"} 0' in text
    assert "# TYPE opsctl_node_nfs_rpc_retransmissions_total counter" in text
    assert 'opsctl_node_nfs_rpc_retransmissions_total{mount="/home"} 12' in text


@pytest.mark.parametrize("raw, message", [
    ({"mounts": [{"path": "home", "fstype": "nfs4"}]}, "storage.mounts[0].path: must be an absolute"),
    ({"mounts": [{"path": "/home", "fstype": "nfs 4"}]}, "storage.mounts[0].fstype: must be a filesystem type"),
    ({"mounts": [{"path": "/home", "fstype": "nfs4", "probe_dir": "/tmp"}]},
     "storage.mounts[0].probe_dir: must be an absolute path under /home"),
    ({"mounts": [{"path": "/home", "fstype": "nfs4", "opts": "hard"}]}, "storage.mounts[0].opts: unknown key"),
    ({"mounts": [{"path": "/home", "fstype": "nfs4"}, {"path": "/home", "fstype": "nfs"}]},
     "storage.mounts: a path is listed twice"),
    ({"timeout_seconds": 0}, "storage.timeout_seconds: must be 0.1-600"),
    ({"mounts": "/home"}, "storage.mounts: expected list"),
])
def test_bad_storage_config_is_one_line_naming_the_key(raw, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_config({"storage": raw}, "t", {})
