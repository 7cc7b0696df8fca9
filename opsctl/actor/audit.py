"""The append-only audit log: one JSON object per line for every action and every refusal.

Each line: {"time", "user", "event", "node", "state", "checks", "evidence", "reason", "dry_run",
"detail", "values"}, plus "healthy_seconds" on resumes. `state` is the node's Slurm state as opsctl saw
it (base plus flags, `IDLE+DRAIN`); on a refusal, `reason` is the Slurm reason on the node (the other
party's, when someone else drained it) and `detail` says why opsctl left it alone. `values` holds the
metric values behind the decision: [{"rule", "device", "value", "threshold"}]. Lines are written whole
with O_APPEND (concurrent writers never interleave a line) and fsync'd before opsctl goes on; the
file is opened with O_NOFOLLOW. A crash can at worst leave a torn last line, which `read` skips with
a warning. The log holds no secrets: only node names, rule ids, evidence, values and the acting user.
"""

import getpass
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from opsctl.errors import ConfigError, StateUnwritable
from opsctl.fileio import read_nofollow


def current_user() -> str:
    # Behind sudo the person is SUDO_USER; root alone says little in an audit trail.
    sudo = os.environ.get("SUDO_USER")
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{sudo} (as {user})" if sudo and sudo != user else user


class AuditLog:
    def __init__(self, path: Path):
        self.path = Path(path)

    def write(self, event: str, node: str = "", checks: Iterable[str] = (), evidence: str = "", reason: str = "",
              dry_run: bool = False, detail: str = "", now: float | None = None,
              values: Iterable[dict[str, Any]] = (), healthy_seconds: float | None = None,
              state: str = "") -> None:
        record = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now)),
            "user": current_user(),
            "event": event,
            "node": node,
            "state": state,
            "checks": list(checks),
            "evidence": evidence,
            "reason": reason,
            "dry_run": dry_run,
            "detail": detail,
            "values": list(values),
        }
        if healthy_seconds is not None:
            record["healthy_seconds"] = round(healthy_seconds)
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o640)
            try:
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    line = b"\n" + line  # after a torn line (a crash mid-write), start a line of our own
                written = 0
                while written < len(line):  # a short write (a full disk) is retried, then raised
                    written += os.write(fd, line[written:])
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as err:
            # A change without its audit record must not look like a config mistake (exit 3, not 2).
            raise StateUnwritable(f"audit log {self.path}: {err.strerror}") from None

    def read(self, node: str | None = None, limit: int | None = None) -> tuple[list[dict[str, Any]], list[str]]:
        """(records, warnings). A torn line (a crash while writing it) is skipped with a warning."""
        try:
            text = read_nofollow(self.path)
        except OSError as err:
            raise ConfigError(f"audit log {self.path}: {err.strerror}") from None
        lines = (text or "").splitlines()
        records, warnings = [], []
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
            except ValueError:
                where = "torn last line" if number == len(lines) else "torn line (not JSON)"
                warnings.append(f"audit log {self.path} line {number}: {where} skipped")
                continue
            if node is None or record.get("node") == node:
                records.append(record)
        return (records[-limit:] if limit else records), warnings
