"""Parse the result of a perftest bandwidth run (`ib_write_bw`/`ib_read_bw --report_gbits`).

    ---------------------------------------------------------------------------------------
                        RDMA_Write BW Test
     Dual-port       : OFF        Device         : mlx5_0
     ...
     Link type       : IB
     ...
     #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
     65536      5000             392.38             392.34              0.748336

Lines between the column header and the row (e.g. "Conflicting CPU frequency values detected") are
skipped. With several runs in one text (a saved session), the last run is returned. Without
--report_gbits perftest reports MB/sec; the unit is returned with the numbers. (Real output separates
some header columns with tabs.)
"""

import re
from dataclasses import dataclass

from opsctl.errors import SourceUnavailable

_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")


@dataclass
class BandwidthResult:
    test: str
    device: str
    link_type: str
    size: int
    iterations: int
    bw_peak: float
    bw_average: float
    msg_rate_mpps: float
    unit: str  # "Gb/sec" or "MB/sec"


def parse_ib_write_bw(text: str) -> BandwidthResult:
    test = device = link_type = unit = ""
    row = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith("BW Test"):  # a new run starts: the last one in the text wins
            test, device, link_type, unit, row = stripped, "", "", "", None
        elif "Device         :" in line:
            device = line.split("Device         :")[1].strip()
        elif stripped.startswith("Link type"):
            link_type = stripped.partition(":")[2].strip()
        elif stripped.startswith("#bytes"):
            unit = "Gb/sec" if "[Gb/sec]" in stripped else "MB/sec"
        elif unit and row is None and (match := _ROW.match(line)):
            row = match
    if row is None:
        raise SourceUnavailable("no bandwidth result row in ib_write_bw output")
    return BandwidthResult(test=test, device=device, link_type=link_type, size=int(row[1]),
                           iterations=int(row[2]), bw_peak=float(row[3]), bw_average=float(row[4]),
                           msg_rate_mpps=float(row[5]), unit=unit)
