"""The lab's `dcgmi diag` model (opsctl_lab.hwtools.dcgmi_diag) and its writers, in-process: which tests each
level runs, which faults fail which test as DCGM 4.6's checks do, the exit code, jsoncpp's layout against a real
document and dcgmi's table against a real one."""

import json
import re

import pytest

from opsctl.gpu.dcgm_diag import LEVEL_TESTS
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.hwtools import dcgmi_diag
from opsctl_lab.hwtools.dcgmi import diag_document, diag_table, styled
from opsctl_lab.hwtools.dcgmi_diag import exit_code, run_diag
from tests.conftest import FIXTURES

ALL = list(range(8))
REAL_TABLE = (FIXTURES / "gpu" / "dcgmi_diag_r2_table_dcgm4.4.1_b200_issue253.txt").read_text().splitlines()


def node(*faults):
    hw = NodeHardware(node="gpu1")
    for fault, gpu in faults:
        hw.inject(fault, gpu=gpu, now=100.0)
    return hw


def results(hw, level):
    """test -> {gpu: result}, and the run's exit code."""
    runs = run_diag(hw, level, ALL, 200.0)
    return {run.name: run.results for run in runs}, exit_code(runs)


def failing(found):
    return {(test, gpu) for test, by_gpu in found.items() for gpu, result in by_gpu.items() if result != "Pass"}


def test_jsoncpp_layout_rebuilds_the_real_document():
    real = (FIXTURES / "gpu" / "dcgmi_diag_r1_j_dcgm4.2.3_gb10.json").read_text()
    ours = styled(json.loads(real))
    assert ours.startswith("{\n\t\"DCGM Diagnostic\" : \n\t{\n") and ours.endswith("\n}\n")
    # jsoncpp writes " : " before a value on the next line; the capture's lines lost that trailing space.
    assert "\n".join(line.rstrip() for line in ours.split("\n")) == real


@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_each_level_runs_dcgm_4s_tests_and_the_parser_expects_the_same(level):
    found, rc = results(node(), level)
    assert set(found) == set(LEVEL_TESTS[level]) and rc == 0
    assert all(set(by_gpu.values()) == {"Pass"} and list(by_gpu) == ALL for by_gpu in found.values())


def test_dbe_fails_every_test_that_runs_on_the_gpu_but_software_and_isolates():
    found, rc = results(node(("dbe", 2)), 2)
    assert failing(found) == {("memory", 2), ("pcie", 2)} and rc == dcgmi_diag.RC_ISOLATE == 205
    assert failing(results(node(("dbe", 2)), 1)[0]) == set()


def test_thermal_fails_the_gpu_in_the_stress_tests_at_level_3_not_at_level_1():
    found, rc = results(node(("thermal", 6)), 3)
    assert {("targeted_power", 6), ("targeted_stress", 6)} <= failing(found) and rc == 226
    assert {gpu for _, gpu in failing(found)} == {6} and ("software", 6) not in failing(found)
    assert failing(results(node(("thermal", 6)), 1)[0]) == set()


@pytest.mark.parametrize("fault,code", [("row-remap-failure", 80), ("row-remap-pending", 84)])
def test_a_row_remap_problem_fails_software_and_later_tests_skip_the_gpu(fault, code):
    hw = node((fault, 3))
    runs = run_diag(hw, 2, ALL, 200.0)
    assert [(e.gpu, e.code) for e in runs[0].errors] == [(3, code)] and runs[0].results[3] == "Fail"
    for run in runs[1:]:
        assert list(run.results)[-1] == 3 and run.results[3] == "Skip" and run.overall() == "Pass"
        assert run.info[3] == [dcgmi_diag.SKIP_REASONS[code]]
    assert exit_code(runs) == 226  # DCGM_ERROR_RESET severity: not an isolation
    if fault == "row-remap-pending":  # the remap the fault adds is counted in DCGM's words
        assert "GPU 3 had uncorrectable memory errors and 1 rows were remapped" in runs[0].errors[0].text


@pytest.mark.parametrize("fault", ["remapped-rows", "nvlink-errors", "gpu-leftover-memory", "xid:13"])
def test_what_dcgm_4_6_does_not_fail(fault):
    # 9 remapped rows are below DCGM's 512; 25 NVLink CRC errors a second below pcie's 100; a compute process
    # is not a graphics one; XID 13's catalog action is the application's.
    assert results(node((fault, 1)), 4) == ({t: dict.fromkeys(ALL, "Pass") for t in LEVEL_TESTS[4]}, 0)


def test_nvlink_errors_at_dcgms_threshold_fail_pcie(monkeypatch):
    monkeypatch.setattr(dcgmi_diag, "CRC_PER_SECOND_LIMIT", 20)
    found, rc = results(node(("nvlink-errors", 4)), 2)
    assert failing(found) == {("pcie", 4)} and rc == 205


@pytest.mark.parametrize("fault,code,rc", [("xid:79", 126, 205), ("xid:119", 125, 226), ("xid-kernel:62", 125, 226)])
def test_an_xid_needing_a_reset_or_reboot_fails_software_for_all_and_the_gpus_cuda_tests(fault, code, rc):
    runs = run_diag(node((fault, 5)), 2, ALL, 200.0)
    software = runs[0]
    assert [(e.gpu, e.code) for e in software.errors] == [(5, code)]
    assert set(software.results.values()) == {"Fail"}  # the subtest sets the whole test's result
    assert {(run.name, gpu) for run in runs[1:] for gpu, r in run.results.items() if r != "Pass"} == {
        ("memory", 5), ("pcie", 5)}
    assert exit_code(runs) == rc


def test_persistence_off_warns_every_gpu_which_json_prints_as_fail():
    hw = node(("persistence-off", 0))
    runs = run_diag(hw, 1, ALL, 200.0)
    assert set(runs[0].results.values()) == {"Warn"} and exit_code(runs) == 226
    doc = diag_document(hw, runs, ALL)
    entries = doc["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["results"]
    assert {e["status"] for e in entries} == {"Fail"} and [e["entity_id"] for e in entries if "warnings" in e] == [0]
    warning = entries[0]["warnings"][0]
    assert (warning["error_id"], warning["error_category"], warning["error_severity"]) == (29, 8, 5)
    assert warning["warning"] == ('Persistence Mode: Persistence mode for GPU 0 is disabled. Enable persistence mode '
                                  'by running "nvidia-smi -i <gpuId> -pm 1 " as root.')  # the GB10 capture's words


def _skeleton(line):
    return re.sub(r"[^|+=-]", " ", line)


def test_the_table_has_the_real_layout():
    hw = node(("dbe", 1))
    lines = diag_table(hw, run_diag(hw, 2, ALL, 200.0), ALL).splitlines()
    assert lines[0] == "Successfully ran diagnostic for group."
    assert lines[1:5] == REAL_TABLE[:4] and lines[-1] == REAL_TABLE[-1]
    assert {len(line) for line in lines[1:]} == {78}
    assert {_skeleton(line) for line in lines[1:]} <= {_skeleton(line) for line in REAL_TABLE}
    for header in ("|-----  Deployment  ", "+-----  Hardware  ", "+-----  Integration  "):
        assert next(x for x in lines if x.startswith(header)) == next(x for x in REAL_TABLE if x.startswith(header))
    assert "|                           | GPU1: Fail                                     |" in lines
    assert any(line.startswith("| Warning: GPU1             | Detected 1 ecc_dbe_volatile_total for GPU 1") for line
               in lines)
