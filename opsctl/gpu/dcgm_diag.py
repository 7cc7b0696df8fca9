"""Parse DCGM 4's `dcgmi diag -r <level> -j` and judge it for a set of GPUs.

The document (dcgmi/Diag.cpp HelperJsonBuildOutput, NVIDIA/DCGM 4.6.0; a real one of DCGM 4.2.3:
tests/fixtures/gpu/dcgmi_diag_r1_j_dcgm4.2.3_gb10.json), abridged:

    {
        "DCGM Diagnostic" : {"test_categories" : [{
            "category" : "Deployment",
            "tests" : [{
                "name" : "software",
                "results" : [{"entity_group" : "GPU", "entity_group_id" : 1, "entity_id" : 0, "status" : "Fail",
                              "warnings" : [{"error_category" : 8, "error_id" : 29, "error_severity" : 5,
                                             "warning" : "Persistence Mode: Persistence mode for GPU 0 is ..."}]}],
                "test_summary" : {"status" : "Fail"}}]}]},
        "entity_groups" : [{"entities" : [{"device_id" : "2e12", "entity_id" : 0, ...}], "entity_group" : "GPU",
                            "entity_group_id" : 1}],
        "metadata" : {"Driver Version Detected" : "580.82.09", "version" : "4.2.3"}
    }

A run that could not start is `{"DCGM Diagnostic" : {"runtime_error" : "Error: ...", "version" : "..."}}`.

What the statuses mean (Diag.cpp HelperDisplayDiagResult): "Pass", "Skip", "Fail"; JSON prints a Warn as
"Fail" ("Warn" is read too, from older or other writers); a test that did not run on a GPU has no entry for it
("Not Run" is read too). A test's `test_summary` passes when one GPU passed and the others were skipped
(NVIDIA/DCGM issues 55 and 284: skipped tests counted as passes), so the verdict looks at each GPU's own entry.
A summary that fails while no GPU does carries an error of the test itself (issue 253: the pcie test's child
process output could not be parsed): that test checked no GPU.

dcgmi exits 0, 226 (a test found an error) or 205 (one of ISOLATE severity); the caller checks that code, this
module only reads what was printed.
"""

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, cast

from opsctl.errors import SourceUnavailable

Status = Literal["pass", "fail", "warn", "skip", "not_run", "error"]
Verdict = Literal["pass", "fail", "not_checked"]
_WORDS: dict[str, Status] = {"pass": "pass", "fail": "fail", "warn": "warn", "skip": "skip", "not run": "not_run"}
# The tests each level runs (nvvs/src/NvidiaValidationSuite.cpp FillTestVectors, DCGM 4.6.0), leaving out those
# that run only where installed or as root (nvbandwidth, nccl_tests, eud, cpu_eud): present, they count too.
LEVEL_TESTS: dict[int, tuple[str, ...]] = {
    1: ("software",),
    2: ("software", "memory", "pcie"),
    3: ("software", "memory", "pcie", "diagnostic", "memory_bandwidth", "targeted_stress", "targeted_power"),
    4: ("software", "memory", "pcie", "diagnostic", "memory_bandwidth", "targeted_stress", "targeted_power",
        "memtest", "pulse_test"),
}
WHERE = "dcgmi diag"


@dataclass(frozen=True)
class TestResult:
    test: str
    category: str
    gpu: int
    status: Status
    messages: tuple[str, ...]  # DCGM's warnings for this GPU; for a skip, its reason


@dataclass(frozen=True)
class DiagReport:
    version: str | None
    driver_version: str | None
    gpus: tuple[int, ...]  # the GPU entities the run covered
    tests: tuple[str, ...]  # the tests in the document, in its order
    results: tuple[TestResult, ...]
    runtime_error: str | None = None  # the run did not happen: there are no results

    def result(self, test: str, gpu: int) -> TestResult | None:
        return next((r for r in self.results if r.test == test and r.gpu == gpu), None)


@dataclass(frozen=True)
class Finding:
    test: str
    gpu: int
    status: Status | Literal["missing"]
    message: str


@dataclass(frozen=True)
class DiagVerdict:
    verdict: Verdict
    failures: tuple[Finding, ...]  # a test failed (or warned) on a GPU
    unchecked: tuple[Finding, ...]  # a test skipped, errored, not run or missing on a GPU

    def describe(self) -> str:
        """One line: the verdict and what decided it."""
        shown = self.failures or self.unchecked
        parts = [f"{f.test} on GPU {f.gpu}: {f.status}" + (f" ({f.message})" if f.message else "") for f in shown]
        return self.verdict + (": " + "; ".join(parts) if parts else "")


def _bad(why: str) -> SourceUnavailable:
    return SourceUnavailable(f"{WHERE}: {why}")


