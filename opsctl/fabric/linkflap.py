"""Count link flaps: systemd-networkd's carrier lines in syslog or `journalctl` text.

tests/fixtures/infiniband/azurehpc_nhc_ib_linkflap_syslog_sample.txt (shortened):

    Aug 17 00:00:24 jplc7eb7-vm-0 systemd[1]: Finished Rotate log files.
    Aug 17 06:18:01 jplc7eb7-vm-0 systemd-networkd[5398]: ib6: lost carrier
    Aug 17 06:18:06 jplc7eb7-vm-0 systemd-networkd[5398]: ib6: lost carrier
    ...
    Aug 17 06:18:06 jplc7eb7-vm-0 systemd-networkd[5398]: ib6: Gained carrier

networkd logs "<ifname>: Gained carrier" and "<ifname>: Lost carrier" ("lost carrier" in older
releases) through log_link_info(). Every "lost carrier" is one flap. Lines of other programs, and
networkd's other lines ("ib3: Link UP", "ib3: Gained IPv6LL"), are ignored; a systemd-networkd line
that speaks of a carrier in any other form, or is cut short in one ("ib6: lost car"), is an error.

Timestamps: the traditional syslog and `journalctl -o short` form ("Aug 17 06:18:01", no year: the
year is the latest that does not put the line after `now`), or RFC 3339 as rsyslog's high-precision
format and `journalctl -o short-iso` write ("2024-08-17T06:18:01.123456+00:00"). Times are compared
as the wall-clock time the log wrote, so `start` and `now` are naive datetimes in the log's time zone.
Reading rotated (.gz) logs is the caller's: pass their text, oldest first.
"""

import re
from dataclasses import dataclass
from datetime import datetime

from opsctl.errors import SourceUnavailable

_MONTHS = {name: number for number, name in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), start=1)}
_NETWORKD = re.compile(r"\ssystemd-networkd(?:\[\d+\])?:\s")
_CARRIER = re.compile(
    r"^(?:(?P<month>[A-Z][a-z]{2}) {1,2}(?P<day>\d{1,2}) (?P<time>\d{2}:\d{2}:\d{2})"
    r"|(?P<iso>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})))"
    r" \S+ systemd-networkd\[\d+\]: (?P<ifname>[^\s:]+): (?P<event>[Ll]ost carrier|[Gg]ained carrier)$")


@dataclass(frozen=True)
class CarrierEvent:
    time: datetime  # naive: the wall-clock time the log wrote
    interface: str
    lost: bool


def _syslog_time(line: str, month: str, day: int, clock: str, now: datetime) -> datetime:
    if month not in _MONTHS:
        raise SourceUnavailable(f"syslog: unknown month in {line!r}")
    hour, minute, second = (int(part) for part in clock.split(":"))
    for year in range(now.year, now.year - 8, -1):  # 8 years back reach a leap year for "Feb 29"
        try:
            when = datetime(year, _MONTHS[month], day, hour, minute, second)
        except ValueError:
            continue
        if when <= now:
            return when
    raise SourceUnavailable(f"syslog: impossible date in {line!r}")


def _speaks_of_carrier(line: str) -> bool:
    """"carrier" anywhere, or a message cut short in "Lost carrier"/"Gained carrier" (the log's last line)."""
    message = line.rstrip().rsplit(": ", 1)[-1].lower()
    return "carrier" in line.lower() or (len(message) > 5 and any(
        event.startswith(message) for event in ("lost carrier", "gained carrier")))


def parse_carrier_events(text: str, now: datetime | None = None) -> list[CarrierEvent]:
    """Every networkd carrier line, in the text's order; `now` (default: the clock) dates year-less lines."""
    now = now or datetime.now()
    if now.tzinfo is not None:
        raise ValueError("now must be naive, in the log's time zone")
    events: list[CarrierEvent] = []
    for line in text.splitlines():
        if not _NETWORKD.search(line) or not _speaks_of_carrier(line):
            continue
        match = _CARRIER.match(line.rstrip())
        if not match:
            raise SourceUnavailable(f"syslog: unknown systemd-networkd carrier line {line!r}")
        if match["iso"]:
            when = datetime.fromisoformat(match["iso"]).replace(tzinfo=None)
        else:
            when = _syslog_time(line, match["month"], int(match["day"]), match["time"], now)
        events.append(CarrierEvent(when, match["ifname"], match["event"].lower() == "lost carrier"))
    return events


def count_link_flaps(text: str, start: datetime | None = None, now: datetime | None = None) -> dict[str, int]:
    """Lost-carrier lines per interface between `start` and `now` (all of them without `start`).

    Every interface with a carrier line in the text is in the result, with 0 if none was lost in the
    window. `now` defaults to the clock; tests pin both.
    """
    if start is not None and start.tzinfo is not None:
        raise ValueError("start must be naive, in the log's time zone")
    now = now or datetime.now()
    counts: dict[str, int] = {}
    for event in parse_carrier_events(text, now):
        in_window = start is None or start <= event.time <= now
        counts[event.interface] = counts.get(event.interface, 0) + int(event.lost and in_window)
    return counts
