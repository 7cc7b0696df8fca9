r"""NFS RPC retransmissions from /proc/self/mountstats (the kernel's nfs_show_stats; nfs-utils' mountstats
reads the same file). A block per mount; only NFS ones carry statistics:

    device 10.0.0.5:/srv/home mounted on /home with fstype nfs4 statvers=1.1
    \topts:\trw,vers=4.2,rsize=1048576,...,hard,proto=tcp,nconnect=8,...
    ...
    \tper-op statistics
    \t        NULL: 0 0 0 0 0 0 0 0
    \t        READ: 1200 1203 0 211200 157286400 14 2400 2500 0

Each per-op line counts ops, transmissions, major timeouts, bytes sent and received, and queue, RTT and
execute milliseconds (and errors since statvers 1.1). A retransmission is a transmission beyond the first
of an op, so the mount's retransmissions are the sum of transmissions minus ops.
"""

import re
from dataclasses import dataclass, replace

from opsctl.errors import SourceUnavailable
from opsctl.storage.mountinfo import unescape

_DEVICE = re.compile(r"^device (\S+) mounted on (\S+) with fstype (\S+)(?: statvers=(\S+))?$")
_OP = re.compile(r"^\s+([A-Z_0-9]+): (\d+) (\d+) (\d+)(?: \d+)*\s*$")


@dataclass(frozen=True)
class NfsStats:
    point: str
    server: str  # server:/export
    ops: int
    transmissions: int
    major_timeouts: int

    @property
    def retransmissions(self) -> int:
        return self.transmissions - self.ops


def parse_mountstats(text: str, source: str = "mountstats") -> dict[str, NfsStats]:
    """Mount point -> its RPC totals, for each NFS mount that has per-op statistics."""
    out: dict[str, NfsStats] = {}
    current: NfsStats | None = None  # the NFS mount being read, its sums so far
    in_ops = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("device "):
            match = _DEVICE.match(line)
            if not match:
                raise SourceUnavailable(f"{source} line {number}: not a device line: {line[:120]!r}")
            nfs = match.group(3) in ("nfs", "nfs4")
            current = NfsStats(unescape(match.group(2)), match.group(1), 0, 0, 0) if nfs else None
            in_ops = False
        elif current is None or not line.strip():
            continue
        elif line.strip() == "per-op statistics":
            in_ops = True
        elif in_ops:
            op = _OP.match(line)
            if not op:
                raise SourceUnavailable(f"{source} line {number}: not a per-op statistics line: {line[:120]!r}")
            ops, transmissions = int(op.group(2)), int(op.group(3))
            # Never fewer transmissions than ops in a sane kernel; a counter that wrapped must not go negative.
            current = replace(current, ops=current.ops + ops,
                              transmissions=current.transmissions + max(ops, transmissions),
                              major_timeouts=current.major_timeouts + int(op.group(4)))
            out[current.point] = current
    return out