def _object(value: object, what: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise _bad(f"{what} is not a JSON object")
    return cast(dict[str, object], value)


def _list(value: object, what: str) -> list[object]:
    if not isinstance(value, list):
        raise _bad(f"{what} is not a JSON list")
    return value


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _messages(entry: dict[str, object], key: str) -> tuple[str, ...]:
    """`warnings` are objects with a `warning`; plain strings are read as well. `info` is strings."""
    items = _list(entry.get(key, []), f"a result's {key}")
    texts = [item.get("warning") if isinstance(item, dict) else item for item in items]
    return tuple(t for t in texts if isinstance(t, str))


def _status(word: object, test: str) -> Status:
    if not isinstance(word, str):
        raise _bad(f"test {test}: a status that is not text: {word!r}")
    return _WORDS.get(word.strip().lower(), "error")


def process_dcgm_diag_output(text: str) -> DiagReport:
    """The per-test, per-GPU results of `dcgmi diag -j`. Raises SourceUnavailable for anything that is not
    DCGM 4's document."""
    try:
        doc = _object(json.loads(text), "the output")
    except ValueError as err:
        raise _bad(f"output is not JSON ({err}): {text.strip()[:80]!r}") from None
    if "DCGM Diagnostic" not in doc:
        raise _bad("no `DCGM Diagnostic` object (DCGM 3's `DCGM GPU Diagnostic` and -r with --iterations are "
                   "not read)")
    diag = _object(doc["DCGM Diagnostic"], "`DCGM Diagnostic`")
    metadata = _object(doc.get("metadata", {}), "`metadata`")
    version = _text(metadata.get("version")) or _text(diag.get("version"))
    driver = _text(metadata.get("Driver Version Detected"))
    if isinstance(diag.get("runtime_error"), str):
        return DiagReport(version, driver, (), (), (), runtime_error=str(diag["runtime_error"]).strip())
    gpus = []
    for item in _list(doc.get("entity_groups", []), "`entity_groups`"):
        group = _object(item, "an entity group")
        if group.get("entity_group") == "GPU":
            gpus += [e["entity_id"] for e in _list(group.get("entities", []), "entities")
                     if isinstance(e, dict) and isinstance(e.get("entity_id"), int)]
    tests, results = [], []
    for item in _list(diag.get("test_categories"), "`test_categories`"):
        category = _object(item, "a test category")
        for test in _list(category.get("tests"), "a category's `tests`"):
            name, found = _test(_object(test, "a test"), str(category.get("category", "")))
            tests.append(name)
            results += found
    return DiagReport(version, driver, tuple(gpus), tuple(tests), tuple(results))


def _test(test: dict[str, object], category: str) -> tuple[str, list[TestResult]]:
    name = test.get("name")
    if not isinstance(name, str):
        raise _bad("a test without a name")
    found = []
    for item in _list(test.get("results", []), f"test {name}: `results`"):
        entry = _object(item, f"test {name}: a result")
        if entry.get("entity_group") not in ("GPU", None):  # a CPU's (cpu_eud): not a GPU's result
            continue
        gpu = entry.get("entity_id")
        if not isinstance(gpu, int):
            raise _bad(f"test {name}: a result without an entity_id")
        status = _status(entry.get("status"), name)
        word = [f"status {entry.get('status')!r}"] if status == "error" else []
        found.append(TestResult(name, category, gpu, status,
                                (*_messages(entry, "warnings"), *_messages(entry, "info"), *word)))
    summary = _object(test.get("test_summary", {}), f"test {name}: `test_summary`")
    if "status" in summary and _status(summary["status"], name) not in ("pass", "skip") and \
            not any(r.status in ("fail", "warn") for r in found):
        # The test failed, yet no GPU did: an error of the test itself, which then checked none of them.
        own = {m for r in found for m in r.messages}
        why = tuple(m for m in _messages(summary, "warnings") if m not in own) or ("the test failed, no GPU named",)
        found = [TestResult(r.test, r.category, r.gpu, "error", why) if r.status == "pass" else r for r in found]
    return name, found


def level_tests(level: int) -> tuple[str, ...]:
    if level not in LEVEL_TESTS:
        raise ValueError(f"dcgmi diag levels are 1-4, not {level!r}")
    return LEVEL_TESTS[level]


def diag_verdict(report: DiagReport, gpus: Iterable[int], level: int) -> DiagVerdict:
    """"pass" only when every test of `level` (and any other test in the report) passed on every GPU of `gpus`;
    "fail" when one failed or warned on one of them; else "not_checked": a test skipped, errored, not run or
    missing on a GPU, or a run that did not happen, never counts as a pass."""
    expected = level_tests(level)
    asked = sorted(set(gpus))
    if not asked:
        raise ValueError("diag_verdict needs the GPUs to judge")
    failures, unchecked = [], []
    for test in expected + tuple(t for t in dict.fromkeys(report.tests) if t not in expected):
        for gpu in asked:
            result = report.result(test, gpu)
            if report.runtime_error is not None:
                unchecked.append(Finding(test, gpu, "error", report.runtime_error))
            elif result is None:
                unchecked.append(Finding(test, gpu, "missing", "no result for this GPU"))
            elif result.status in ("fail", "warn"):
                failures.append(Finding(test, gpu, result.status, " | ".join(result.messages)))
            elif result.status != "pass":
                unchecked.append(Finding(test, gpu, result.status, " | ".join(result.messages)))
    verdict: Verdict = "fail" if failures else "not_checked" if unchecked else "pass"
    return DiagVerdict(verdict, tuple(failures), tuple(unchecked))
