"""Parse `nvidia-smi --query-gpu=... --format=csv` and `--query-compute-apps=... --format=csv`.

    name, memory.total [MiB], memory.used [MiB]
    NVIDIA H200, 143771 MiB, 0 MiB

Keys are the field names without the unit ("memory.total"); values with a unit become numbers,
"[N/A]"/"N/A" become None, other values stay text. Works with `noheader` if `fields` is given.
nvidia-smi exits 9 when the driver is not loaded and 15 when a GPU fell off the bus; the caller
checks the return code, this parser only reads what was printed.

`NvidiaSmiImpl.gpu_indexes()` asks for each GPU's index by its PCI address (`opsctl node check` labels
the XIDs of the kernel log with it):

    $ nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader
    0, 00000000:18:00.0
    1, 00000000:2A:00.0
"""

import subprocess
from dataclasses import dataclass
from typing import Protocol

from opsctl.errors import SourceUnavailable
from opsctl.gpu.kmsg import canonical_pci

_UNITS = {"MiB", "W", "%", "MHz", "us", "ms"}
CsvValue = int | float | str | None


def _value(text: str) -> CsvValue:
    text = text.strip()
    if text in ("[N/A]", "N/A", "[Not Supported]"):
        return None
    number, _, unit = text.rpartition(" ")
    if unit in _UNITS and number:
        text = number
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def parse_nvidia_smi_csv(text: str, fields: list[str] | None = None) -> list[dict[str, CsvValue]]:
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("Unable to determine")]
    if fields is None:
        if not lines:
            raise SourceUnavailable("nvidia-smi printed no csv header")
        fields = [h.strip().split(" [")[0] for h in lines.pop(0).split(",")]
    rows = []
    for line in lines:
        cells = line.split(", ")
        if len(cells) != len(fields):
            raise SourceUnavailable(f"nvidia-smi csv row has {len(cells)} cells, expected {len(fields)}: {line!r}")
        rows.append({name: _value(cell) for name, cell in zip(fields, cells, strict=True)})
    return rows


INDEX_FIELDS = ["index", "pci.bus_id"]
# nvidia-smi(1): 15 when a GPU has fallen off the bus; it still prints the GPUs that answer, and an
# "Unable to determine the device handle" line for the lost one.
RC_FELL_OFF_BUS = 15
INDEX_TIMEOUT_SECONDS = 10.0  # a hung GPU hangs nvidia-smi: the node check must go on without the index


def parse_gpu_indexes(text: str) -> dict[str, int]:
    """`--query-gpu=index,pci.bus_id --format=csv,noheader` -> {canonical PCI address: index}."""
    indexes = {}
    for row in parse_nvidia_smi_csv(text, INDEX_FIELDS):
        pci = canonical_pci(str(row["pci.bus_id"]))
        if pci is None or not isinstance(row["index"], int):
            raise SourceUnavailable(f"nvidia-smi printed no index and PCI bus id: {row}")
        indexes[pci] = row["index"]
    return indexes


class GpuIndexes(Protocol):
    def gpu_indexes(self) -> dict[str, int]:
        """Each GPU's nvidia-smi index by its canonical PCI address. SourceUnavailable (one line) when
        nvidia-smi cannot say."""


@dataclass(frozen=True)
class NvidiaSmiImpl:
    path: str = "nvidia-smi"
    timeout: float = INDEX_TIMEOUT_SECONDS

    def gpu_indexes(self) -> dict[str, int]:
        argv = [self.path, "--query-gpu=" + ",".join(INDEX_FIELDS), "--format=csv,noheader"]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout, check=False)
        except OSError as err:
            raise SourceUnavailable(f"{self.path}: {err.strerror}") from None
        except subprocess.TimeoutExpired:
            raise SourceUnavailable(f"{self.path} did not answer within {self.timeout:g}s") from None
        if out.returncode not in (0, RC_FELL_OFF_BUS):  # 9: no driver loaded
            why = (out.stderr or out.stdout).strip().splitlines()
            raise SourceUnavailable(f"{self.path} exited {out.returncode}" + (f": {why[0][:200]}" if why else ""))
        return parse_gpu_indexes(out.stdout)
