"""The cli backend on real Slurm JSON of each release (tests/fixtures/slurm/, sources in SOURCES.md):
which command each release is read with, every node state opsctl must leave alone, ownership, the
partitions it judges, and how a command that cannot run or fails is reported (through its `run`
seam; the lab tier runs the real commands of 22.05, 24.11 and 26.05)."""

import json
import subprocess

import pytest

from opsctl.errors import ConfigError, SourceUnavailable
from opsctl.slurm import SlurmCliImpl, SlurmNode, parse_nodes, parse_sinfo
from opsctl.slurm.base import IN_SERVICE_FLAGS, OUT_OF_SERVICE_FLAGS, StepSpec
from opsctl.slurm.cli import parse_return_to_service, parse_version
from opsctl.slurm.partitions import select_partitions
from opsctl.slurm.pyslurm_backend import PySlurmImpl
from tests.conftest import FIXTURES

SLURM = FIXTURES / "slurm"
SINFO = (SLURM / "sinfo-22.05.8.json").read_text()
# The same states set by hand on each release (tests/fixtures/SOURCES.md): gpu041 idle, gpu042 drained by
# opsctl (reason then extended with `scontrol update reason=`), gpu043 drained by a person, gpu044 DOWN,
# gpu045 FAIL, gpu046 in a MAINT reservation, gpu047 in a plain reservation; 24.11 and 26.05 also
# gpu048 REBOOT_REQUESTED (while a job ran) and gpu049 POWERED_DOWN.
STATES = {
    "22.05.8": parse_sinfo((SLURM / "sinfo-22.05.8-states.json").read_text()),
    "24.11.5": parse_nodes((SLURM / "scontrol-show-nodes-24.11.5.json").read_text()),
    "26.05.5": parse_nodes((SLURM / "scontrol-show-nodes-26.05.5.json").read_text()),
}
RELEASES = list(STATES)


@pytest.fixture(autouse=True)
def _no_slurm_conf_of_the_caller(monkeypatch):
    """The backend checks the slurm.conf that SLURM_CONF names; the tests here set their own."""
    monkeypatch.delenv("SLURM_CONF", raising=False)


@pytest.mark.parametrize("release", RELEASES)
def test_every_release_reads_the_same_states(release):
    nodes = STATES[release]
    assert nodes["gpu041"] == SlurmNode("gpu041", "idle", (), "", ("gpu",), nodes["gpu041"].gres)
    assert nodes["gpu042"].drained and nodes["gpu042"].reason_rules() == ["ib-down", "xid-79"]
    assert nodes["gpu043"].drained and nodes["gpu043"].owner == "other"
    assert nodes["gpu044"].state == "down" and nodes["gpu044"].reason == "bad psu"
    assert "FAIL" in nodes["gpu045"].flags and nodes["gpu045"].reason == "failing dimm"
    assert {"MAINTENANCE", "RESERVED"} <= set(nodes["gpu046"].flags) and "RESERVED" in nodes["gpu047"].flags


@pytest.mark.parametrize("release", RELEASES)
def test_fail_down_maint_and_a_reservation_are_held_by_slurm(release):
    nodes = STATES[release]
    assert nodes["gpu041"].held_by_slurm == () and not nodes["gpu041"].out_of_service
    for name in ("gpu044", "gpu045", "gpu046", "gpu047"):
        assert nodes[name].held_by_slurm, name
    assert all(nodes[n].out_of_service for n in ("gpu042", "gpu043", "gpu044", "gpu045", "gpu046"))
    assert not nodes["gpu047"].out_of_service  # reserved: in service, but not opsctl's to touch
    assert nodes["gpu042"].resumable and not nodes["gpu043"].resumable


# Slurm's record of who set gpu042's reason (opsctl, as root) and when, and when its slurmd booted, as each
# capture holds it (reason_set_by_user, reason_changed_at, boot_time).
RECORDS = {"22.05.8": ("root", 1796075950.0, 1796073198.0), "24.11.5": ("root", 1796075926.0, 1796073197.0),
           "26.05.5": ("root", 1796075886.0, 1796073198.0)}


