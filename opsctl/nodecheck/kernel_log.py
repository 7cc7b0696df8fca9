"""`opsctl node check`: the GPU XIDs and NVSwitch SXids that the NVIDIA driver wrote to the kernel log
since the last run, counted for node_exporter (opsctl.nodecheck.report). Some XIDs never reach DCGM
(NVIDIA/DCGM issue 235: XID 62); the kernel log has every one (docs/gpu-kernel-log.md).

Each run reads the whole log (/dev/kmsg: one record per read(), from the oldest one the ring still holds;
a regular file: one record per line) and counts the records after the last one it read. It keeps that
record's sequence number and the boot id in <state_dir>/kernel_log.json, per log path (opsctl.actor.node_state:
never through a symlink, replaced atomically). A new boot id (a reboot) or
a log whose newest record is older than that one (a file started again) is read from its start. The
counts are cumulative across runs and reboots (Prometheus counters); the latest XID 154 recovery action
of each GPU, and the GPUs' nvidia-smi indexes, hold for one boot.

Only the driver's own lines count: a record whose message begins with the driver's prefix and address, from
the kernel (facility 0). A record that holds the driver's words otherwise (a kernel message quoting a user's
file or process name, an audit text, a program's write to /dev/kmsg) is counted as ignored, by why
(opsctl.gpu.kmsg.ignored_because): a forged XID must never drain a node, and must not go unseen either.

A log or a state that cannot be read or written makes a check that could not run (`read_ok` false, the
reason in --json), never a failure: node check's exit code does not change and nothing drains here.
"""

import copy
import errno
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opsctl.actor.node_state import STATE_FILE, KernelLogPositions, PositionsUnreadable
from opsctl.config.schema import GpuConfig
from opsctl.errors import OpsctlError, SourceUnavailable
from opsctl.gpu.kmsg import Record, SXid, Xid, ignored_because, parse_record, parse_records, parse_sxid, parse_xid
from opsctl.gpu.nvidia_smi import GpuIndexes, NvidiaSmiImpl

CHECK = "kernel-log"
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
# A record with its context is at most 8 KiB (CONSOLE_EXT_LOG_MAX); a read() into less fails EINVAL.
READ_SIZE = 16384
# opsctl_node_kernel_xid_count counts the XIDs node check first saw within this window, as dcgm-exporter's
# DCGM_EXP_XID_ERRORS_COUNT does for DCGM's: the health rules read both alike (and opsctl_node_kernel_sxid_count,
# the SXids'). The run's time, not the kernel's: a node check that was stopped for a while still reports what it
# then reads as new.
# 15 minutes outlast the timer (1 minute), a scrape and the rules' hold many times over.
XID_WINDOW_S = 900


@dataclass
class XidTally:
    count: int = 0
    last_seen: float = 0.0  # unix seconds: when the newest of them was logged (see Seen.time)
    recent: list[float] = field(default_factory=list)  # the runs that first saw them, within XID_WINDOW_S


