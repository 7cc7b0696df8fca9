"""What `dcgmi diag -r 1|2|3|4` of DCGM 4.6 finds on an emulated H200 node, from its hardware state.

Read from NVIDIA/DCGM @ 72fa3feaa67d716a75323a8f47c34ff3ee73f824 (DCGM 4.6.0):
- Which tests a level runs (nvvs/src/NvidiaValidationSuite.cpp, FillTestVectors): 1 `software`; 2 adds
  `memory` and `pcie`; 3 adds `diagnostic`, `memory_bandwidth`, `targeted_stress`, `targeted_power` (and
  eud/cpu_eud as root, nvbandwidth and nccl_tests where installed: not emulated); 4 adds `memtest` and
  `pulse_test`. Categories from nvvs/include/PluginStrings.h.
- `software` (nvvs/src/Software.cpp, one run per subtest, each GPU keeping its worst result:
  DcgmNvvsResponseWrapper SetSoftwareTestResult) fails a GPU with a failed row remap (error 80), a pending remap
  (85, or 84 when rows were remapped too) or 512+ remapped rows (132); every later test then skips that GPU with
  an info line (EntitySet::UpdateSkippedEntities). Its "GPU Recovery State" subtest reads the driver's recovery
  action, which an XID needing a GPU reset (error 125) or a reboot (126) sets: that subtest, and persistence
  mode off (error 29, a Warn, which JSON prints as "Fail"), set the result of every GPU of the test, the error
  naming only the GPU concerned. It does not look at ECC counters or temperatures.
- Every other test ends with CheckCommonErrors (nvvs/src/DcgmRecorder.cpp) on each GPU: a volatile DBE that
  rises during the test (103), a temperature above the max operating one (42), an XID during the test.
  `pcie` also fails NVLink CRC errors at 100 or more per second (nvlink_crc_error_threshold, Pcie.cpp); the
  lab's nvlink-errors fault rises 20 + 5 per second, so DCGM passes it, as issue #198 saw DCGM pass with
  NVLinks down. 9 remapped rows (remapped-rows) pass as well: below the limit of 512.
- A GPU whose fabric Fabric Manager has not trained (after a boot or a reset, `fabric-stuck`, `fabricmanager-down`)
  cannot make a CUDA context: CUDA answers CUDA_ERROR_SYSTEM_NOT_READY, and every test after `software` fails it
  (error 66, judgement as below).
- The lab's XID faults (xid, xid-kernel) whose NVIDIA catalog action is a GPU reset or a reboot (as
  opsctl.health.xid reads the catalog) stand for a driver whose recovery action says so. Judgement, not
  source: such a GPU cannot make a CUDA context until that happens, so every other test fails it (error 66).
- Exit code (dcgmi/Diag.cpp GetFailureResult; main returns the dcgmReturn_t): 0, or 226 (-30,
  DCGM_ST_NVVS_ERROR) when a test has an error, 205 (-51, NVVS_ISOLATE_ERROR) when one is of ISOLATE severity.
"""

from dataclasses import dataclass, field

from opsctl_lab.dcgm_emulator import GpuView
from opsctl_lab.hardware import FABRIC_SUCCESS, FAULTS, XID_FAULTS, NodeHardware

DCGM_VERSION = "4.6.0"
DEVICE_ID = "2335"  # "Device Id : 0x233510DE" of the real H200 capture (nvidia-smi -q)
# "GPU Max Operating Temp : 87 C" of a 700 W SXM GPU's nvidia-smi -q (public GitHub text, search index id
# 19173983937): DCGM_FI_DEV_GPU_MAX_OP_TEMP_CELSIUS, the maximum CheckGpuTemperature holds a GPU to.
MAX_OP_TEMP_C = 87
REMAP_LIMIT = 512  # DCGM_LIMIT_MAX_ROW_REMAP_UNCORRECTABLE, common/DcgmGPUHardwareLimits.h
CRC_PER_SECOND_LIMIT = 100  # the pcie plugin's nvlink_crc_error_threshold default
RC_NVVS_ERROR, RC_ISOLATE = 226, 205
ISOLATE = 2
# Test, category, the level that adds it; in the order nvvs runs them (software, hardware, integration,
# performance classes).
TESTS = [("software", "Deployment", 1), ("memory", "Hardware", 2), ("diagnostic", "Hardware", 3),
         ("memtest", "Stress", 4), ("pulse_test", "Hardware", 4), ("pcie", "Integration", 2),
         ("memory_bandwidth", "Stress", 3), ("targeted_stress", "Stress", 3), ("targeted_power", "Stress", 3)]