@pytest.mark.parametrize("release", RELEASES)
def test_defect_4_every_release_says_who_set_the_reason_when_and_when_the_node_booted(release):
    nodes = STATES[release]
    assert (nodes["gpu042"].reason_user, nodes["gpu042"].reason_time, nodes["gpu042"].boot_time) == RECORDS[release]
    # No reason, no setter (24.11 names root for it) and no time; the boot is still known.
    assert (nodes["gpu041"].reason_user, nodes["gpu041"].reason_time) == ("", None) and nodes["gpu041"].boot_time
    assert nodes["gpu042"].custody is None and nodes["gpu042"].owned  # the parser judges nothing: the actor does


@pytest.mark.parametrize("release", ["24.11.5", "26.05.5"])
def test_reboot_requested_and_powered_down_are_held_by_slurm(release):
    nodes = STATES[release]
    assert nodes["gpu048"].held_by_slurm == ("REBOOT_REQUESTED",) and nodes["gpu048"].foreign_reason
    assert nodes["gpu049"].held_by_slurm == ("POWERED_DOWN",) and nodes["gpu049"].out_of_service


# A reboot through Slurm as the remediation ladder asks for it, captured on each release (SOURCES.md): the rebooted
# node (gpu002 of the lab, gpu2 of a chroot cluster) REBOOT_ISSUED, then back DOWN after its slurmd registered
# again; the other runs a job with its reboot requested (ASAP) in both captures.
REBOOTS = {"22.05.8": ("sinfo-22.05.8", "gpu002", "gpu003"),
           "24.11.5": ("scontrol-show-nodes-24.11.5", "gpu2", "gpu1"),
           "26.05.5": ("scontrol-show-nodes-26.05.5", "gpu2", "gpu1")}


@pytest.mark.parametrize("release", list(REBOOTS))
def test_a_reboot_through_slurm_reads_as_under_way_then_back_down_with_opsctls_reason(release):
    stem, rebooted, busy = REBOOTS[release]
    reason = "opsctl:reboot gpu3 xid-79 xid=79 count=1"
    during = parse_nodes((SLURM / f"{stem}-reboot-issued.json").read_text())
    after = parse_nodes((SLURM / f"{stem}-reboot-complete.json").read_text())
    issued, back = during[rebooted], after[rebooted]
    assert issued.state_text == "DOWN+DRAIN+REBOOT_ISSUED" and issued.reason == f"{reason} : reboot issued"
    assert issued.down_for_reboot and not issued.back_from_reboot and not issued.resumable
    assert back.state_text == "DOWN" and back.reason == f"{reason} : reboot issued : reboot complete"
    assert back.back_from_reboot and not back.down_for_reboot
    for nodes in (during, after):
        assert nodes[busy].state_text == "MIXED+DRAIN+REBOOT_REQUESTED" and nodes[busy].runs_jobs
        assert nodes[busy].down_for_reboot and not nodes[busy].back_from_reboot


@pytest.mark.parametrize("release", list(REBOOTS))
def test_defect_4_a_reboot_through_slurm_shows_the_new_boot_and_slurms_own_note(release):
    stem, rebooted, busy = REBOOTS[release]
    during = parse_nodes((SLURM / f"{stem}-reboot-issued.json").read_text())
    after = parse_nodes((SLURM / f"{stem}-reboot-complete.json").read_text())
    assert after[rebooted].boot_time > during[rebooted].boot_time == during[busy].boot_time
    # Slurm appended its notes as SlurmUser (root in these clusters), when the node registered again.
    assert after[rebooted].slurm_notes == ("reboot issued", "reboot complete") and after[rebooted].opsctl_words
    assert after[rebooted].reason_time >= after[rebooted].boot_time and after[rebooted].reason_user == "root"


