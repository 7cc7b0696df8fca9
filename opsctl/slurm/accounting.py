"""Ended jobs from Slurm's accounting: `sacct --json`, which needs slurmdbd.

The JSON differs by release (tests/fixtures/slurm/sacct-*.json, captured from 22.05, 24.11 and 26.05):

- 22.05 (openapi/dbv0.0.38): `state: {"current": "FAILED", "reason": "None"}`, times as plain numbers
  (`time: {"start": 1796417595, "end": ...}`), `exit_code: {"status": "FAILED", "return_code": 1}` with a
  `signal: {"signal_id": 9, "name": "KILL"}` when a signal ended it.
- 23.02 and later (data_parser): `state.current` is a list (`["FAILED"]`), and numbers that may be unset are
  objects: `{"set": true, "infinite": false, "number": 1}` (return codes, signal ids; times stay plain).
  24.11 and later name the node of a NODE_FAIL: `"failed_node": "gpu005"`.
- 22.05's job-level `exit_code` says `{"status": "SUCCESS", "return_code": 0}` even for a failed job
  (its text output says 1:0): the state, not the exit code, says how a job ended.

Every release names the job's nodes as one host list (`"nodes": "gpu[001-004]"`); a job that never got
nodes says `"None assigned"`. A requeued job appears once per run; the last one counts.
"""

import time
from dataclasses import dataclass
from typing import Any

from opsctl.errors import SourceUnavailable
from opsctl.slurm.base import load_slurm_json
from opsctl.slurm.hostlist import expand_hostlist

# The states in which a job ended by a fault or a limit, not by its own success (sacct(1), JOB STATE CODES).
FAILED_STATES = {"FAILED", "NODE_FAIL", "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
                 "PREEMPTED"}


@dataclass(frozen=True)
class FinishedJob:
    id: str
    name: str
    user: str
    state: str  # sacct's state code: COMPLETED, FAILED, NODE_FAIL, TIMEOUT, CANCELLED, RUNNING, ...
    nodes: tuple[str, ...]
    start: float | None  # Unix seconds; None before it started
    end: float | None  # None while it runs
    exit: str = ""  # "exit 1", "signal KILL", "" for a plain success
    failed_node: str = ""  # the node whose failure ended it (NODE_FAIL; 24.11 and later say which)

    @property
    def ended(self) -> bool:
        return self.end is not None and self.state not in ("RUNNING", "PENDING", "SUSPENDED", "REQUEUED",
                                                           "RESIZING", "COMPLETING")

    @property
    def failed(self) -> bool:
        return self.state in FAILED_STATES


def _number(value: Any) -> float | None:
    """A plain number, or data_parser's {"set", "infinite", "number"}; None when unset or infinite."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _state(raw: dict[str, Any], where: str) -> str:
    state = raw.get("state")
    current = state.get("current") if isinstance(state, dict) else state
    if isinstance(current, list):  # 23.02+: ["FAILED"], or a base state and flags
        current = current[0] if current else ""
    if not isinstance(current, str) or not current:
        raise SourceUnavailable(f"{where}: job {raw.get('job_id')} has no state")
    return current.upper()


def _exit(raw: Any) -> str:
    if not isinstance(raw, dict):
        return ""
    signal = raw.get("signal") or {}
    signal_id = _number(signal.get("id", signal.get("signal_id"))) if isinstance(signal, dict) else None
    if signal_id:
        return f"signal {signal.get('name') or int(signal_id)}"
    code = _number(raw.get("return_code"))
    return f"exit {int(code)}" if code else ""


def _job(raw: Any, where: str) -> FinishedJob:
    if not isinstance(raw, dict) or _number(raw.get("job_id")) is None:
        raise SourceUnavailable(f"{where}: a job entry has no job_id")
    times = raw.get("time")
    times = times if isinstance(times, dict) else {}
    start, end = _number(times.get("start")), _number(times.get("end"))
    hostlist = raw.get("nodes")
    if not isinstance(hostlist, str):
        raise SourceUnavailable(f"{where}: job {raw['job_id']} has no node list")
    try:
        nodes = () if hostlist in ("", "None assigned") else tuple(expand_hostlist(hostlist))
    except ValueError as err:
        raise SourceUnavailable(f"{where}: job {raw['job_id']}: {err}") from None
    return FinishedJob(id=str(int(_number(raw["job_id"]) or 0)), name=str(raw.get("name") or ""),
                       user=str(raw.get("user") or ""), state=_state(raw, where), nodes=nodes,
                       start=start or None, end=end or None, exit=_exit(raw.get("exit_code")),
                       failed_node=str(raw.get("failed_node") or ""))


def parse_sacct(text: str, where: str = "sacct --json") -> list[FinishedJob]:
    """The jobs of one `sacct --json` answer, a requeued job's last run only, in the order sacct gives."""
    # 22.05 reports an empty answer as an error: {"description": "Nothing found", "error_number": 9003}.
    data = load_slurm_json(text, where, harmless=("Nothing found",))
    if not isinstance(data.get("jobs"), list):
        raise SourceUnavailable(f"{where}: output has no `jobs` list")
    jobs: dict[str, FinishedJob] = {}
    for raw in data["jobs"]:
        job = _job(raw, where)
        jobs.pop(job.id, None)
        jobs[job.id] = job
    return list(jobs.values())


def sacct_time(when: float) -> str:
    """sacct's -S/-E take local time as YYYY-MM-DDTHH:MM:SS."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(when))