SYSTEM_TRIAGE = "Check DCGM and system logs for errors. Reset GPU. Restart DCGM. Rerun diagnostics."
FIELD_DIAG = "Run a field diagnostic on the GPU."
COOLING = ("Verify that the cooling on this machine is functional, including external, thermal material interface, "
           "fans, and any other components.")
# error id -> (severity, category, next steps): dcgmlib/src/dcgm_errors.c and dcgmlib/dcgm_errors.h.
CODES = {
    29: (5, 8, 'Enable persistence mode by running "nvidia-smi -i <gpuId> -pm 1 " as root.'),
    38: (2, 1, SYSTEM_TRIAGE),
    42: (1, 9, "Verify that the user-specified temperature maximum is set correctly. If it is, check the cooling "
               "for this GPU and node: " + COOLING),
    66: (4, 6, "Please make sure the correct driver version is installed and verify that no conflicting libraries "
               "are present."),
    125: (6, 15, "Terminate all GPU processes and reset the GPU."),
    126: (2, 15, "Reboot the operating system to restore a consistent state."),
    80: (6, 10, "Row remapping failure indicates unrecoverable memory hardware damage. Reset the GPU or reboot the "
                "node immediately."),
    84: (6, 10, ""),
    85: (6, 10, SYSTEM_TRIAGE),
    103: (2, 10, FIELD_DIAG),
    132: (4, 10, FIELD_DIAG),
}
SKIP_REASONS = {  # nvvs/include/EntitySet.h
    80: "Skipping this test due to previously detected row remapping failure.",
    84: "Skipping this test due to previously detected uncorrectable row remapping.",
    85: "Skipping this test due to previously detected pending row remapping.",
}
# cuGetErrorString(CUDA_ERROR_DEVICE_UNAVAILABLE): what context creation is taken to answer on such a GPU.
CUDA_UNAVAILABLE = "CUDA-capable device(s) is/are busy or unavailable"
# cuGetErrorString(CUDA_ERROR_SYSTEM_NOT_READY, 802): CUDA's answer on an NVSwitch system whose fabric Fabric
# Manager has not trained (NVIDIA/nccl-tests issue 264: "Test CUDA failure ... 'system not yet initialized'", and
# dcgmi diag unable to initialize CUDA on the same node).
CUDA_NOT_READY = "system not yet initialized"


@dataclass(frozen=True)
class DiagError:
    gpu: int
    code: int
    text: str  # the message with DCGM's next steps, as the JSON's `warning` holds it

    @property
    def severity(self) -> int:
        return CODES[self.code][0]


def error(gpu: int, code: int, message: str, prefix: str = "") -> DiagError:
    steps = CODES[code][2]
    return DiagError(gpu, code, f"{prefix}{message}" + (f" {steps}" if steps else ""))


@dataclass
class TestRun:
    name: str
    category: str
    results: dict[int, str] = field(default_factory=dict)  # GPU -> Pass | Warn | Fail | Skip, in report order
    errors: list[DiagError] = field(default_factory=list)
    info: dict[int, list[str]] = field(default_factory=dict)

    def overall(self) -> str:
        """ResultHelpers.cpp GetOverallDiagResult: any error or Fail, then Warn, then Pass, then Skip."""
        values = set(self.results.values())
        if self.errors or "Fail" in values:
            return "Fail"
        return next((v for v in ("Warn", "Pass", "Skip") if v in values), "Not Run")


def level_tests(level: int) -> list[tuple[str, str]]:
    return [(name, category) for name, category, first in TESTS if first <= level]


def run_diag(hw: NodeHardware, level: int, gpus: list[int], now: float) -> list[TestRun]:
    """The tests of `level` on `gpus` (present GPUs), as nvvs reports them."""
    runs: list[TestRun] = []
    skipped: dict[int, str] = {}  # GPU: why the tests after the one that found it skip it
    for name, category in level_tests(level):
        run = TestRun(name, category)
        if name == "software":
            _software(hw, gpus, run)
        else:
            for gpu in gpus:
                if gpu not in skipped:
                    found = _common_errors(hw, gpu, name, now)
                    run.results[gpu] = "Fail" if found else "Pass"
                    run.errors += found
            for gpu, reason in skipped.items():  # TestFramework.inl AppendSkippedEntityInfos: after the others
                run.results[gpu] = "Skip"
                run.info.setdefault(gpu, []).append(reason)
        skipped.update({e.gpu: SKIP_REASONS[e.code] for e in run.errors if e.code in SKIP_REASONS})
        runs.append(run)
    return runs


