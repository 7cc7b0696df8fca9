"""Fold host names into Slurm's bracket notation, so that 64 H200 nodes take one NodeName= line:

    hostlist_expression(['gpu001', 'gpu002', 'gpu003', 'gpu010', 'head'])
    -> ['gpu[001-003,010]', 'head']

Zero padding is kept: names whose numeric suffix has a different width never share a range, because
Slurm expands gpu[001-003] back to exactly those widths (slurm.conf(5), "NodeName"). Bare numbers
fold too (['17001', '17002'] -> ['[17001-17002]']), as slurm.conf's Port= ranges want.

The one implementation for the product, the lab and the playbooks' `hostlist_expression` filter.
"""

import re
from collections.abc import Iterable

_SUFFIX = re.compile(r"^(.*?)(\d+)$")


def hostlist_expression(hosts: Iterable[object]) -> list[str]:
    groups: dict[tuple[str, int], set[int]] = {}
    plain = []
    for host in hosts:
        match = _SUFFIX.match(str(host))
        if not match:
            plain.append(str(host))
            continue
        prefix, digits = match.groups()
        groups.setdefault((prefix, len(digits)), set()).add(int(digits))
    out = []
    for (prefix, width), numbers in sorted(groups.items()):
        ranges = []
        ordered = sorted(numbers)
        start = prev = ordered[0]
        for number in [*ordered[1:], None]:
            if number is not None and number == prev + 1:
                prev = number
                continue
            ranges.append(f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}")
            if number is not None:
                start = prev = number
        if len(ranges) == 1 and "-" not in ranges[0]:
            out.append(f"{prefix}{ranges[0]}")
        else:
            out.append(f"{prefix}[{','.join(ranges)}]")
    return out + sorted(plain)


_BRACKET = re.compile(r"\[([^\[\]]*)\]")


def expand_hostlist(expression: str) -> list[str]:
    """Slurm's bracket notation back to names, in order: 'gpu[001-003,010],head' -> gpu001 ... gpu010, head.
    Widths are kept as written (gpu[08-10] -> gpu08, gpu09, gpu10); several brackets in one name multiply.
    Raises ValueError on a malformed expression."""
    names: list[str] = []
    for part in _split_top(expression):
        match = _BRACKET.search(part)
        if match is None:
            if "[" in part or "]" in part:
                raise ValueError(f"unbalanced brackets in {expression!r}")
            names.append(part)
            continue
        head, tail = part[:match.start()], part[match.end():]
        for item in match.group(1).split(","):
            low, _, high = item.partition("-")
            if not low.isdigit() or (high and not high.isdigit()) or (high and int(high) < int(low)):
                raise ValueError(f"bad range {item!r} in {expression!r}")
            for number in range(int(low), int(high or low) + 1):
                names += expand_hostlist(f"{head}{number:0{len(low)}d}{tail}")
    return names


def _split_top(expression: str) -> list[str]:
    """Split at the commas outside brackets."""
    parts, depth, current = [], 0, ""
    for char in expression.strip():
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [p for p in [*parts, current] if p]
