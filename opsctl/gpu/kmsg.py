"""Parse the kernel log as /dev/kmsg gives it, and the NVIDIA driver's XID and NVSwitch SXid lines in it.

A /dev/kmsg record (the kernel's Documentation/ABI/testing/dev-kmsg; tests/fixtures/kmsg/):

    7,160,424069,-;pci_root PNP0A03:00: host bridge window [io  0x0000-0x0cf7] (ignored)
     SUBSYSTEM=acpi
     DEVICE=+acpi:PNP0A03:00
    6,339,5140900,-;NET: Registered protocol family 10

is `<priority>,<sequence>,<microseconds since boot>,<flags>[,more fields];<message>`; the lines after it
that start with a space are key=value context for programs, not messages, and are skipped. Each read()
of /dev/kmsg returns one record; a file of records (the lab's) has one per line. The priority's facility
(its bits above the lowest three) is 0 only for the kernel's own messages: a program writing to
/dev/kmsg cannot use it, so a line that only looks like the driver's is told apart.

The driver's lines (kernel_rc.c of NVIDIA/open-gpu-kernel-modules prints `NVRM: Xid (PCI:%04x:%02x:%02x):
%d, pid=%s, name=%s, %s` or, with no process known, `NVRM: Xid (PCI:%04x:%02x:%02x): %d, %s`; on a MIG
GPU the parenthesis also names the instance, ` GPU-I:%02u GPU-CI:%02u`):

    NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC ...
    NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error ...
    NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000000 intr 00004000
    NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)
    nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up
    nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 60 Sub-engine instance 00

A line is the driver's only when the record's message begins with it (the prefix, then the address in its
parenthesis) and the record is the kernel's (facility 0). Kernel messages quote text that a user chooses, and
such a record holds the driver's words elsewhere, or at its start followed by something else (real records,
tests/fixtures/kmsg/kmsg_quoted_driver_text.txt; fs/exec.c since Linux 5.18, once a boot):

    4,1289,10567963506,-;process 'perl' launched '/tmp/k43/NVRM: Xid (PCI:0000:8a:00): 142, pid=1, name=x, y' ...
    6,1290,10649982302,-;NVRM: Xid (PCI:[10949]: segfault at 0 ip 000055dc2a6e4132 ... error 6 in NVRM: Xid ...
    5,1292,10650083804,-;audit: type=1107 audit(1796540580.275:1): pid=10950 uid=0 ... msg='NVRM: Xid (PCI:...'
    12,1293,10671499017,-;NVRM: Xid (PCI:0000:8a:00): 142, pid=1, name=x, y

ignored_because() names why such a record is not the driver's: `quoted` (a kernel message that quotes it) or
`userspace` (a program wrote it to /dev/kmsg).

An SXid is counted on its `Fatal` or `Non-fatal` line; the `Severity ...` and `Data {...}` lines that
follow it detail the same error. A PCI address is returned in one canonical form, the one nvidia-smi's
`pci.bus_id` and dcgm-exporter's `pci_bus_id` label print: an 8-digit domain, upper-case hex and the
function, `00000000:9B:00.0` (the driver prints `0000:9b:00`).
"""

import re
from dataclasses import dataclass

_RECORD = re.compile(r"(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;(?P<message>.*)")
_PCI = re.compile(r"(?:PCI:)?(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<device>[0-9a-fA-F]{2})"
                  r"(?:\.(?P<function>[0-7]))?")
_ADDRESS = r"(?:PCI:)?[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
# The process is `pid=<n>, name=<comm>, ` or, from the RM itself, `pid='<unknown>', name=<unknown>, `.
_XID = re.compile(rf"NVRM: Xid \((?P<pci>{_ADDRESS})(?: [^)]*)?\): (?P<code>\d+),\s?"
                  r"(?:pid=(?P<pid>[^,]*), name=(?P<name>[^,]*), )?(?P<text>.*)")
_SXID = re.compile(rf"nvidia-nvswitch\d*: SXid \((?P<pci>{_ADDRESS})\): (?P<code>\d+), (?P<severity>Non-fatal|Fatal)"
                   r"(?:, (?P<text>.*))?")
# The start of every XID and SXid line the driver writes: its prefix, then the address in a parenthesis.
_DRIVER_LINE = re.compile(rf"(?:NVRM: Xid|nvidia-nvswitch\d*: SXid) \({_ADDRESS}[ )]")
# The driver's words anywhere in a message.
_DRIVER_WORDS = re.compile(r"NVRM: Xid|nvidia-nvswitch\d*: SXid")
IGNORED_REASONS = ("quoted", "userspace")
# XID 154's "to" side: `to 0x1 (GPU Reset Required)`; some texts quote it without the code.
_RECOVERY = re.compile(r"recovery action changed from .* to (?:0x(?P<code>[0-9a-fA-F]+)\s*)?"
                       r"(?:\((?P<name>[^()]*)\)|(?P<bare>[A-Za-z][\w ]*?))\.?\s*$")

