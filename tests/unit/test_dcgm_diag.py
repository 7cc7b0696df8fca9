"""opsctl.gpu.dcgm_diag over real `dcgmi diag -j` documents (tests/fixtures/gpu, SOURCES.md) and over the lab
emulator's, built in-process: per-test per-GPU statuses, and the verdict that only every test passing on every
GPU asked about is a pass."""

import json

import pytest

from opsctl.errors import SourceUnavailable
from opsctl.gpu.dcgm_diag import LEVEL_TESTS, diag_verdict, level_tests, process_dcgm_diag_output
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.hwtools.dcgmi import diag_document, styled
from opsctl_lab.hwtools.dcgmi_diag import run_diag
from tests.conftest import FIXTURES

GB10 = (FIXTURES / "gpu" / "dcgmi_diag_r1_j_dcgm4.2.3_gb10.json").read_text()
ISSUE_215 = (FIXTURES / "gpu" / "dcgmi_diag_r3_j_dcgm4_8gpu_diagnostic_issue215.txt").read_text()
ALL = list(range(8))


def emulated(level, *faults, gpus=ALL):
    """The lab's `dcgmi diag -r LEVEL -j` text for a node with these (fault, gpu) injected."""
    hw = NodeHardware(node="gpu1")
    for fault, gpu in faults:
        hw.inject(fault, gpu=gpu, now=100.0)
    present = [g for g in gpus if hw.gpu_present(g)]
    return styled(diag_document(hw, run_diag(hw, level, present, 200.0), present))


def test_the_real_gb10_document_fails_software_on_gpu_0_with_dcgms_words():
    report = process_dcgm_diag_output(GB10)
    assert (report.version, report.driver_version, report.gpus, report.tests) == ("4.2.3", "580.82.09", (0,),
                                                                                   ("software",))
    verdict = diag_verdict(report, [0], 1)
    assert verdict.verdict == "fail" and [(f.test, f.gpu, f.status) for f in verdict.failures] == [
        ("software", 0, "fail")]
    assert "Persistence mode for GPU 0 is disabled" in verdict.failures[0].message
    assert verdict.describe().startswith("fail: software on GPU 0: fail (Persistence Mode:")


def test_a_real_8_gpu_test_entry_reads_pass_per_gpu_with_its_info():
    entry = json.loads(ISSUE_215.strip().rstrip(","))  # the excerpt is one test object of the document
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [entry]}]}}
    report = process_dcgm_diag_output(json.dumps(doc))
    assert [report.result("diagnostic", g).status for g in ALL] == ["pass"] * 8
    assert report.result("diagnostic", 0).messages[-1] == "GPU 0 calculated at approximately 859.08 gigaflops " \
                                                          "during this test"
    # Level 3 runs more than `diagnostic`: the tests the document lacks are not checked, never passed.
    verdict = diag_verdict(report, ALL, 3)
    assert verdict.verdict == "not_checked"
    assert {f.test for f in verdict.unchecked} == set(LEVEL_TESTS[3]) - {"diagnostic"}
    assert {f.status for f in verdict.unchecked} == {"missing"}


@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_a_healthy_emulated_node_passes_every_level(level):
    report = process_dcgm_diag_output(emulated(level))
    assert set(report.tests) == set(level_tests(level))
    assert diag_verdict(report, ALL, level).verdict == "pass"


def test_a_failure_names_the_test_the_gpu_and_dcgms_message():
    verdict = diag_verdict(process_dcgm_diag_output(emulated(2, ("dbe", 2))), ALL, 2)
    assert verdict.verdict == "fail"
    assert [(f.test, f.gpu) for f in verdict.failures] == [("memory", 2), ("pcie", 2)]
    assert verdict.failures[0].message.startswith("Detected 1 ecc_dbe_volatile_total for GPU 2")
    # The other GPUs passed: asked about alone, they pass.
    assert diag_verdict(process_dcgm_diag_output(emulated(2, ("dbe", 2))), [0, 1, 3], 2).verdict == "pass"


