"""`ofed_info -s`: the NVIDIA RDMA stack the node runs (MLNX_OFED, or DOCA-OFED, its successor), which
version-drift compares across the fleet.

    MLNX_OFED_LINUX-24.10-1.1.4.0:

One line: the distribution, a dash, its release, a colon (MLNX_OFED's documentation, "Installation":
`ofed_info -s`). DOCA-OFED installs an ofed_info too (ofed-scripts), whose distribution word may differ
(`OFED-internal-...`): any `<name>-<release>:` is read. Without -s the first line says the same and more
(`MLNX_OFED_LINUX-24.10-1.1.4.0 (OFED-24.10-1.1.4):`), so the first word of the first line is what counts.
A node without the stack (the kernel's own RDMA drivers) has no ofed_info: no version, and nothing compared.
"""

import re
import subprocess
from dataclasses import dataclass

from opsctl.gpu.tools import Run, run_tool

TIMEOUT_SECONDS = 10.0
_RELEASE = re.compile(r"^(?P<distribution>[A-Za-z_]+(?:-[A-Za-z_]+)*)-(?P<version>\d[0-9A-Za-z._-]*?):?$")


@dataclass(frozen=True)
class OfedVersion:
    distribution: str = ""  # MLNX_OFED_LINUX, OFED-internal; "" when not read
    version: str = ""  # 24.10-1.1.4.0
    note: str = ""  # why there is none


def parse_ofed_info(text: str) -> OfedVersion:
    words = text.strip().split()
    match = _RELEASE.match(words[0]) if words else None
    if not match:
        return OfedVersion(note=f"ofed_info -s printed what it does not know: {text.strip()[:120]!r}")
    return OfedVersion(match["distribution"], match["version"])


def read_ofed(ofed_info: str, run: Run = subprocess.run) -> OfedVersion:
    out = run_tool(run, [ofed_info, "-s"], TIMEOUT_SECONDS)
    if out.returncode != 0:
        why = (out.stderr or out.stdout).strip().splitlines()
        return OfedVersion(note=f"ofed_info -s exited {out.returncode}" + (f": {why[0][:200]}" if why else ""))
    return parse_ofed_info(out.stdout)