@dataclass
class KernelLogState:
    """What kernel_log.json keeps of one log from one run to the next."""

    boot_id: str = ""
    seq: int = -1  # the newest record read; -1: none yet
    xids: dict[tuple[str, int], XidTally] = field(default_factory=dict)  # (GPU PCI, XID) ->
    sxids: dict[tuple[str, int, bool], XidTally] = field(default_factory=dict)  # (NVSwitch PCI, SXid, fatal) ->
    recovery: dict[str, str] = field(default_factory=dict)  # GPU PCI -> its latest XID 154 action, this boot
    gpus: dict[str, int] = field(default_factory=dict)  # GPU PCI -> nvidia-smi index, this boot
    # Records with the driver's words that are not its lines, by why (opsctl.gpu.kmsg.ignored_because) -> count
    ignored: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"boot_id": self.boot_id, "seq": self.seq,
                "xids": [{"pci_bus_id": pci, "xid": xid, "count": t.count, "last_seen": t.last_seen,
                          "recent": t.recent}
                         for (pci, xid), t in sorted(self.xids.items())],
                "sxids": [{"nvswitch_pci": pci, "sxid": sxid, "fatal": fatal, "count": t.count,
                           "last_seen": t.last_seen, "recent": t.recent}
                          for (pci, sxid, fatal), t in sorted(self.sxids.items())],
                "recovery_actions": dict(sorted(self.recovery.items())), "gpus": dict(sorted(self.gpus.items())),
                "ignored_records": dict(sorted(self.ignored.items()))}

    @classmethod
    def from_json(cls, data: Any) -> "KernelLogState":
        """ValueError, TypeError or KeyError for anything but what to_json wrote."""
        return cls(boot_id=str(data["boot_id"]), seq=int(data["seq"]),
                   xids={(str(x["pci_bus_id"]), int(x["xid"])): XidTally(int(x["count"]), float(x["last_seen"]),
                                                                         [float(t) for t in x.get("recent", [])])
                         for x in data["xids"]},
                   # last_seen and recent: absent from the files of releases that only counted SXids
                   sxids={(str(s["nvswitch_pci"]), int(s["sxid"]), bool(s["fatal"])):
                          XidTally(int(s["count"]), float(s.get("last_seen", 0.0)),
                                   [float(t) for t in s.get("recent", [])])
                          for s in data["sxids"]},
                   recovery={str(k): str(v) for k, v in data["recovery_actions"].items()},
                   gpus={str(k): int(v) for k, v in data["gpus"].items()},
                   # absent from the files of releases that did not count them
                   ignored={str(k): int(v) for k, v in data.get("ignored_records", {}).items()})


@dataclass(frozen=True)
class Seen:
    """An XID or SXid new in this run."""

    seq: int
    time: float  # unix seconds: the kernel's time of the record (/dev/kmsg), else the run's
    event: Xid | SXid


@dataclass
class KernelLogReport:
    source: str  # the configured kernel log
    state: KernelLogState = field(default_factory=KernelLogState)  # the counts so far, this run's included
    seen: list[Seen] = field(default_factory=list)
    why: str = ""  # why the log could not be read (or the state kept): the check could not run
    gpu_note: str = ""  # why some GPU indexes are unknown (nvidia-smi's error)

    @property
    def read_ok(self) -> bool:
        return not self.why

    def index(self, pci: str) -> int | None:
        """The GPU's nvidia-smi index; None when nvidia-smi has not named it this boot."""
        return self.state.gpus.get(pci)

    def gpu(self, pci: str) -> str:
        """The index as a label value: "" when unknown."""
        index = self.index(pci)
        return "" if index is None else str(index)


def advance(state: KernelLogState, boot_id: str, records: list[Record], now: float,
            boot_time: float | None = None) -> tuple[KernelLogState, list[Seen]]:
    """The state after reading `records` (the whole log, oldest first) and what is new in them. A record is
    placed at `boot_time` + its microseconds since boot when that is the kernel's clock (/dev/kmsg), at
    `now` otherwise (a file, whose clock is not this kernel's); never later than `now`."""
    new = copy.deepcopy(state)
    if boot_id != state.boot_id:  # a reboot: the cursor, the recovery actions and the indexes were the last boot's
        new = KernelLogState(boot_id=boot_id, xids=new.xids, sxids=new.sxids, ignored=new.ignored)
    elif records and max(r.seq for r in records) < state.seq:  # the log started again
        new.seq = -1
    seen = []
    for record in records:
        if record.seq <= new.seq:
            continue
        # Only the driver's own lines count: a user's text quoted by the kernel (a path exec'd with an empty
        # argv, a process name) or a program's write to /dev/kmsg is counted apart, never as an XID.
        if (reason := ignored_because(record)) is not None:
            new.ignored[reason] = new.ignored.get(reason, 0) + 1
            continue
        event = (parse_xid(record.message) or parse_sxid(record.message)) if record.from_kernel else None
        if event is not None:
            when = now if boot_time is None else min(now, boot_time + record.usec / 1e6)
            seen.append(Seen(record.seq, when, event))
            _count(new, event, when, now)
    for tally in [*new.xids.values(), *new.sxids.values()]:
        tally.recent = [t for t in tally.recent if t > now - XID_WINDOW_S]
    if records:
        new.seq = max(new.seq, *(r.seq for r in records))
    return new, seen


