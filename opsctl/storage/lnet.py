"""LNet, the network under Lustre: `lnetctl net show [-v]`, `lnetctl stats show` and `lctl ping <nid>`.
Formats: tests/fixtures/lustre/ (SOURCES.md there names each capture) and lustre-release's lnetctl
(lnet/utils/lnetctl.c, its YAML printed by liblnetconfig) and jt_ptl_ping() (lustre/utils/portals.c).

`lnetctl net show` lists the local network interfaces (NIs), one block per network; `-v` adds statistics,
tunables and health per NI, which are ignored here:

    net:
        - net type: o2ib
          local NI(s):
            - nid: 172.16.0.24@o2ib
              status: down
              interfaces:
                  0: ib0

The loopback network `lo` (NID 0@lo) is always there and always up: it is skipped.

`lnetctl stats show` is one mapping of LNet's counters (`statistics:`, then `send_count: 1110532` ...).

`lctl ping <nid>` prints the process ids that answered, the local `12345-0@lo` first, one per line; when
the peer does not answer it prints `failed to ping <nid>: <error>`, on stderr (lctl before 2.17) or
stdout (2.17, over netlink), and exits non-zero.
"""

import re
from dataclasses import dataclass
from typing import Any

import yaml

from opsctl.errors import SourceUnavailable

LOOPBACK = "lo"
_PING_ID = re.compile(r"^(?:\d+-)?\S+@\S+$")
_PING_FAILED = re.compile(r"^failed to ping (\S+): (.+)$")
_PING_MORE = re.compile(r"^\d+ out of \d+ ids listed$")


@dataclass(frozen=True)
class NetworkInterface:
    net_type: str  # o2ib, tcp
    nid: str  # 172.16.0.24@o2ib
    status: str  # up or down
    interfaces: tuple[str, ...]  # ib0, ib3

    @property
    def up(self) -> bool:
        return self.status == "up"


@dataclass(frozen=True)
class PingResult:
    nid: str
    reachable: bool
    detail: str  # the ids that answered, or the error


def _load(text: str, source: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise SourceUnavailable(f"{source}{where}: not YAML: {getattr(err, 'problem', None) or err}") from None


def parse_net_show(text: str, source: str = "lnetctl net show") -> list[NetworkInterface]:
    """Every NI but the loopback, in the order lnetctl lists them."""
    doc = _load(text, source)
    if not isinstance(doc, dict) or not isinstance(doc.get("net"), list):
        raise SourceUnavailable(f"{source}: expected a `net:` list, got {text.strip()[:120]!r}")
    nis = []
    for net in doc["net"]:
        net_type = net.get("net type") if isinstance(net, dict) else None
        if not isinstance(net_type, str):
            raise SourceUnavailable(f"{source}: a network without a `net type`: {net!r:.120}")
        if net_type == LOOPBACK:
            continue
        for ni in net.get("local NI(s)") or []:
            if not isinstance(ni, dict) or not isinstance(ni.get("nid"), str) or "status" not in ni:
                raise SourceUnavailable(f"{source}: an NI of {net_type} without a nid or status: {ni!r:.120}")
            interfaces = ni.get("interfaces") or {}
            if not isinstance(interfaces, dict):
                raise SourceUnavailable(f"{source}: the interfaces of {ni['nid']} are not a mapping")
            nis.append(NetworkInterface(net_type, ni["nid"], str(ni["status"]),
                                        tuple(str(interfaces[k]) for k in sorted(interfaces))))
    return nis


def parse_stats_show(text: str, source: str = "lnetctl stats show") -> dict[str, int]:
    doc = _load(text, source)
    stats = doc.get("statistics") if isinstance(doc, dict) else None
    if not isinstance(stats, dict):
        raise SourceUnavailable(f"{source}: expected a `statistics:` mapping, got {text.strip()[:120]!r}")
    bad = [key for key, value in stats.items() if not isinstance(value, int) or isinstance(value, bool)]
    if bad:
        raise SourceUnavailable(f"{source}: {bad[0]} is not a counter: {stats[bad[0]]!r}")
    return {str(key): value for key, value in stats.items()}


def parse_ping(nid: str, text: str, source: str = "lctl ping") -> PingResult:
    """`lctl ping <nid>`'s stdout and stderr together. The ids are split on any whitespace: a paste that
    joined them on one line is the same answer."""
    ids: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        failed = _PING_FAILED.match(line)
        if failed:
            return PingResult(nid, False, failed.group(2).strip())
        if not line or _PING_MORE.match(line):
            continue
        words = line.split()
        if not all(_PING_ID.match(word) for word in words):
            raise SourceUnavailable(f"{source} {nid} line {number}: not a process id: {line[:120]!r}")
        ids += words
    if not ids:
        raise SourceUnavailable(f"{source} {nid}: no answer and no error")
    return PingResult(nid, True, " ".join(ids))
