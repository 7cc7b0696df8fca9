"""The append-only audit log: one JSON object per line for every action and every refusal.

Each line: {"time", "user", "event", "node", "checks", "evidence", "reason", "dry_run", "detail"}.
Lines are written with O_APPEND in one write, so concurrent writers never interleave a line. The
log holds no secrets: only node names, rule ids, evidence and the acting user.
"""

import getpass
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from opsctl.errors import ConfigError


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
              dry_run: bool = False, detail: str = "", now: float | None = None) -> None:
        record = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now)),
            "user": current_user(),
            "event": event,
            "node": node,
            "checks": list(checks),
            "evidence": evidence,
            "reason": reason,
            "dry_run": dry_run,
            "detail": detail,
        }
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except OSError as err:
            raise ConfigError(f"audit log {self.path}: {err.strerror} (set audit_log or OPSCTL_STATE_DIR)") from None

    def read(self, node: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return []
        except OSError as err:
            raise ConfigError(f"audit log {self.path}: {err.strerror}") from None
        records = []
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
            except ValueError:
                raise ConfigError(f"audit log {self.path} line {number}: not JSON") from None
            if node is None or record.get("node") == node:
                records.append(record)
        return records[-limit:] if limit else records
