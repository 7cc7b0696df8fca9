"""The writes of opsctl's state that change nothing in Slurm: audit records of what was not an action (a `why`
answer, a hold, an error), the validate results and queue, the --changes-only record, the evidence kept for a
vendor (an RMA bundle on the head, a failed diagnostic on the node), and the node's kernel-log position.

With the Actor (actor/act.py, which keeps its own Ledger), this is the one way anything writes under the state
directory or to the audit log: tests/unit/test_gateway.py fails if a module outside opsctl/actor/ does. Reads
are free to anyone: `ledger.state` (actor/state.py) and `ledger.audit_records()`. None of these writes takes
the run lock: `opsctl why --record` in the controller's epilog, a validate sweep and a read-only health run
never wait for, or stop, an acting run.
"""

import time
from pathlib import Path
from typing import Any

from opsctl.actor.audit import AuditLog
from opsctl.actor.lock import secure_dir
from opsctl.actor.memory import HandledMemory
from opsctl.actor.state import State
from opsctl.config.schema import Config
from opsctl.errors import ConfigError, OpsctlError
from opsctl.fileio import write_atomic

RMA_DIR = "rma"
EVIDENCE_DIR = "validation"


class Ledger:
    def __init__(self, config: Config):
        self.audit_log = AuditLog(config.audit_log)
        self.state = State(config.state_dir)

    # ---- the audit log ----------------------------------------------------------------------------------
    def audit(self, event: str, **fields: Any) -> None:
        """One audit record (actor/audit.py says its fields)."""
        self.audit_log.write(event, **fields)

    def audit_records(self, node: str | None = None, limit: int | None = None) -> tuple[list[dict[str, Any]],
                                                                                        list[str]]:
        """(records, warnings about torn lines); none when the log does not exist yet (a symlink in its place
        is refused, never followed: AuditLog.read)."""
        return self.audit_log.read(node=node, limit=limit)

    # ---- stores ---------------------------------------------------------------------------------------
    def save_handled(self, memory: HandledMemory) -> None:
        self.state.handled.save(memory)

    def save_healthy_since(self, data: dict[str, float]) -> None:
        self.state.healthy_since.save(data)

    def save_holds(self, holds: dict[str, dict[str, Any]]) -> None:
        self.state.holds.save(holds)

    def save_validations(self, data: dict[str, float]) -> None:
        self.state.validations.save(data)

    def save_validate_queue(self, data: dict[str, dict[str, Any]]) -> None:
        self.state.validate_queue.save(data)

    def save_last_run(self, kind: str, record: dict[str, Any]) -> None:
        self.state.last_runs.save(kind, record)

    def save_accepted_fabric(self, record: dict[str, Any]) -> None:
        """The fabric `opsctl ib topology --output` wrote topology.conf from: what `--check` compares with."""
        self.state.fabric.save(record)

    def save_fabric_history(self, runs: list[dict[str, Any]]) -> None:
        """The fabric test's kept runs (opsctl/fabrictest/history.py), replacing the file's."""
        self.state.fabric_history.save(runs)

    # ---- evidence for the vendor ------------------------------------------------------------------------
    def write_rma_bundle(self, node: str, now: float, files: dict[str, str]) -> Path:
        """<state_dir>/rma/<node>-<UTC time>/, one file per entry of `files`; ConfigError when it cannot."""
        bundle = self.state.path / RMA_DIR / f"{node}-{stamp(now)}"
        try:
            self._write_dir(bundle, files)
        except OSError as err:
            raise ConfigError(f"RMA bundle {bundle}: {err.strerror}") from None
        return bundle

    def keep_evidence(self, step: str, now: float, files: dict[str, str]) -> Path:
        """<state_dir>/validation/<UTC time>-<step>/ on the node: a failing diagnostic's output. A node that
        cannot write it still answers its step, so nothing is raised."""
        directory = self.state.path / EVIDENCE_DIR / f"{stamp(now)}-{step}"
        if files:
            try:
                self._write_dir(directory, files)
            except (OSError, OpsctlError):
                pass
        return directory

    @staticmethod
    def _write_dir(directory: Path, files: dict[str, str]) -> None:
        secure_dir(directory.parent, create=True)
        directory.mkdir(mode=0o750)
        for name, text in files.items():
            write_atomic(directory / name, text, mode=0o640)


def stamp(now: float) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))


def read_history(config: Config, node: str | None, limit: int, job: str | None = None
                 ) -> tuple[list[dict[str, Any]], list[str]]:
    """`opsctl history`: the audit log's last `limit` records (of one node, of one job), and warnings about torn
    lines. A job's records are those whose reason is `job N`: `why --record`'s and the requeues'."""
    if job is None:
        return Ledger(config).audit_records(node=node, limit=limit)
    records, warnings = Ledger(config).audit_records(node=node)
    return [r for r in records if r.get("reason") == f"job {job}"][-limit:], warnings
