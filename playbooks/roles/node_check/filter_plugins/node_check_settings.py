"""Filters of the node_check role.

node_ladder_settings: of an opsctl config (a mapping as the inventory gives it), the settings at the given
paths that it sets, as a config of their own; a path is `section.key`, or a section for all its keys:

    {{ {'remediation': {'validate_level': 3}, 'safety': {'max_drains_per_run': 2, 'reason_max_length': 200}}
       | node_ladder_settings(['remediation', 'safety.reason_max_length']) }}
        -> {'remediation': {'validate_level': 3}, 'safety': {'reason_max_length': 200}}

systemd_seconds: a systemd time span (systemd.time(7), "Parsing Time Spans") in seconds; a number alone is
seconds, and "infinity" (no timeout) is float('inf'):

    {{ '15min' | systemd_seconds }}      -> 900.0
    {{ '1h 30min' | systemd_seconds }}   -> 5400.0
    {{ '2400' | systemd_seconds }}       -> 2400.0
"""

import math
import re
from collections.abc import Iterable, Mapping

# systemd.time(7): the units a time span may name, in seconds (a month is 30.44 days, a year 365.25 days).
_UNIT_SECONDS = {
    **dict.fromkeys(("usec", "us", "\u00b5s"), 1e-6),
    **dict.fromkeys(("msec", "ms"), 1e-3),
    **dict.fromkeys(("seconds", "second", "sec", "s", ""), 1.0),
    **dict.fromkeys(("minutes", "minute", "min", "m"), 60.0),
    **dict.fromkeys(("hours", "hour", "hr", "h"), 3600.0),
    **dict.fromkeys(("days", "day", "d"), 86400.0),
    **dict.fromkeys(("weeks", "week", "w"), 604800.0),
    **dict.fromkeys(("months", "month", "M"), 2629800.0),
    **dict.fromkeys(("years", "year", "y"), 31557600.0),
}
_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z\u00b5]*)\s*")


def node_ladder_settings(config: Mapping | None, paths: Iterable[str]) -> dict:
    picked: dict = {}
    for path in paths:
        section, _, name = str(path).partition(".")
        given = (config or {}).get(section)
        if not isinstance(given, Mapping):
            continue
        if not name:
            picked[section] = {**picked.get(section, {}), **given}
        elif name in given:
            picked.setdefault(section, {})[name] = given[name]
    return picked


def systemd_seconds(span: object) -> float:
    text = str(span).strip()
    if text == "infinity":
        return math.inf
    total, at = 0.0, 0
    while at < len(text):
        part = _PART.match(text, at)
        if part is None or part.group(2) not in _UNIT_SECONDS:
            break
        total, at = total + float(part.group(1)) * _UNIT_SECONDS[part.group(2)], part.end()
    if not text or at < len(text):
        raise ValueError(f"{span!r} is not a systemd time span such as 15min, 1h 30min or 2400 (systemd.time(7))")
    return total


class FilterModule:
    def filters(self):
        return {"node_ladder_settings": node_ladder_settings, "systemd_seconds": systemd_seconds}
