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

`lfs df` prints each target's space, as showdf() and mntdf() in lustre-release's lustre/utils/lfs.c print
it (a real capture: tests/fixtures/lustre/lfs_df_exascaler_cloud_24_osts.txt):

    UUID                   1K-blocks        Used   Available Use% Mounted on
    lustre-MDT0000_UUID   4020187136    50213888  3701235712   2% /lustre[MDT:0]
    lustre-OST0001_UUID  61419143168 12283828632 48484100096  21% /lustre[OST:1] D
    OST0002             : inactive device

    filesystem_summary:  184257429504 100097948056 82269495296  55% /lustre

A trailing word is the target's state flags (D degraded, R read-only, N no precreate, S out of space,
I out of inodes; with -v also f flash, a aggregate). A target the client marked inactive (its import
lost) is left out, or with -v listed as `OST0002 : inactive device` (lfs names it by type and index: the
client never got its UUID); any other error reads `<uuid> : <strerror>`. The summary adds up the OSTs
that answered.
"""

import re
from dataclasses import dataclass, replace

from opsctl.errors import SourceUnavailable

HEALTHY_STATES = ("FULL", "IDLE")
_HEADER = re.compile(r"^((?:osc|mdc)\.(\S+))\.import=\s*$")
_FIELD = re.compile(r"^\s+(name|target|state):\s*(\S+)\s*$")
_ACTIVE = re.compile(r"^(\S+) (active|inactive)\.$")
_ERROR = re.compile(r"error: check '([^']+)': (.+)$")
# lustre-OST0001-osc-ffff9a8b5c3e4000 -> lustre-OST0001: the client-side device of a target (on a server,
# the MDT's own osc: lustre-OST0001-osc-MDT0000).
_DF_HEADER = re.compile(r"^UUID\s+1K-blocks\s+Used\s+Available\s+Use%\s+Mounted on$")
_DF_NO_UUID = re.compile(r"^(MDT|OST)([0-9a-f]{4})$")  # lfs's name of a target whose UUID it never got
_DF_ROW = re.compile(r"^(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)%\s+(.+?)(?:\[(MDT|OST):(\d+)\])?(?:\s+(\S+))?$")
_DF_ERROR = re.compile(r"^(\S+)\s*: (.+)$")
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


@dataclass(frozen=True)
class DfTarget:
    """One line of `lfs df`: a target's space in KiB, or why it has none (`error`)."""

    uuid: str  # exacloud-OST0000_UUID; OST0002 for an inactive target
    name: str  # exacloud-OST0000
    kind: str  # MDT or OST
    index: int
    blocks_kb: int = 0
    used_kb: int = 0
    available_kb: int = 0
    use_percent: int = 0
    flags: str = ""  # D, R, N, S, I (and f, a with -v)
    error: str = ""  # "inactive device" or the strerror of a failed statfs

    @property
    def answered(self) -> bool:
        return not self.error


@dataclass(frozen=True)
class DfFilesystem:
    mount: str
    targets: list[DfTarget]
    summary: DfTarget  # filesystem_summary: the OSTs that answered (the MDTs on an OST-less filesystem)


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


def parse_df(text: str, source: str = "lfs df") -> list[DfFilesystem]:
    """Every filesystem `lfs df` (or `lfs df -v`) lists: a header, its targets, a blank line, its summary."""
    filesystems: list[DfFilesystem] = []
    targets: list[DfTarget] | None = None  # the targets of the filesystem being read
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if _DF_HEADER.match(line):
            targets = []
            continue
        if targets is None:
            raise SourceUnavailable(f"{source} line {number}: expected the UUID 1K-blocks ... header, got "
                                    f"{line[:120]!r}")
        row, error = _DF_ROW.match(line), _DF_ERROR.match(line)
        if row and row.group(1) == "filesystem_summary:":
            summary = DfTarget("filesystem_summary", "filesystem_summary", "", 0, *_df_numbers(row),
                               flags=row.group(9) or "")
            filesystems.append(DfFilesystem(row.group(6), _named(targets), summary))
            targets = None
        elif row and row.group(7):
            targets.append(DfTarget(row.group(1), target_name(row.group(1)), row.group(7), int(row.group(8)),
                                    *_df_numbers(row), flags=row.group(9) or ""))
        elif error:
            uuid = error.group(1)
            bare = _DF_NO_UUID.match(uuid)
            name = target_name(uuid)
            kind_index = (bare.group(1), int(bare.group(2), 16)) if bare else _kind_index(name)
            if kind_index is None:
                raise SourceUnavailable(f"{source} line {number}: not a target: {line[:120]!r}")
            targets.append(DfTarget(uuid, name, *kind_index, error=error.group(2).strip()))
        else:
            raise SourceUnavailable(f"{source} line {number}: not an lfs df line: {line[:120]!r}")
    if targets is not None:
        raise SourceUnavailable(f"{source}: no filesystem_summary after the last header (output cut short?)")
    return filesystems


def _df_numbers(row: re.Match[str]) -> tuple[int, int, int, int]:
    return int(row.group(2)), int(row.group(3)), int(row.group(4)), int(row.group(5))


def _kind_index(name: str) -> tuple[str, int] | None:
    match = re.search(r"-(MDT|OST)([0-9a-f]{4})$", name)
    return (match.group(1), int(match.group(2), 16)) if match else None


def _named(targets: list[DfTarget]) -> list[DfTarget]:
    """Give an inactive target (named OST0002 by lfs) its filesystem's name: lustre-OST0002."""
    fsnames = {t.name.rsplit("-", 1)[0] for t in targets if "-" in t.name}
    if len(fsnames) != 1:
        return targets
    fsname = fsnames.pop()
    return [replace(t, name=f"{fsname}-{t.name}") if _DF_NO_UUID.match(t.name) else t for t in targets]
