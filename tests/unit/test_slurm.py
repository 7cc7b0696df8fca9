"""The cli backend's parser on real `sinfo --json` output of Slurm 22.05.8 (captured from the lab:
gpu063 drained by a person, gpu064 drained by opsctl), ownership rules, and how the backend reports
a command that cannot run or fails (through its `run` seam; the lab tier runs the real commands)."""

import json
import subprocess

import pytest

from opsctl.errors import ConfigError, SourceUnavailable
from opsctl.slurm import SlurmCliImpl, SlurmNode, process_sinfo_output
from opsctl.slurm.pyslurm_backend import PySlurmImpl
from tests.conftest import FIXTURES

SINFO = (FIXTURES / "slurm" / "sinfo-22.05.8.json").read_text()


def test_sinfo_22_05_parses():
    nodes = process_sinfo_output(SINFO)
    assert set(nodes) == {"gpu001", "gpu063", "gpu064"}
    assert nodes["gpu001"] == SlurmNode("gpu001", "idle", (), "")
    assert nodes["gpu063"].drained and nodes["gpu063"].owner == "other"
    assert nodes["gpu064"].drained and nodes["gpu064"].owned and nodes["gpu064"].reason_rules() == ["xid-79"]


def test_sinfo_23_list_state_parses():
    raw = {"nodes": [{"name": "gpu001", "state": ["IDLE", "DRAIN"], "reason": "opsctl:ib-down,xid-79 x"}]}
    node = process_sinfo_output(json.dumps(raw))["gpu001"]
    assert node.state == "idle" and node.drained and node.reason_rules() == ["ib-down", "xid-79"]


@pytest.mark.parametrize("text", ["not json", "{}", '{"nodes": [{"state": "idle"}]}'])
def test_bad_sinfo_output_is_a_source_error(text):
    with pytest.raises(SourceUnavailable):
        process_sinfo_output(text)


def test_manual_drains_are_owned_but_not_rules():
    node = SlurmNode("gpu001", "idle", ("DRAIN",), "opsctl:manual bad fan")
    assert node.owned and node.manual and node.reason_rules() == []


@pytest.mark.parametrize("state,flags,out", [("idle", (), False), ("down", (), True), ("idle", ("DRAIN",), True),
                                             ("mixed", ("NOT_RESPONDING",), True), ("unknown", (), True)])
def test_out_of_service(state, flags, out):
    assert SlurmNode("n", state, flags, "").out_of_service is out


class FakeRun:
    """Stands in for subprocess.run: records argv, answers with `result` or raises it."""

    def __init__(self, result):
        self.result = result
        self.calls = []

    def __call__(self, argv, **kwargs):
        self.calls.append(argv)
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result


def done(rc=0, stdout="", stderr=""):
    return subprocess.CompletedProcess(args=[], returncode=rc, stdout=stdout, stderr=stderr)


def test_nodes_reads_sinfo_json():
    run = FakeRun(done(stdout=SINFO))
    assert set(SlurmCliImpl(run=run).nodes()) == {"gpu001", "gpu063", "gpu064"}
    assert run.calls == [["sinfo", "--json"]]


def test_drain_and_resume_are_one_scontrol_call_each_without_a_shell():
    run = FakeRun(done())
    slurm = SlurmCliImpl(scontrol="/usr/bin/scontrol", run=run)
    slurm.drain(["gpu001", "gpu002"], "opsctl:xid-79 gpu3 xid=79; it's \"quoted\"")
    slurm.resume(["gpu001"])
    assert run.calls == [
        ["/usr/bin/scontrol", "update", "nodename=gpu001,gpu002", "state=drain",
         "reason=opsctl:xid-79 gpu3 xid=79; it's \"quoted\""],
        ["/usr/bin/scontrol", "update", "nodename=gpu001", "state=resume"]]


def test_missing_binary_is_a_clear_source_error():
    with pytest.raises(SourceUnavailable, match="sinfo-does-not-exist not found"):
        SlurmCliImpl(sinfo="sinfo-does-not-exist", run=FakeRun(FileNotFoundError())).nodes()


def test_timeout_is_a_source_error():
    with pytest.raises(SourceUnavailable, match="sinfo --json timed out after 5s"):
        SlurmCliImpl(timeout=5, run=FakeRun(subprocess.TimeoutExpired(["sinfo"], 5))).nodes()


@pytest.mark.parametrize("stderr,stdout,message", [
    ("sinfo: error: slurm_load_partitions: Unable to contact slurm controller\nmore\n", "",
     "Slurm: sinfo --json failed: sinfo: error: slurm_load_partitions: Unable to contact slurm controller$"),
    ("", "", "Slurm: sinfo --json failed: exit 1$"),
])
def test_failing_command_reports_its_first_line(stderr, stdout, message):
    with pytest.raises(SourceUnavailable, match=message):
        SlurmCliImpl(run=FakeRun(done(1, stdout, stderr))).nodes()


def test_pyslurm_backend_without_pyslurm_names_the_key():
    try:
        import pyslurm  # noqa: F401
        pytest.skip("pyslurm is installed")
    except ImportError:
        pass
    with pytest.raises(ConfigError, match="config key slurm.backend: pyslurm is not installed"):
        PySlurmImpl()