def test_slurmrestd_node_json_of_23_02_and_23_11_parse_too():
    # The data_parser that `scontrol show nodes --json` prints, as slurmrestd serves it (public outputs).
    node = parse_nodes((SLURM / "slurmrestd-node-23.02.3.json").read_text())["node01"]
    assert (node.state, node.flags, node.partitions, node.has_gpus) == ("idle", (), ("debug",), True)
    nodes = parse_nodes((SLURM / "slurmrestd-nodes-23.11.1.json").read_text())
    assert nodes["n0164"].drained and nodes["n0164"].reason == "Kill task failed" and nodes["n0164"].foreign_reason
    assert nodes["dtn1"].held_by_slurm == ("DOWN", "NOT_RESPONDING") and not nodes["dtn1"].has_gpus
    assert nodes["n0999"].partitions == ("preempt", "cisds") and nodes["n0999"].has_gpus


def test_slurmrestd_node_json_of_24_05_and_25_05_parse_too():
    # Public captures of real clusters (SOURCES.md): 24.05's data_parser v0.0.41 and 25.05's v0.0.43, the
    # ones their `scontrol show nodes --json` prints.
    drained = parse_nodes((SLURM / "slurmrestd-node-drain-24.05.3.json").read_text())["cn146"]
    assert drained.drained and drained.reason == "ECC memory error" and drained.foreign_reason
    down = parse_nodes((SLURM / "slurmrestd-node-down-24.05.3.json").read_text())["cn026"]
    assert down.held_by_slurm == ("DOWN",) and down.out_of_service and down.reason == "CPU dead"
    nodes = parse_nodes((SLURM / "slurmrestd-nodes-25.05.4.json").read_text())
    assert nodes["cn3"].drained and nodes["cn3"].reason == "ECC memory error" and nodes["cn3"].foreign_reason
    assert nodes["cn4"].held_by_slurm == ("DOWN",) and nodes["cn4"].out_of_service
    assert nodes["gpu1"].has_gpus and nodes["gpu1"].partitions == ("gpu",) and not nodes["cn1"].has_gpus
    assert not nodes["gpu2"].out_of_service and not nodes["gpu2"].drained


@pytest.mark.parametrize("name", ["sinfo-23.02.5.json", "sinfo-24.11.5.json", "sinfo-26.05.5.json"])
def test_the_aggregated_sinfo_of_23_02_and_later_is_refused_with_the_reason(name):
    with pytest.raises(SourceUnavailable, match="aggregated sinfo of Slurm 23.02 or later"):
        parse_sinfo((SLURM / name).read_text())


@pytest.mark.parametrize("text", ["not json", "{}", '{"nodes": [{"state": "idle"}]}', "[1]",
                                  '{"nodes": [], "errors": [{"error": "Unable to contact slurm controller"}]}'])
def test_bad_output_is_a_source_error(text):
    with pytest.raises(SourceUnavailable):
        parse_nodes(text)


@pytest.mark.parametrize("text,version", [("slurm 22.05.8\n", (22, 5)), ("slurm-wlm 24.11.5\n", (24, 11)),
                                          ("slurm 23.02.7-1\n", (23, 2)), ("slurm 26.05.0rc1", (26, 5))])
def test_versions(text, version):
    assert parse_version(text) == version


def test_manual_drains_are_owned_but_not_rules():
    node = SlurmNode("gpu001", "idle", ("DRAIN",), "opsctl:manual bad fan")
    assert node.owned and node.manual and node.reason_rules() == [] and not node.resumable


@pytest.mark.parametrize("state,flags,out", [("idle", (), False), ("down", (), True), ("idle", ("DRAIN",), True),
                                             ("mixed", ("NOT_RESPONDING",), True), ("unknown", (), True),
                                             ("idle", ("POWERED_DOWN",), True), ("idle", ("RESERVED",), False)])
def test_out_of_service(state, flags, out):
    assert SlurmNode("n", state, flags, "").out_of_service is out


