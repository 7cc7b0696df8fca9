"""Emulated `dcgmi` (DCGM 4.6) of a lab machine: `dcgmi diag`, in JSON (-j) or as dcgmi's table.

    dcgmi diag -r 1|2|3|4 [-i 0,1|gpu:0,gpu:1|*] [-j] [-v]

What the tests find comes from the hardware state (dcgmi_diag.py). The JSON is what dcgmi/Diag.cpp
HelperJsonBuildOutput builds (NVIDIA/DCGM @ 72fa3feaa67d716a75323a8f47c34ff3ee73f824), written as jsoncpp's
Value::toStyledString writes it: tab indents, `"key" : value`, members in byte order, an object or array value
on the line after its key, a short array of scalars on one line. Real documents: tests/fixtures/gpu/dcgmi_diag_*.
A result's `status` is "Pass", "Skip" or "Fail": JSON prints a Warn as "Fail" (HelperDisplayDiagResult without
DDR_DISPLAY_WARN); a test that did not run on a GPU has no entry for it. The table is HelperDisplayAsCli's
(real one: tests/fixtures/gpu/dcgmi_diag_r2_table_dcgm4.4.1_b200_issue253.txt).

A GPU that fell off the bus (gpu-missing) is left out of the default entity list `*,cpu:*`, as DCGM leaves out
a GPU it lost; naming it with -i fails the whole run with a runtime error, "Return: (-18) : GPU is lost"
(Diag.cpp RunDiagOnce; judgement: which of the two real DCGM does for a lost GPU was not found).
Return codes: 0, 226 a test found an error, 205 one of ISOLATE severity, 238 a lost GPU, 254 bad arguments
(main returns the dcgmReturn_t, -2 for a TCLAP exception; the shell sees it modulo 256).
"""

import json
import sys
import time
from typing import Any

from opsctl_lab import hardware as hwm
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.hwtools.common import load, main_guard
from opsctl_lab.hwtools.dcgmi_diag import CODES, DCGM_VERSION, DEVICE_ID, DiagError, TestRun, exit_code, run_diag
from opsctl_lab.hwtools.nvidia_smi import gpu_serial

RC_GPU_IS_LOST, RC_BAD_ARGS = 238, 254
GPU_GROUP = {"entity_group": "GPU", "entity_group_id": 1}
RIGHT_MARGIN = 74  # jsoncpp's StyledStreamWriter


class Usage(Exception):
    pass


# ---- JSON --------------------------------------------------------------------------------------------------
def _warning(e: DiagError) -> dict[str, Any]:
    return {"error_category": CODES[e.code][1], "error_id": e.code, "error_severity": e.severity, "warning": e.text}


def _status(result: str) -> str:
    return "Fail" if result == "Warn" else result


def diag_document(hw: NodeHardware, runs: list[TestRun], gpus: list[int]) -> dict[str, Any]:
    categories: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        entries = []
        for gpu, result in run.results.items():
            entry: dict[str, Any] = {**GPU_GROUP, "entity_id": gpu, "status": _status(result)}
            if warnings := [_warning(e) for e in run.errors if e.gpu == gpu]:
                entry["warnings"] = warnings
            if run.info.get(gpu):
                entry["info"] = run.info[gpu]
            entries.append(entry)
        summary: dict[str, Any] = {"status": _status(run.overall())}
        if run.errors:  # the summary lists every error of the test (HelperJsonAddResult, includeAllErrors)
            summary["warnings"] = [_warning(e) for e in run.errors]
        test: dict[str, Any] = {"name": run.name, "test_summary": summary}
        if entries:
            test["results"] = entries
        categories.setdefault(run.category, []).append(test)
    return {
        "DCGM Diagnostic": {"test_categories": [{"category": c, "tests": t} for c, t in categories.items()]},
        "entity_groups": [{**GPU_GROUP, "entities": [{"device_id": DEVICE_ID, "entity_id": gpu,
                                                      "serial_num": gpu_serial(hw.node, gpu)} for gpu in gpus]}],
        "metadata": {"Driver Version Detected": hw.loaded_driver(), "version": DCGM_VERSION},
    }


def styled(value: object) -> str:
    """jsoncpp's Value::toStyledString (BuiltStyledStreamWriter, indentation "\\t")."""
    writer = _Styled()
    writer.value(value)
    return "".join(writer.out) + "\n"


class _Styled:
    def __init__(self) -> None:
        self.out: list[str] = []
        self.indent = ""
        self.indented = True  # write() starts indented: the document's "{" opens the first line

    def with_indent(self, text: str) -> None:
        if not self.indented:
            self.out.append("\n" + self.indent)
        self.out.append(text)
        self.indented = False

    def value(self, value: object) -> None:
        if isinstance(value, dict) and value:
            self.with_indent("{")
            self.indent += "\t"
            for i, key in enumerate(sorted(value)):
                self.with_indent(json.dumps(key) + " : ")
                self.value(value[key])
                self.out.append("," if i < len(value) - 1 else "")
            self.indent = self.indent[:-1]
            self.with_indent("}")
        elif isinstance(value, list) and value:
            self.array(value)
        else:
            self.out.append(_scalar(value))

    def array(self, items: list[Any]) -> None:
        complex_ = any(isinstance(v, dict | list) and v for v in items)
        scalars = None if complex_ or len(items) * 3 >= RIGHT_MARGIN else [_scalar(v) for v in items]
        if scalars is not None and 4 + 2 * (len(items) - 1) + sum(map(len, scalars)) < RIGHT_MARGIN:
            self.out.append("[ " + ", ".join(scalars) + " ]")
            return
        self.with_indent("[")
        self.indent += "\t"
        for i, item in enumerate(items):
            if scalars is not None:
                self.with_indent(scalars[i])
            else:
                if not self.indented:
                    self.out.append("\n" + self.indent)
                self.indented = True
                self.value(item)
                self.indented = False
            self.out.append("," if i < len(items) - 1 else "")
        self.indent = self.indent[:-1]
        self.with_indent("]")


