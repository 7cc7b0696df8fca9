"""Parse `perfquery` output (infiniband-diags): one record per counters block.

`perfquery -x <lid> <port>` (shortened; tests/fixtures/infiniband/
infiniband_exporter_perfquery_perfquery_0x506b4b03005c2740.out.txt):

    # Port extended counters: Lid 2052 port 1 (CapMask: 0x5300 CapMask2: 0x0000002)
    PortSelect:......................1
    CounterSelect:...................0x0000
    PortXmitData:....................178791657177235
    ...
    LinkDownedCounter:...............1
    ...
    PortXmitWait:....................41864608
    QP1Dropped:......................0

`perfquery -E` and the other counter sets print "# <set> counters: Lid <lid> port <port>" with no
CapMask (...perfquery-rcv-error_0x7cfe9003009ce5b0-1.out.txt):

    # PortRcvErrorDetails counters: Lid 1719 port 1
    PortSelect:......................1
    CounterSelect:...................0x0000
    PortLocalPhysicalErrors:.........0

The header comes from perfquery.c ("# %s counters: %s port %d", the portid as "Lid %u"; "port 255" is
the aggregate of all ports), each counter from libibmad's field dump (name, ':', dots to a fixed width,
the value in decimal or as 0x hex). Several queries in one text give several records. A port given by
a directed route instead of a LID, or a query that failed ("cannot query ..."), is an error.
"""

import re
from dataclasses import dataclass

from opsctl.errors import SourceUnavailable

_HEADER = re.compile(r"^# ([A-Za-z][A-Za-z ]*?) counters: Lid (\d+) port (\d+)"
                     r"(?: \(CapMask: 0x([0-9A-Fa-f]+)(?: CapMask2: 0x([0-9A-Fa-f]+))?\))?$")
_COUNTER = re.compile(r"^([A-Za-z][A-Za-z0-9_]*):\.*(0x[0-9A-Fa-f]+|\d+)$")


@dataclass
class PerfqueryCounters:
    kind: str  # the header's counter set: "Port extended", "Port", "PortRcvErrorDetails", ...
    lid: int
    port: int  # 255: all ports together
    cap_mask: int | None
    cap_mask2: int | None
    counters: dict[str, int]  # hex values (CounterSelect: 0x0000) as their int


def process_perfquery_output(text: str) -> list[PerfqueryCounters]:
    blocks: list[PerfqueryCounters] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if match := _HEADER.match(line):
            if blocks and not blocks[-1].counters:
                raise SourceUnavailable(f"perfquery: no counters under {blocks[-1].kind!r} before {line!r}")
            blocks.append(PerfqueryCounters(
                kind=match[1], lid=int(match[2]), port=int(match[3]),
                cap_mask=int(match[4], 16) if match[4] else None, cap_mask2=int(match[5], 16) if match[5] else None,
                counters={}))
        elif match := _COUNTER.match(line):
            if not blocks:
                raise SourceUnavailable(f"perfquery: counter before any '# ... counters:' header: {line!r}")
            if match[1] in blocks[-1].counters:
                raise SourceUnavailable(f"perfquery: counter repeated in one block: {line!r}")
            blocks[-1].counters[match[1]] = int(match[2], 16 if match[2].startswith("0x") else 10)
        else:
            raise SourceUnavailable(f"perfquery: unknown line {line!r}")
    if not blocks:
        raise SourceUnavailable("perfquery: no '# ... counters:' header in output")
    if not blocks[-1].counters:
        raise SourceUnavailable(f"perfquery: no counters under {blocks[-1].kind!r} (output cut short?)")
    return blocks