# Every node state flag that Slurm 23.02 to 26.05 prints: node_state_flags[] of
# src/common/slurm_protocol_defs.c and the node states of src/plugins/data_parser/v0.0.*/parsers.c
# (SchedMD/slurm, tags slurm-23-02-0-1 to slurm-26-05-3-1).
SLURM_FLAGS = ["BLOCKED", "CLOUD", "COMPLETING", "DRAIN", "DYNAMIC_FUTURE", "DYNAMIC_NORM", "EXTERNAL", "FAIL",
               "INVALID_REG", "MAINTENANCE", "NOT_RESPONDING", "PERFCTRS", "PLANNED", "POWERED_DOWN", "POWERING_DOWN",
               "POWERING_UP", "POWER_DOWN", "POWER_DOWN_ASAP", "POWER_DOWN_FORCE", "POWER_DRAIN", "POWER_UP",
               "REBOOT_CANCELED", "REBOOT_ISSUED", "REBOOT_REQUESTED", "RESERVED", "RESUME", "UNDRAIN"]


def test_every_flag_of_23_02_to_26_05_is_decided():
    decided = OUT_OF_SERVICE_FLAGS | IN_SERVICE_FLAGS | {"DRAIN", "RESERVED"}
    assert [f for f in SLURM_FLAGS if f not in decided] == []
    assert not OUT_OF_SERVICE_FLAGS & IN_SERVICE_FLAGS


@pytest.mark.parametrize("flag,out", [("POWER_DRAIN", True), ("POWER_UP", True), ("POWER_DOWN_ASAP", True),
                                      ("POWER_DOWN_FORCE", True), ("DYNAMIC_FUTURE", True), ("EXTERNAL", True),
                                      ("REBOOT_CANCELED", True), ("CLOUD", False), ("DYNAMIC_NORM", False),
                                      ("BLOCKED", False), ("PLANNED", False), ("COMPLETING", False)])
def test_newer_flags_that_take_a_node_out_of_service_hold_it(flag, out):
    node = SlurmNode("n", "idle", (flag,), "")
    assert node.out_of_service is out and (node.held_by_slurm == (flag,)) is out


def test_a_power_drain_keeps_opsctls_own_drain_from_being_lifted():
    node = SlurmNode("n", "idle", ("DRAIN", "POWER_DRAIN"), "opsctl:xid-79 gpu3 xid=79 count=1")
    assert node.owned and not node.resumable and node.held_by_slurm == ("POWER_DRAIN",)


@pytest.mark.parametrize("raw", [
    {"state": ["DOWN", "SOME_FLAG_OF_2030"]},  # an unknown flag beside a down base state
    {"state": ["SOME_FLAG_OF_2030", "DOWN"]},  # a release that lists a flag before the base state
    {"state": ["IDLE", "SOME_FLAG_OF_2030", "NOT_RESPONDING"]},
    {"state": "down", "state_flags": ["SOME_FLAG_OF_2030"]},  # 22.05's shape
    {"state": ["INVALID"]},  # what Slurm prints for a base state it does not know
])
def test_an_unknown_flag_never_puts_a_node_back_in_service(raw):
    node = parse_nodes(json.dumps({"nodes": [{"name": "gpu001", **raw}]}))["gpu001"]
    assert node.out_of_service and node.held_by_slurm and not node.resumable


def test_an_unknown_flag_leaves_a_node_in_service_but_out_of_opsctls_reach():
    """A flag no release of 22.05-26.05 prints: the node runs jobs as its base state says, but opsctl does not
    act on a state it cannot read (opsctl/slurm/reach.py), and its refusals name the flag."""
    node = parse_nodes(json.dumps({"nodes": [{"name": "gpu001", "state": ["IDLE", "SOME_FLAG_OF_2030"]}]}))
    assert not node["gpu001"].out_of_service and node["gpu001"].held_by_slurm == ("SOME_FLAG_OF_2030",)


def test_default_partitions_are_those_with_gpu_nodes():
    nodes = parse_nodes((SLURM / "slurmrestd-nodes-23.11.1.json").read_text())
    chosen = select_partitions(nodes, None)
    assert "dtn1" not in chosen and "n0160" in chosen and "n0397" in chosen  # preempt has GPU nodes
    assert set(select_partitions(nodes, ("kerngpu",))) == {"n1000"}
    with pytest.raises(ConfigError, match="config key slurm.partitions: no Slurm partition nope"):
        select_partitions(nodes, ("nope",))
    cpu_only = {"c1": SlurmNode("c1", "idle", partitions=("cpu",))}
    with pytest.raises(ConfigError, match="no Slurm partition has GPU nodes"):
        select_partitions(cpu_only, None)