RECOVERY_XID = 154
RECOVERY_ACTIONS = ("none", "reset", "reboot", "drain_p2p", "drain_and_reset")
# nvmlDeviceGpuRecoveryAction_t, as NVIDIA's "Error Recovery and Response Flags" lists it: None, GPU Reset
# Required, Node Reboot Required, Drain P2P, Drain and Reset.
_ACTION_CODES = dict(enumerate(RECOVERY_ACTIONS))
# For a code not in that list (newer drivers add some), the words of its text, the most specific first;
# "PF FLR" (a function-level reset) and "OS Reboot" are texts seen for codes 1 and 2.
_ACTION_WORDS = (("drain and reset", "drain_and_reset"), ("drain p2p", "drain_p2p"), ("reboot", "reboot"),
                 ("reset", "reset"), ("flr", "reset"), ("none", "none"))


@dataclass(frozen=True)
class Record:
    seq: int  # the kernel's 64-bit sequence number: rises by one per record, restarts at boot
    usec: int  # microseconds since boot, the kernel's monotonic clock
    message: str
    priority: int = 0  # syslog facility * 8 + level

    @property
    def from_kernel(self) -> bool:
        return self.priority >> 3 == 0  # facility 0, LOG_KERN


@dataclass(frozen=True)
class Xid:
    pci: str  # canonical, 00000000:18:00.0
    code: int
    pid: int | None  # None when the line names no process, or `'<unknown>'`
    process: str | None
    text: str  # the rest of the line: what happened

    @property
    def recovery_action(self) -> str | None:
        """For XID 154, the action it changed to (one of RECOVERY_ACTIONS); None otherwise or when unknown."""
        return recovery_action(self.text) if self.code == RECOVERY_XID else None


@dataclass(frozen=True)
class SXid:
    pci: str  # the NVSwitch's, canonical
    code: int
    fatal: bool
    text: str


def canonical_pci(address: str) -> str | None:
    """`PCI:0000:18:00`, `0018:01:00`, `00000000:1a:00.0` -> `00000000:18:00.0` ...; None if not an address."""
    match = _PCI.fullmatch(address.strip())
    if match is None:
        return None
    domain = int(match["domain"] or "0", 16)
    return f"{domain:08X}:{match['bus'].upper()}:{match['device'].upper()}.{match['function'] or 0}"


def parse_record(raw: str) -> Record | None:
    """One record: a read() of /dev/kmsg (its continuation lines after the first newline are left out)
    or a line of a file; None for anything else (a continuation line, a blank or damaged line)."""
    match = _RECORD.fullmatch(raw.split("\n", 1)[0])
    if match is None:
        return None
    return Record(seq=int(match["seq"]), usec=int(match["usec"]), message=match["message"],
                  priority=int(match["prio"]))


def parse_records(text: str) -> list[Record]:
    """A file of records, one per line: continuation lines and lines that are no record are skipped."""
    return [record for line in text.splitlines() if (record := parse_record(line)) is not None]


def parse_xid(message: str) -> Xid | None:
    """The XID of a record's message that begins with the driver's `NVRM: Xid (<address>...): <code>, `; None
    for any other (the driver's text inside another message is no XID: see ignored_because)."""
    if not message.startswith("NVRM: Xid"):  # most of the kernel log: skip the regular expression
        return None
    match = _XID.match(message)
    if match is None:
        return None
    pci = canonical_pci(match["pci"])
    if pci is None:
        return None
    pid, name = match["pid"], match["name"]
    return Xid(pci=pci, code=int(match["code"]), pid=int(pid) if pid and pid.isdigit() else None,
               process=name if name and name != "<unknown>" else None, text=match["text"].strip())


def parse_sxid(message: str) -> SXid | None:
    """The SXid of a message that begins with the driver's `nvidia-nvswitchN: SXid (<address>): <code>, Fatal` (or
    `Non-fatal`); None for any other."""
    if not message.startswith("nvidia-nvswitch"):
        return None
    match = _SXID.match(message)
    pci = canonical_pci(match["pci"]) if match else None
    if match is None or pci is None:
        return None
    return SXid(pci=pci, code=int(match["code"]), fatal=match["severity"] == "Fatal",
                text=(match["text"] or "").strip())


def ignored_because(record: Record) -> str | None:
    """Why a record that holds the driver's XID or SXid words is not the driver's line: `userspace` when it is
    not the kernel's (a program wrote it to /dev/kmsg), `quoted` when the kernel's message does not begin with
    the driver's prefix and address (a path, a process name, an audit text quoted in another message). None
    for the driver's own lines (counted, or detail such as an SXid's `Data {...}`) and records without them."""
    if _DRIVER_WORDS.search(record.message) is None:
        return None
    if not record.from_kernel:
        return "userspace"
    return None if _DRIVER_LINE.match(record.message) else "quoted"


def recovery_action(text: str) -> str | None:
    """XID 154's text -> the action it changed to: by the code in `0x<code>`, else by the words."""
    match = _RECOVERY.search(text)
    if match is None:
        return None
    if match["code"] is not None and int(match["code"], 16) in _ACTION_CODES:
        return _ACTION_CODES[int(match["code"], 16)]
    words = (match["name"] or match["bare"] or "").lower()
    return next((action for word, action in _ACTION_WORDS if word in words), None)
