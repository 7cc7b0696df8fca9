"""Parse `nvidia-smi --query-gpu=... --format=csv` and `--query-compute-apps=... --format=csv`.

    name, memory.total [MiB], memory.used [MiB]
    NVIDIA H200, 143771 MiB, 0 MiB

Keys are the field names without the unit ("memory.total"); values with a unit become numbers,
"[N/A]"/"N/A" become None, other values stay text. Works with `noheader` if `fields` is given.
nvidia-smi exits 9 when the driver is not loaded and 15 when a GPU fell off the bus; the caller
checks the return code, this parser only reads what was printed.
"""

from opsctl.errors import SourceUnavailable

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