class FakeRun:
    """Stands in for subprocess.run: records argv (and the stdin given), answers by the command or raises."""

    def __init__(self, result, version="slurm 22.05.8\n"):
        self.result = result
        self.version = version
        self.calls = []
        self.stdins = []

    def __call__(self, argv, **kwargs):
        self.calls.append(argv)
        self.stdins.append(kwargs.get("stdin"))
        if argv[1:] == ["--version"] and self.version is not None:
            return done(stdout=self.version)
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result


def done(rc=0, stdout="", stderr=""):
    return subprocess.CompletedProcess(args=[], returncode=rc, stdout=stdout, stderr=stderr)


def test_22_05_is_read_with_sinfo_json():
    run = FakeRun(done(stdout=SINFO))
    assert set(SlurmCliImpl(run=run).nodes()) == {"gpu001", "gpu063", "gpu064"}
    assert run.calls == [["scontrol", "--version"], ["sinfo", "--json"]]


@pytest.mark.parametrize("version", ["slurm 23.02.7\n", "slurm-wlm 24.11.5\n", "slurm-wlm 26.05.5\n"])
def test_23_02_and_later_are_read_with_scontrol_show_nodes_json(version):
    run = FakeRun(done(stdout=(SLURM / "scontrol-show-nodes-26.05.5.json").read_text()), version)
    slurm = SlurmCliImpl(run=run)
    assert "gpu049" in slurm.nodes() and "gpu049" in slurm.nodes()
    assert run.calls == [["scontrol", "--version"], ["scontrol", "show", "nodes", "--json"],
                         ["scontrol", "show", "nodes", "--json"]]  # the release is asked once


def test_drain_resume_and_reason_are_one_scontrol_call_each_without_a_shell():
    run = FakeRun(done())
    slurm = SlurmCliImpl(scontrol="/usr/bin/scontrol", run=run)
    slurm.drain(["gpu001", "gpu002"], "opsctl:xid-79 gpu3 xid=79; it's \"quoted\"")
    slurm.resume(["gpu001"])
    slurm.set_reason(["gpu002"], "opsctl:ib-down,xid-79 x")
    slurm.reboot(["gpu001", "gpu003"], "opsctl:provision nvidia driver 570.172.08")
    assert run.calls == [
        ["/usr/bin/scontrol", "update", "nodename=gpu001,gpu002", "state=drain",
         "reason=opsctl:xid-79 gpu3 xid=79; it's \"quoted\""],
        ["/usr/bin/scontrol", "update", "nodename=gpu001", "state=resume"],
        ["/usr/bin/scontrol", "update", "nodename=gpu002", "reason=opsctl:ib-down,xid-79 x"],
        ["/usr/bin/scontrol", "reboot", "ASAP", "nextstate=DOWN", "reason=opsctl:provision nvidia driver 570.172.08",
         "gpu001,gpu003"]]


def test_every_slurm_command_gets_its_own_empty_stdin():
    """A site's scontrol or srun may be a wrapper around ssh, and ssh makes its stdin non-blocking while it
    runs: given opsctl's own stdin (a terminal, or a timer's /dev/null shared with other programs), it would
    read the terminal and change the stdin of every program that shares it."""
    run = FakeRun(done(stdout=SINFO))
    slurm = SlurmCliImpl(run=run)
    slurm.nodes()
    slurm.drain(["gpu001"], "opsctl:xid-79 x")
    slurm.run_step(StepSpec("opsctl-preflight", ("gpu001",), "validate", "pf", ("true",), (), 5, "pmix", 8), 60)
    assert len(run.stdins) == 4 and set(run.stdins) == {subprocess.DEVNULL}


def test_missing_binary_is_a_clear_source_error():
    with pytest.raises(SourceUnavailable, match="scontrol-does-not-exist not found"):
        SlurmCliImpl(scontrol="scontrol-does-not-exist", run=FakeRun(FileNotFoundError(), version=None)).nodes()


