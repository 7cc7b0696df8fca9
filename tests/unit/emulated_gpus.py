"""subprocess.run of a node's nvidia-smi, dcgmi, systemctl and all_reduce_perf, answered by the lab's emulation of
one H200 node in process (opsctl_lab.hwtools: no process is started), on a clock of its own that the node's waits
move on (`sleep`, `monotonic`: pass the fake as take_step's `pace`), so that a GPU reset's fabric training takes
its time. The node runs DCGM's host engine and dcgm-exporter, as a provisioned one does: they hold its GPUs until
stopped."""

from dataclasses import dataclass
from pathlib import Path

from opsctl_lab.hardware import MONITORING_SERVICES, NodeHardware
from opsctl_lab.hwtools.all_reduce_perf import single_node
from opsctl_lab.hwtools.dcgmi import diag_document, entity_gpus, styled
from opsctl_lab.hwtools.dcgmi_diag import run_diag
from opsctl_lab.hwtools.nvidia_smi import bus_id, query_apps, query_gpu, render_q
from opsctl_lab.hwtools.nvidia_smi_reset import gpu_reset
from opsctl_lab.hwtools.systemctl import systemctl

NOW = 1_800_000_000.0


@dataclass(frozen=True)
class Ran:
    """What subprocess.run returns, as far as the node's step reads it."""

    args: list
    returncode: int
    stdout: str
    stderr: str = ""


class EmulatedGpus:
    def __init__(self, hw: NodeHardware, bug_report: str | None = None, now: float = NOW):
        self.hw, self.calls, self.bug_report, self.now = hw, [], bug_report, now
        self.slept = 0.0
        hw.monitoring = hw.monitoring or dict.fromkeys(MONITORING_SERVICES, True)

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds

    def monotonic(self) -> float:
        return self.now

    def __call__(self, argv, **_):
        self.calls.append(" ".join(argv[1:]))
        if argv[0] == "nvidia-bug-report.sh":
            if self.bug_report is None:  # not installed, as on the lab's nodes
                raise FileNotFoundError(2, "No such file or directory")
            Path(argv[2] + ".gz").write_text(self.bug_report)
            return Ran(argv, 0, "")
        if Path(argv[0]).name == "all_reduce_perf":
            printed = single_node(self.hw, argv[1:], self.now)
            return Ran(argv, printed.rc, printed.stdout, printed.stderr)
        if argv[0] == "systemctl":
            out, err, rc = systemctl(self.hw, argv[1:])
            return Ran(argv, rc, out, err)
        fields = argv[1].split("=", 1)[1].split(",") if argv[1].startswith("--query-") else []
        if argv[1].startswith("--query-gpu="):
            return Ran(argv, 0, query_gpu(self.hw, self.now, fields, {"csv", "noheader"}, list(range(8))))
        if argv[1].startswith("--query-compute-apps="):
            return Ran(argv, 0, query_apps(self.hw, self.now, fields, {"csv", "noheader"}))
        gpus, _ = entity_gpus(argv[argv.index("-i") + 1])
        if argv[:2] == ["nvidia-smi", "-pm"]:
            for gpu in gpus:
                self.hw.set_persistence_mode(gpu, argv[2] == "1", self.now)
            return Ran(argv, 0, "".join(f"Persistence mode set for GPU {bus_id(gpu)}.\n" for gpu in gpus))
        if argv[:2] == ["nvidia-smi", "-r"]:
            text, rc = gpu_reset(self.hw, {gpu: bus_id(gpu) for gpu in gpus}, self.now)
            return Ran(argv, rc, text)
        if argv[:2] == ["nvidia-smi", "-q"]:
            return Ran(argv, 0, render_q(self.hw, self.now, gpus))
        if any(not self.hw.gpu_present(gpu) for gpu in gpus):  # as the lab's dcgmi: a lost GPU named with -i
            runtime = {"DCGM Diagnostic": {"runtime_error": "Error: Unable to complete diagnostic. Return: (-18) : "
                                                            "GPU is lost\n", "version": "4.6.0"}}
            return Ran(argv, 238, styled(runtime))
        runs = run_diag(self.hw, int(argv[argv.index("-r") + 1]), gpus, self.now)
        failed = any(result == "Fail" for run in runs for result in run.results.values())
        return Ran(argv, 226 if failed else 0, styled(diag_document(self.hw, runs, gpus)))