def _software(hw: NodeHardware, gpus: list[int], run: TestRun) -> None:
    # Subtests in their order; persistence mode and the recovery state set every GPU's result, row remapping
    # one GPU's; each GPU keeps the worst.
    off = [gpu for gpu in gpus if not hw.persistence_mode(gpu)]
    recovery = {gpu: action for gpu in gpus if (action := _recovery_action(hw, gpu))}
    whole = "Fail" if recovery else "Warn" if off else "Pass"
    run.results = dict.fromkeys(gpus, whole)
    run.errors += [error(gpu, 29, f"Persistence mode for GPU {gpu} is disabled.", "Persistence Mode: ") for gpu in off]
    prefix = "Page Retirement/Row Remap: "
    for gpu in gpus:
        rows = int(hw.counter(gpu, "uncorrectable_remapped_rows", 0.0))
        if hw.has("row-remap-failure", gpu=gpu):
            found = error(gpu, 80, f"GPU {gpu} had uncorrectable memory errors and row remapping failed.", prefix)
        elif rows >= REMAP_LIMIT:
            found = error(gpu, 132, f"GPU {gpu} exceeded uncorrectable row remap limit with {rows} remapped rows",
                          prefix)
        elif hw.has("row-remap-pending", gpu=gpu) and rows > 0:
            # Software.cpp passes only the GPU to this two-number format; the count is what it means to say.
            found = error(gpu, 84, f"GPU {gpu} had uncorrectable memory errors and {rows} rows were remapped", prefix)
        elif hw.has("row-remap-pending", gpu=gpu):
            found = error(gpu, 85, f"GPU {gpu} had memory errors and row remappings are pending", prefix)
        else:
            continue
        run.errors.append(found)
        run.results[gpu] = "Fail"
    for gpu, action in recovery.items():
        if action == "reboot":
            found = error(gpu, 126, f"GPU {gpu} fault may have left the OS in an inconsistent state. Recovery "
                                    "action: 2 (NODE_REBOOT).", "GPU Recovery State: ")
        else:
            found = error(gpu, 125, f"GPU {gpu} requires a reset to recover from a fault. Recovery action: 1 "
                                    "(GPU_RESET).", "GPU Recovery State: ")
        run.errors.append(found)


def _recovery_action(hw: NodeHardware, gpu: int) -> str | None:
    """"reboot" or "reset" when an XID fault on the GPU needs one (a reboot outranks a reset), else None."""
    from opsctl.health.xid import xid_catalog  # NVIDIA's XID catalog, as opsctl reads it

    actions = {xid_catalog().action(f.xid) for f in hw.active
               if f.gpu == gpu and f.fault in XID_FAULTS and f.xid is not None}
    return next((a for a in ("reboot", "reset") if a in actions), None)


def _rate(hw: NodeHardware, gpu: int, counter: str) -> float:
    return sum(FAULTS[f.fault].rates.get(counter, 0.0) for f in hw.active if f.gpu == gpu)


def _common_errors(hw: NodeHardware, gpu: int, test: str, now: float) -> list[DiagError]:
    if _recovery_action(hw, gpu):
        return [error(gpu, 66, f"GPU {gpu} failed to create a CUDA context: {CUDA_UNAVAILABLE}")]
    if hw.fabric_status(gpu, now) != FABRIC_SUCCESS:
        return [error(gpu, 66, f"GPU {gpu} failed to create a CUDA context: {CUDA_NOT_READY}")]
    found = []
    if _rate(hw, gpu, "ecc_dbe_vol") > 0:
        found.append(error(gpu, 103, f"Detected 1 ecc_dbe_volatile_total for GPU {gpu}"))
    temp = GpuView(hw, gpu, now).temp()
    if temp > MAX_OP_TEMP_C:
        found.append(error(gpu, 42, f"Temperature {temp} of GPU {gpu} exceeded user-specified maximum allowed "
                                    f"temperature {MAX_OP_TEMP_C}"))
    if test == "pcie":
        for counter, tag in (("nvlink_crc_flit", "nvlink_flit_crc_error_count_total"),
                             ("nvlink_crc_data", "nvlink_data_crc_error_count_total")):
            if (per_second := int(_rate(hw, gpu, counter))) >= CRC_PER_SECOND_LIMIT:
                found.append(error(gpu, 38, f"{tag} met or exceeded the threshold of {CRC_PER_SECOND_LIMIT} per "
                                            f"second: {per_second} at 1.0 seconds into the test."))
                break
    return found


def exit_code(runs: list[TestRun]) -> int:
    errors = [e for run in runs for e in run.errors]
    if any(e.severity == ISOLATE for e in errors):
        return RC_ISOLATE
    return RC_NVVS_ERROR if errors else 0