def test_timeout_is_a_source_error_with_slurms_first_line():
    with pytest.raises(SourceUnavailable, match="sinfo --json timed out after 5s$"):
        SlurmCliImpl(timeout=5, run=FakeRun(subprocess.TimeoutExpired(["sinfo"], 5))).nodes()
    said = b"sinfo: error: Unable to contact slurm controller (connect failure)\nmore\n"
    with pytest.raises(SourceUnavailable, match="timed out after 5s: sinfo: error: Unable to contact slurm "
                                                r"controller \(connect failure\)$"):
        SlurmCliImpl(timeout=5, run=FakeRun(subprocess.TimeoutExpired(["sinfo"], 5, stderr=said))).nodes()


@pytest.mark.parametrize("make,strerror", [(lambda p: None, "No such file or directory"),
                                           (lambda p: p.mkdir(), "Is a directory")])
def test_a_missing_or_unreadable_slurm_conf_is_found_before_any_call(tmp_path, make, strerror):
    conf = tmp_path / "slurm.conf"
    make(conf)
    run = FakeRun(done(stdout=SINFO))
    with pytest.raises(SourceUnavailable) as err:
        SlurmCliImpl(run=run, environ={"SLURM_CONF": str(conf)}).nodes()
    assert str(err.value) == f"Slurm: cannot read SLURM_CONF={conf}: {strerror}" and run.calls == []
    conf.parent.joinpath("ok.conf").write_text("ClusterName=c\n")
    assert SlurmCliImpl(run=run, environ={"SLURM_CONF": str(tmp_path / "ok.conf")}).nodes()


@pytest.mark.parametrize("stderr,stdout,message", [
    ("sinfo: error: slurm_load_partitions: Unable to contact slurm controller\nmore\n", "",
     "Slurm: sinfo --json failed: sinfo: error: slurm_load_partitions: Unable to contact slurm controller$"),
    ("", "", "Slurm: sinfo --json failed: exit 1$"),
])
def test_failing_command_reports_its_first_line(stderr, stdout, message):
    with pytest.raises(SourceUnavailable, match=message):
        SlurmCliImpl(run=FakeRun(done(1, stdout, stderr))).nodes()


def test_an_unreadable_version_is_a_source_error():
    with pytest.raises(SourceUnavailable, match="cannot tell the release"):
        SlurmCliImpl(run=FakeRun(done(), version="hello")).nodes()


def test_pyslurm_backend_without_pyslurm_names_the_key():
    try:
        import pyslurm  # noqa: F401
        pytest.skip("pyslurm is installed")
    except ImportError:
        pass
    with pytest.raises(ConfigError, match="config key slurm.backend: pyslurm is not installed"):
        PySlurmImpl()


@pytest.mark.parametrize("name,release", [("slurmrestd-node-drain-24.05.3.json", "24.05.3"),
                                          ("slurmrestd-nodes-25.05.4.json", "25.05.4"),
                                          ("scontrol-show-nodes-24.11.5.json", "24.11.5"),
                                          ("scontrol-show-nodes-26.05.5.json", "26.05.5"),
                                          ("scontrol-show-nodes-24.11.5-reboot-issued.json", "24.11.5"),
                                          ("scontrol-show-nodes-26.05.5-reboot-complete.json", "26.05.5")])
def test_the_captures_are_of_the_release_their_name_says(name, release):
    assert json.loads((SLURM / name).read_text())["meta"]["slurm"]["release"] == release


def test_return_to_service_is_read_from_scontrol_show_config():
    text = (SLURM / "scontrol-show-config-22.05.8.txt").read_text()
    assert parse_return_to_service(text) == 2
    assert parse_return_to_service(text.replace("ReturnToService         = 2", "ReturnToService         = 1")) == 1


@pytest.mark.parametrize("text", ["", "Configuration data as of 2026-12-04T12:24:56\nReturnToService = (null)\n"])
def test_a_show_config_without_return_to_service_is_an_error_not_a_guess(text):
    with pytest.raises(SourceUnavailable, match="ReturnToService"):
        parse_return_to_service(text)