def _scalar(value: object) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return json.dumps(value)


# ---- table -------------------------------------------------------------------------------------------------
LINE = "+---------------------------+------------------------------------------------+"
CATEGORY_LINES = {
    "Deployment": "|-----  Deployment  --------+------------------------------------------------|",
    "Hardware": "+-----  Hardware  ----------+------------------------------------------------+",
    "Integration": "+-----  Integration  -------+------------------------------------------------+",
    "Stress": "+-----  Stress  ------------+------------------------------------------------+",
}


def _row(name: str, info: str) -> str:
    return f"| {name:<25} | {info:<46} |"


def _wrapped(name: str, text: str) -> list[str]:
    """Diag::DisplayVerboseInfo: 45 characters a line, the name on the first only."""
    return [_row(name if i == 0 else "", text[i:i + 45]) for i in range(0, len(text.strip()), 45)]


def diag_table(hw: NodeHardware, runs: list[TestRun], gpus: list[int]) -> str:
    out = ["Successfully ran diagnostic for group.", LINE, _row("Diagnostic", "Result"),
           LINE.replace("-", "="),
           "|-----  Metadata  ----------+------------------------------------------------|",
           _row("DCGM Version", DCGM_VERSION), _row("Driver Version Detected", hw.loaded_driver()),
           _row("GPU Device IDs Detected", ", ".join([DEVICE_ID] * len(gpus)))]
    for category, header in CATEGORY_LINES.items():  # HelperDisplayAsCli's order, whatever the run's
        tests = [run for run in runs if run.category == category]
        out += [header] if tests else []
        for run in tests:
            out.append(_row(run.name, run.overall()))
            for gpu, result in run.results.items():
                out.append(_row("", f"GPU{gpu}: {_status(result)}"))
                for e in run.errors:
                    out += _wrapped(f"Warning: GPU{gpu}", e.text.strip()) if e.gpu == gpu else []
    return "\n".join(out + [LINE]) + "\n"


# ---- command line ------------------------------------------------------------------------------------------
def _parse(argv: list[str]) -> dict[str, Any]:
    if not argv or argv[0] != "diag":
        raise Usage("this emulator knows only `dcgmi diag`")
    opts: dict[str, Any] = {"level": "1", "entities": "*,cpu:*", "json": False}
    args = argv[1:]
    while args:
        arg = args.pop(0)
        if arg in ("-r", "--run", "-i", "--entity-id") and args:
            opts["level" if arg in ("-r", "--run") else "entities"] = args.pop(0)
        elif arg in ("-j", "--json"):
            opts["json"] = True
        elif arg not in ("-v", "--verbose"):
            raise Usage(f"Couldn't find match for argument: {arg}")
    if opts["level"] not in ("1", "2", "3", "4"):
        raise Usage(f"this emulator runs levels 1-4, not {opts['level']!r}")
    return opts


def entity_gpus(text: str) -> tuple[list[int], bool]:
    """-i's GPUs, and whether they were named (else: every GPU, `*`)."""
    named, everything = [], False
    for item in text.split(","):
        item = item.strip().removeprefix("gpu:")
        if item == "*":
            everything = True
        elif item.isdigit() and int(item) < hwm.GPUS_PER_NODE:
            named.append(int(item))
        elif not item.startswith("cpu:"):
            raise Usage(f"Invalid entity id: {item}")
    return (list(range(hwm.GPUS_PER_NODE)) if everything else sorted(set(named))), not everything


def main(argv: list[str]) -> int:
    try:
        opts = _parse(argv)
        gpus, named = entity_gpus(opts["entities"])
    except Usage as err:
        sys.stderr.write(f"Error: {err}\n")
        return RC_BAD_ARGS
    hw = load()
    if named and any(not hw.gpu_present(g) for g in gpus):
        msg = f"Error: Unable to complete diagnostic for entities {opts['entities']}. Return: (-18) : GPU is lost\n"
        runtime = {"DCGM Diagnostic": {"runtime_error": msg, "version": DCGM_VERSION}}
        sys.stdout.write(styled(runtime) if opts["json"] else msg + "\n")
        return RC_GPU_IS_LOST
    gpus = [g for g in gpus if hw.gpu_present(g)]
    runs = run_diag(hw, int(opts["level"]), gpus, time.time())
    sys.stdout.write(styled(diag_document(hw, runs, gpus)) if opts["json"] else diag_table(hw, runs, gpus))
    return exit_code(runs)


if __name__ == "__main__":
    sys.exit(main_guard(main))