def _count(state: KernelLogState, event: Xid | SXid, when: float, now: float) -> None:
    tally = (state.sxids.setdefault((event.pci, event.code, event.fatal), XidTally()) if isinstance(event, SXid)
             else state.xids.setdefault((event.pci, event.code), XidTally()))
    tally.count += 1
    tally.last_seen = max(tally.last_seen, when)
    tally.recent.append(now)
    if isinstance(event, Xid) and event.recovery_action is not None:  # oldest first: the last is the GPU's latest
        state.recovery[event.pci] = event.recovery_action


def check_kernel_log(config: GpuConfig, state_dir: Path, now: float, gpus: GpuIndexes | None = None,
                     boot_id_path: Path = BOOT_ID_PATH) -> KernelLogReport:
    """Read what is new in the kernel log and keep the counts; never raises for what it cannot read."""
    report = KernelLogReport(source=config.kernel_log_path)
    try:
        positions = KernelLogPositions(state_dir)
        with positions.locked():
            logs = positions.load()
            report.state = _state_of(logs, report.source, state_dir)  # goes out even if the log cannot be read
            boot_id = _read_text(boot_id_path, "the boot id").strip()
            records, own = read_kernel_log(config.kernel_log_path)
            boot_time = now - time.clock_gettime(time.CLOCK_MONOTONIC) if own else None
            report.state, report.seen = advance(report.state, boot_id, records, now, boot_time)
            report.gpu_note = _learn_indexes(report, gpus or NvidiaSmiImpl(config.nvidia_smi))
            positions.save({**logs, report.source: report.state.to_json()})
    except (OpsctlError, _NotRead, PositionsUnreadable) as err:
        report.why = str(err)
    return report


class _NotRead(Exception):
    pass


def _learn_indexes(report: KernelLogReport, gpus: GpuIndexes) -> str:
    """Ask nvidia-smi once a boot, and again only for a GPU it has not named this boot: a GPU that fell off
    the bus is no longer listed, and keeps the index it had."""
    state = report.state
    wanted = {s.event.pci for s in report.seen if isinstance(s.event, Xid)} | set(state.recovery)
    if state.gpus and wanted <= state.gpus.keys():
        return ""
    try:
        state.gpus.update(gpus.gpu_indexes())
    except SourceUnavailable as err:
        return str(err) if state.xids or state.recovery else ""  # no GPU to name, nothing unknown
    missing = sorted(wanted - state.gpus.keys())
    return f"nvidia-smi does not list {', '.join(missing)}" if missing else ""


def read_kernel_log(path: str) -> tuple[list[Record], bool]:
    """The log's records, oldest first, and whether they are the kernel's own (a character device)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # O_NONBLOCK: a FIFO never blocks
    except OSError as err:
        raise _NotRead(f"cannot read {path}: {_reason(err)}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISCHR(mode):
            return _read_records(fd), True
        if stat.S_ISREG(mode):
            return parse_records(_read_all(fd).decode(errors="replace")), False
        raise _NotRead(f"cannot read {path}: neither /dev/kmsg nor a regular file")
    except OSError as err:
        raise _NotRead(f"cannot read {path}: {_reason(err)}") from None
    finally:
        os.close(fd)


def _read_records(fd: int) -> list[Record]:
    """/dev/kmsg: each read() returns one record; EAGAIN (O_NONBLOCK) once none is left."""
    os.lseek(fd, 0, os.SEEK_SET)  # the first record the ring still holds
    records: list[Record] = []
    while True:
        try:
            raw = os.read(fd, READ_SIZE)
        except BlockingIOError:
            return records
        except BrokenPipeError:  # EPIPE: the ring overwrote records meanwhile; the next read goes on after them
            continue
        if not raw:
            return records
        if (record := parse_record(raw.decode(errors="replace"))) is not None:
            records.append(record)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _read_text(path: Path, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as err:
        raise _NotRead(f"cannot read {what} ({path}): {_reason(err)}") from None


def _state_of(logs: dict[str, Any], source: str, state_dir: Path) -> KernelLogState:
    try:
        return KernelLogState.from_json(logs[source]) if source in logs else KernelLogState()
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise _NotRead(f"state file {state_dir / STATE_FILE} is unreadable ({source}: {err!r}); move it away to "
                       "reset") from None


def _reason(err: OSError) -> str:
    return "a symlink, refused" if err.errno == errno.ELOOP else (err.strerror or str(err))
