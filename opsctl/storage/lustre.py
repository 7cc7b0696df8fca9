"""The Lustre client's view of its servers: `lctl get_param osc.*.import mdc.*.import` and `lfs check
servers`. Formats: tests/fixtures/lustre/ (SOURCES.md there names each capture) and lustre-release's
lprocfs_import_seq_show() and lfs_check().

An import is the client's connection to one target (an OST through its osc, an MDT through its mdc):

    osc.lustre-OST0001-osc-ffff9a8b5c3e4000.import=
    import:
        name: lustre-OST0001-osc-ffff9a8b5c3e4000
        target: lustre-OST0001_UUID
        state: FULL
        connect_flags: [ write_grant, server_lock, ... ]
        ...

FULL is connected. IDLE is healthy too: since Lustre 2.12 a client closes an unused OST connection
(osc.*.idle_timeout) and reconnects on the next I/O. Anything else (DISCONN, CONNECTING, EVICTED, CLOSED,
REPLAY, RECOVER, NEW) means I/O to that target waits or fails.

`lfs check servers` pings each server and prints one line per target:

    lustre-MDT0000-mdc-ffff9a8b5c3e4000 active.
    lustre-OST0001-osc-ffff9a8b5c3e4000 inactive.
    lfs check: error: check 'lustre-OST0002-osc-ffff9a8b5c3e4000': Resource temporarily unavailable (11)
"""

import re
from dataclasses import dataclass

from opsctl.errors import SourceUnavailable

HEALTHY_STATES = ("FULL", "IDLE")
_HEADER = re.compile(r"^((?:osc|mdc)\.(\S+))\.import=\s*$")
_FIELD = re.compile(r"^\s+(name|target|state):\s*(\S+)\s*$")
_ACTIVE = re.compile(r"^(\S+) (active|inactive)\.$")
_ERROR = re.compile(r"error: check '([^']+)': (.+)$")
# lustre-OST0001-osc-ffff9a8b5c3e4000 -> lustre-OST0001: the client-side device of a target (on a server,
# the MDT's own osc: lustre-OST0001-osc-MDT0000).
_CLIENT_DEVICE = re.compile(r"-(?:osc|mdc|lwp)-(?:[0-9a-f]+|MDT[0-9a-f]{4})$")


@dataclass(frozen=True)
class Import:
    device: str  # lustre-OST0001-osc-ffff9a8b5c3e4000
    target: str  # lustre-OST0001
    state: str

    @property
    def healthy(self) -> bool:
        return self.state in HEALTHY_STATES


@dataclass(frozen=True)
class ServerCheck:
    device: str
    target: str
    active: bool
    detail: str  # "active", "inactive" or the error text


def target_name(device_or_uuid: str) -> str:
    return _CLIENT_DEVICE.sub("", device_or_uuid).removesuffix("_UUID")


def parse_imports(text: str, source: str = "lctl get_param") -> list[Import]:
    records: list[tuple[int, str, dict[str, str]]] = []
    after_header = False
    for number, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line)
        if header:
            records.append((number, header.group(2), {}))
            after_header = True
            continue
        if not line.strip():
            continue
        if line.rstrip() == "import:":
            # The file itself (a read of /proc/fs/lustre/osc/<dev>/import) has no header: the name says which.
            if not after_header:
                records.append((number, "", {}))
            after_header = False
            continue
        if not records:
            raise SourceUnavailable(f"{source} line {number}: expected an osc.*.import= or mdc.*.import= line, got "
                                    f"{line[:120]!r}")
        field = _FIELD.match(line)
        if field:
            records[-1][2].setdefault(field.group(1), field.group(2))
    imports = []
    for number, device, fields in records:
        device = device or fields.get("name", "")
        missing = [key for key in ("name", "target", "state") if key not in fields]
        if missing:
            raise SourceUnavailable(f"{source} line {number}: the import of {device or 'an unnamed device'} has no "
                                    f"{missing[0]}")
        imports.append(Import(device=device, target=target_name(fields["target"]), state=fields["state"]))
    return imports


def parse_check_servers(text: str, source: str = "lfs check servers") -> list[ServerCheck]:
    checks = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        active, error = _ACTIVE.match(line.strip()), _ERROR.search(line)
        if active:
            checks.append(ServerCheck(active.group(1), target_name(active.group(1)), active.group(2) == "active",
                                      active.group(2)))
        elif error:
            checks.append(ServerCheck(error.group(1), target_name(error.group(1)), False, error.group(2).strip()))
        else:
            raise SourceUnavailable(f"{source} line {number}: not a server line: {line[:120]!r}")
    return checks
