"""Storage health judged from what the readers read (opsctl.storage.check.judge, pure), its config, and its
results as `opsctl node check` metrics for node_exporter's textfile collector."""

import pytest

from opsctl.config import parse_config
from opsctl.errors import ConfigError
from opsctl.nodecheck import metrics_text, storage_results
from opsctl.storage.check import CHECKS, LNET_CHECKS, LnetView, LustreView, judge
from opsctl.storage.lnet import NetworkInterface, PingResult
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


def lnet_ok():
    return LnetView(nis=[NetworkInterface("o2ib", "10.10.1.2@o2ib", "up", ("ib0",))],
                    pings=[PingResult("10.10.0.10@o2ib", True, "12345-0@lo 12345-10.10.0.10@o2ib")])


def found(report):
    return [(f.check, f.device) for f in report.findings]


def test_healthy_mounts_pass_every_check():
    config = storage(HOME, LUSTRE)
    report = judge(config.mounts, ok("/home", "/lustre"), table(home="nfs4", lustre="lustre"), lustre_ok(),
                   lnet=lnet_ok())
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
        "lustre-import-down": "no Lustre mount configured", "lnet-ni-down": "no Lustre mount configured",
        "lustre-mgs-unreachable": "no Lustre mount configured"}
    config = storage(LUSTRE)
    report = judge(config.mounts, ok("/lustre"), table(lustre="lustre"), LustreView(unavailable="lctl not found"),
                   lnet=lnet_ok())
    assert report.skipped == {"lustre-import-down": "lctl not found"}
    assert "lustre-import-down" not in report.checked
    report = judge(config.mounts, ok("/lustre"), table(lustre="lustre"), lustre_ok())
    assert report.skipped == dict.fromkeys(LNET_CHECKS, "LNet was not asked")
    # lnetctl missing does not keep the MGS from being pinged, nor the other way round.
    view = LnetView(pings=[PingResult("10.10.0.10@o2ib", False, "Input/output error")],
                    unavailable={"lnet-ni-down": "lnetctl not found"})
    report = judge(config.mounts, ok("/lustre"), table(lustre="lustre"), lustre_ok(), lnet=view)
    assert report.skipped == {"lnet-ni-down": "lnetctl not found"} and "lustre-mgs-unreachable" in report.checked
    assert found(report) == [("lustre-mgs-unreachable", "10.10.0.10@o2ib")]


def test_an_lnet_ni_down_names_the_nid_and_its_interfaces_and_an_unreachable_mgs_its_nid():
    config = storage(LUSTRE)
    view = LnetView(nis=[NetworkInterface("tcp", "10.73.20.21@tcp", "up", ("eth1",)),
                         NetworkInterface("o2ib", "172.16.0.24@o2ib", "down", ("ib0", "ib3"))],
                    pings=[PingResult("10.10.0.10@o2ib", False, "Input/output error"),
                           PingResult("10.10.0.11@o2ib", True, "12345-0@lo 12345-10.10.0.11@o2ib")])
    report = judge(config.mounts, ok("/lustre"), table(lustre="lustre"), lustre_ok(), lnet=view)
    assert [(f.check, f.device, f.detail) for f in report.findings] == [
        ("lnet-ni-down", "172.16.0.24@o2ib", "o2ib NI down; interfaces ib0, ib3"),
        ("lustre-mgs-unreachable", "10.10.0.10@o2ib", "lctl ping: Input/output error")]
    assert report.checked == CHECKS
    text = metrics_text(storage_results(report), 1.8e9, report)
    assert 'opsctl_node_check{check="lnet-ni-down",device="172.16.0.24@o2ib"} 1' in text
    assert 'opsctl_node_check{check="lustre-mgs-unreachable",device="10.10.0.10@o2ib"} 1' in text
    assert 'opsctl_node_check{check="lustre-import-down",device="node"} 0' in text


def test_node_check_metrics_carry_storage_results_and_nfs_retransmissions():
    config = storage(HOME, LUSTRE)
    nfs = {"/home": NfsStats("/home", "10.0.0.5:/srv/home", ops=1000, transmissions=1012, major_timeouts=1)}
    report = judge(config.mounts, {**ok("/home"), "/lustre": ProbeResult("/lustre", "hung", "no answer")},
                   table(home="nfs4", lustre="lustre"), lustre_ok(), nfs)
    text = metrics_text(storage_results(report), 1.8e9, report)
    assert 'opsctl_node_check{check="storage-mount-hung",device="/lustre"} 1' in text
    assert 'opsctl_node_check{check="lnet-ni-down"' not in text  # not asked: no series, never a pass
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
    ({"lnetctl": ""}, "storage.lnetctl: must not be empty"),
    ({"lustre_mgs_nids": "10.10.0.10@o2ib"}, "storage.lustre_mgs_nids: expected list, got str"),
    ({"lustre_mgs_nids": ["10.10.0.10"]}, "storage.lustre_mgs_nids: must be a list of distinct LNet NIDs"),
    ({"lustre_mgs_nids": ["10.10.0.10@o2ib", "10.10.0.10@o2ib"]},
     "storage.lustre_mgs_nids: must be a list of distinct LNet NIDs"),
])
def test_bad_storage_config_is_one_line_naming_the_key(raw, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_config({"storage": raw}, "t", {})


def test_lnet_config_keys_and_their_defaults():
    assert (storage().lnetctl, storage().lustre_mgs_nids) == ("lnetctl", ())
    config = storage(lnetctl="/opt/lustre/bin/lnetctl", lustre_mgs_nids=["10.10.0.10@o2ib", "10.10.0.11@o2ib1",
                                                                          "fe80::1@tcp"])
    assert config.lnetctl == "/opt/lustre/bin/lnetctl"
    assert config.lustre_mgs_nids == ("10.10.0.10@o2ib", "10.10.0.11@o2ib1", "fe80::1@tcp")


def test_the_catalog_lnet_rules_name_the_nid_in_a_health_verdict():
    """`opsctl health --json` shows the NID as `nid` (not as an HCA) and the drain evidence names it."""
    from opsctl.commands.render import check_json
    from opsctl.health.catalog import load_catalog
    from opsctl.health.evaluate import check_for
    from opsctl.prom.client import Sample

    rules = {r.id: r for r in load_catalog(parse_config({}, "t", {}))}
    for rule_id, nid, evidence in (("lnet-ni-down", "172.16.0.24@o2ib", "LNet NI down"),
                                   ("lustre-mgs-unreachable", "10.10.0.10@o2ib", "MGS unreachable")):
        rule = rules[rule_id]
        assert (rule.domain, rule.action, rule.auto_resume) == ("storage", "drain", True)
        check = check_for(rule, Sample({"node": "gpu002", "device": nid, "nid": nid}, 1.0))
        assert check_json(check)["nid"] == nid and check.evidence == f"{nid} {evidence}"