def test_a_skipped_test_is_not_checked_even_when_dcgms_summary_says_pass():
    doc = json.loads(emulated(2, ("row-remap-pending", 3)))
    software = doc["DCGM Diagnostic"]["test_categories"][0]["tests"][0]
    memory = doc["DCGM Diagnostic"]["test_categories"][1]["tests"][0]
    assert memory["test_summary"]["status"] == "Pass"  # one GPU skipped, the others passed (DCGM issues 55, 284)
    verdict = diag_verdict(process_dcgm_diag_output(json.dumps(doc)), [3], 2)
    assert verdict.verdict == "fail" and [f.test for f in verdict.failures] == ["software"]
    # Were software to pass GPU 3, its skipped memory and pcie tests still would not make a pass.
    software["results"][3] = {**software["results"][3], "status": "Pass", "warnings": []}
    software["test_summary"] = {"status": "Pass"}
    verdict = diag_verdict(process_dcgm_diag_output(json.dumps(doc)), [3], 2)
    assert verdict.verdict == "not_checked"
    assert [(f.test, f.status) for f in verdict.unchecked] == [("memory", "skip"), ("pcie", "skip")]
    assert "previously detected uncorrectable row remapping" in verdict.unchecked[0].message


def test_a_gpu_the_run_left_out_is_not_checked():
    text = emulated(2, ("gpu-missing", 4))
    report = process_dcgm_diag_output(text)
    assert 4 not in report.gpus
    verdict = diag_verdict(report, ALL, 2)
    assert verdict.verdict == "not_checked" and {(f.gpu, f.status) for f in verdict.unchecked} == {(4, "missing")}
    assert diag_verdict(report, [0, 5], 2).verdict == "pass"


def test_a_run_that_did_not_happen_checked_nothing():
    text = styled({"DCGM Diagnostic": {"runtime_error": "Error: Unable to complete diagnostic for entities 3. "
                                                        "Return: (-18) : GPU is lost\n", "version": "4.6.0"}})
    report = process_dcgm_diag_output(text)
    assert report.runtime_error.endswith("GPU is lost") and report.results == ()
    verdict = diag_verdict(report, [3], 1)
    assert verdict.verdict == "not_checked" and verdict.unchecked[0].status == "error"


def test_a_test_failing_without_a_gpu_failing_checked_none_of_them():
    # DCGM issue 253: pcie Fail with a warning of its own while every GPU shows Pass.
    doc = json.loads(GB10)
    test = doc["DCGM Diagnostic"]["test_categories"][0]["tests"][0]
    test["results"][0]["status"] = "Pass"
    del test["results"][0]["warnings"]
    test["test_summary"]["warnings"] = [{"warning": "There was an internal error during the test"}]
    report = process_dcgm_diag_output(json.dumps(doc))
    result = report.result("software", 0)
    assert (result.status, result.messages) == ("error", ("There was an internal error during the test",))
    assert diag_verdict(report, [0], 1).verdict == "not_checked"


@pytest.mark.parametrize("word,status,verdict", [("Warn", "warn", "fail"), ("Not Run", "not_run", "not_checked"),
                                                 ("Inconclusive", "error", "not_checked"), ("Skip", "skip",
                                                                                            "not_checked")])
def test_every_status_but_pass_keeps_a_gpu_from_passing(word, status, verdict):
    doc = json.loads(GB10)
    doc["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["results"][0]["status"] = word
    doc["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["test_summary"]["status"] = "Pass"
    report = process_dcgm_diag_output(json.dumps(doc))
    assert report.result("software", 0).status == status
    assert diag_verdict(report, [0], 1).verdict == verdict


@pytest.mark.parametrize("text,why", [
    ("", "not JSON"), ("Error: could not connect to the host engine", "not JSON"), ("{not json", "not JSON"),
    ("[]", "not a JSON object"), ('{"DCGM GPU Diagnostic": {}}', "no `DCGM Diagnostic`"),
    ('{"DCGM Diagnostic": {}}', "`test_categories` is not a JSON list"),
    ('{"DCGM Diagnostic": {"test_categories": [{"tests": [{"name": "memory", "results": [{"status": "Pass"}]}]}]}}',
     "test memory: a result without an entity_id"),
])
def test_malformed_output_is_a_clear_error(text, why):
    with pytest.raises(SourceUnavailable, match=f"dcgmi diag: .*{why}"):
        process_dcgm_diag_output(text)


def test_the_verdict_needs_a_level_and_gpus():
    report = process_dcgm_diag_output(GB10)
    with pytest.raises(ValueError):
        diag_verdict(report, [0], 5)
    with pytest.raises(ValueError):
        diag_verdict(report, [], 1)
