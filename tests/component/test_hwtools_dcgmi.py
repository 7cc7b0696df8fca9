"""The emulated `dcgmi diag` run as a real process against a state file with faults injected: DCGM 4's exit
codes, its JSON read back by opsctl's parser, its table, and a lost GPU."""

import json
import os
import subprocess
import sys

import pytest

from opsctl.gpu.dcgm_diag import diag_verdict, process_dcgm_diag_output
from opsctl_lab.hardware import NodeHardware
from tests.conftest import FIXTURES

ALL = list(range(8))


@pytest.fixture
def node(tmp_path):
    state = tmp_path / "hardware.json"
    NodeHardware(node="gpu7").save(state)
    return state, dict(os.environ, OPSCTL_HW_STATE=str(state), OPSCTL_HW_SYSFS_ROOT=str(tmp_path / "sys"))


def inject(state, fault, gpu):
    hw = NodeHardware.load(state, "gpu7")
    hw.inject(fault, gpu=gpu)
    hw.save(state)


def dcgmi(env, *args):
    return subprocess.run([sys.executable, "-m", "opsctl_lab.hwtools.dcgmi", *args], env=env, capture_output=True,
                          text=True, timeout=30)


def test_a_healthy_node_passes_level_2_with_rc_0(node):
    _, env = node
    out = dcgmi(env, "diag", "-r", "2", "-j")
    assert out.returncode == 0, out.stderr
    report = process_dcgm_diag_output(out.stdout)
    assert report.tests == ("software", "memory", "pcie") and report.gpus == tuple(ALL)
    assert (report.version, report.driver_version) == ("4.6.0", "570.133.20")
    assert diag_verdict(report, ALL, 2).verdict == "pass"


@pytest.mark.parametrize("fault,gpu,rc,failed", [
    ("dbe", 2, 205, {("memory", 2), ("pcie", 2)}),  # DBE violation: ISOLATE severity
    ("row-remap-failure", 6, 226, {("software", 6)}),  # RESET severity; memory and pcie skip GPU 6
    ("row-remap-pending", 1, 226, {("software", 1)}),
    ("xid:79", 3, 205, {("software", g) for g in ALL} | {("memory", 3), ("pcie", 3)}),
])
def test_faults_fail_their_tests_with_dcgms_exit_code(node, fault, gpu, rc, failed):
    state, env = node
    inject(state, fault, gpu)
    out = dcgmi(env, "diag", "-r", "2", "-j")
    assert out.returncode == rc, out.stdout[-500:]
    verdict = diag_verdict(process_dcgm_diag_output(out.stdout), ALL, 2)
    assert verdict.verdict == "fail" and {(f.test, f.gpu) for f in verdict.failures} == failed


def test_only_the_gpus_asked_for_run(node):
    state, env = node
    inject(state, "dbe", 2)
    out = dcgmi(env, "diag", "-r", "2", "-i", "0,gpu:1", "-j")
    report = process_dcgm_diag_output(out.stdout)
    assert out.returncode == 0 and report.gpus == (0, 1)
    assert diag_verdict(report, [0, 1], 2).verdict == "pass"
    assert diag_verdict(report, [2], 2).verdict == "not_checked"


def test_a_lost_gpu_is_left_out_of_the_default_run_and_fails_a_run_that_names_it(node):
    state, env = node
    inject(state, "gpu-missing", 4)
    out = dcgmi(env, "diag", "-r", "1", "-j")
    report = process_dcgm_diag_output(out.stdout)
    assert out.returncode == 0 and 4 not in report.gpus
    assert diag_verdict(report, ALL, 1).verdict == "not_checked"
    named = dcgmi(env, "diag", "-r", "1", "-i", "3,4", "-j")
    assert named.returncode == 238
    assert json.loads(named.stdout) == {"DCGM Diagnostic": {
        "runtime_error": "Error: Unable to complete diagnostic for entities 3,4. Return: (-18) : GPU is lost\n",
        "version": "4.6.0"}}
    assert dcgmi(env, "diag", "-r", "1", "-i", "4").stdout.startswith("Error: Unable to complete diagnostic")


def test_the_table_without_j_has_the_real_frame(node):
    state, env = node
    inject(state, "thermal", 5)
    out = dcgmi(env, "diag", "-r", "3")
    real = (FIXTURES / "gpu" / "dcgmi_diag_r2_table_dcgm4.4.1_b200_issue253.txt").read_text().splitlines()
    lines = out.stdout.splitlines()
    assert out.returncode == 226 and lines[1:5] == real[:4] and {len(x) for x in lines[1:]} == {78}
    assert "| targeted_power            | Fail                                           |" in lines
    assert "| Warning: GPU5             | Temperature 9" in out.stdout


@pytest.mark.parametrize("args", [[], ["discovery", "-l"], ["diag", "-r", "5"], ["diag", "-i", "9"],
                                  ["diag", "--bogus"]])
def test_bad_arguments_exit_254_with_one_line(node, args):
    out = dcgmi(node[1], *args)
    assert out.returncode == 254 and len(out.stderr.strip().splitlines()) == 1 and out.stdout == ""
