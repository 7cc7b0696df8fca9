"""opsctl's state on disk: small stores, one file and one purpose each, in the state directory.

| store | file | what |
|---|---|---|
| `budgets` | budget.json | times of the drains, resumes, resets and reboots of the last hour |
| `holds` | holds.json | the nodes a person took off the remediation ladder (`opsctl hold`) |
| `handled` | handled.json | the events opsctl acted on (actor/memory.py), so a repair is never undone |
| `healthy_since` | healthy_since.json | since when each drained node reads healthy, for resume |
| `resumes` | resumed.json | when opsctl last put each node back in service (kept a day) |
| `custody` | custody.json | what the actor last set on each node in Slurm (actor/custody.py), before scontrol |
| `validations` | validated.json | when `opsctl validate` last validated each node |
| `validate_queue` | validate-queue.json | the nodes `opsctl suspects --queue` asked to validate first |
| `last_runs` | last_runs.json | the verdicts of the last run of each kind, for `health --changes-only` |
| `fabric` | fabric.json | the InfiniBand fabric last accepted by `opsctl ib topology --output`, for `--check` |
| `fabric_history` | fabric-test-history.json | the rail tests of the last fabric-test runs (fabrictest/history.py) |

Files are opened with O_NOFOLLOW (a symlink planted in their place is refused, never followed) and replaced
atomically, so a crash never leaves half a file. Reads are free to anyone; writes go through the actor
package (actor/act.py, actor/ledger.py). Only the lock holder writes, except the --changes-only record,
which read-only runs write too: two runs at once may lose one record, and the next run of that kind then
logs its non-ok nodes once more.
"""

import json
from pathlib import Path
from typing import Any

from opsctl.actor.lock import secure_dir
from opsctl.actor.memory import HandledMemory
from opsctl.errors import ConfigError, StateUnwritable
from opsctl.fileio import read_nofollow, write_atomic

HOUR = 3600.0
DAY = 86400.0
# The hourly budgets: drains and resumes (`opsctl health`), resets and reboots (`opsctl remediate`).
BUDGET_KINDS = ("drains", "resumes", "resets", "reboots")


class JsonFile:
    """One JSON file of the state directory."""

    def __init__(self, directory: Path, name: str):
        self.directory, self.path = Path(directory), Path(directory) / name

    def load(self, default: Any) -> Any:
        if not secure_dir(self.directory, create=False):
            return default
        try:
            text = read_nofollow(self.path)
            return default if text is None else json.loads(text)
        except (OSError, ValueError) as err:
            raise self.unreadable(str(err)) from None

    def save(self, data: object) -> None:
        secure_dir(self.directory, create=True)
        try:
            write_atomic(self.path, json.dumps(data, indent=1, sort_keys=True), mode=0o600)
        except OSError as err:  # a full disk or a permission error: the safety record may be missing (exit 3)
            raise StateUnwritable(f"state file {self.path}: {err.strerror}") from None

    def unreadable(self, why: str) -> ConfigError:
        return ConfigError(f"state file {self.path} is unreadable ({why}); move it away to reset")


def _times(data: Any) -> dict[str, float]:
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _entries(data: Any) -> dict[str, dict[str, Any]]:
    return {str(k): v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


class Budgets:
    def __init__(self, directory: Path):
        self.file = JsonFile(directory, "budget.json")

    def recent(self, kind: str, now: float) -> list[float]:
        """Times of the `kind` (one of BUDGET_KINDS) within the last hour."""
        return [t for t in self.file.load({}).get(kind, []) if now - t < HOUR]

    def record(self, kind: str, count: int, now: float) -> None:
        if count:
            data = {k: self.recent(k, now) for k in BUDGET_KINDS}
            data[kind] = data[kind] + [now] * count
            self.file.save(data)


class Holds:
    def __init__(self, directory: Path):
        self.file = JsonFile(directory, "holds.json")

    def load(self) -> dict[str, dict[str, Any]]:
        """node -> {"since", "user", "why"}."""
        holds = self.file.load({})
        if not isinstance(holds, dict):
            raise self.file.unreadable("not an object")
        return holds

    def save(self, holds: dict[str, dict[str, Any]]) -> None:
        self.file.save(holds)


class HandledEvents:
    def __init__(self, directory: Path):
        self.file = JsonFile(directory, "handled.json")

    def load(self) -> HandledMemory:
        try:
            return HandledMemory.from_json(self.file.load([]))
        except TypeError as err:
            raise self.file.unreadable(str(err)) from None

    def save(self, memory: HandledMemory) -> None:
        self.file.save(memory.to_json())


class NodeTimes:
    """node -> a time (Unix seconds), one file."""

    def __init__(self, directory: Path, name: str):
        self.file = JsonFile(directory, name)

    def load(self) -> dict[str, float]:
        return _times(self.file.load({}))

    def save(self, data: dict[str, float]) -> None:
        self.file.save(data)


class Resumes:
    def __init__(self, directory: Path):
        self.file = JsonFile(directory, "resumed.json")

    def load(self) -> dict[str, float]:
        """node -> the time of opsctl's last resume of it (kept for a day)."""
        return _times(self.file.load({}))

    def record(self, nodes: list[str], now: float) -> None:
        data = {n: t for n, t in self.load().items() if now - t < DAY}
        self.file.save(data | dict.fromkeys(nodes, now))


class Custody:
    def __init__(self, directory: Path):
        self.file = JsonFile(directory, "custody.json")

    def load(self) -> dict[str, dict[str, Any]]:
        """node -> the actor's last entry for it: {"event", "reason", "prior", "user", "at"} (actor/custody.py)."""
        return _entries(self.file.load({}))

    def record(self, entries: dict[str, dict[str, Any] | None]) -> None:
        """Set each node's entry; None removes it (a failed change gives back the entry it replaced)."""
        data = self.load()
        for node, last in entries.items():
            if last is None:
                data.pop(node, None)
            else:
                data[node] = last
        self.file.save(data)


class ValidateQueue:
    def __init__(self, directory: Path):
        self.file = JsonFile(directory, "validate-queue.json")

    def load(self) -> dict[str, dict[str, Any]]:
        """node -> {"since": when it was queued, "why": in words}: the nodes that the next `opsctl validate
        --idle` takes first, however recently they were validated (`opsctl suspects --queue`)."""
        return _entries(self.file.load({}))

    def save(self, data: dict[str, dict[str, Any]]) -> None:
        self.file.save(data)


class LastRuns:
    def __init__(self, directory: Path):
        self.file = JsonFile(directory, "last_runs.json")

    def get(self, kind: str) -> dict[str, Any] | None:
        """The record saved for this kind of run; None before the first."""
        record = self._all().get(kind)
        if record is None:
            return None
        nodes = record.get("nodes") if isinstance(record, dict) else None
        if not isinstance(record, dict) or not isinstance(nodes, dict) or not all(
                isinstance(v, dict) and isinstance(v.get("status"), str) for v in nodes.values()):
            raise self.file.unreadable(f"no nodes with a status for {kind!r}")
        return record

    def save(self, kind: str, record: dict[str, Any]) -> None:
        """Replace the record of one kind, keeping the others (a read-only run never hides the timer's)."""
        self.file.save({**self._all(), kind: record})

    def _all(self) -> dict[str, Any]:
        runs = self.file.load({})
        if not isinstance(runs, dict):
            raise self.file.unreadable("not an object")
        return runs


class AcceptedFabric:
    def __init__(self, directory: Path):
        self.file = JsonFile(directory, "fabric.json")

    def load(self) -> dict[str, Any] | None:
        """The fabric record (opsctl/topology/fabric.py, Fabric.record) with "accepted" (when) and "source"; None
        before the first `opsctl ib topology --output`."""
        record = self.file.load(None)
        if record is not None and not (isinstance(record, dict) and isinstance(record.get("hcas"), dict)
                                       and isinstance(record.get("switches"), dict)):
            raise self.file.unreadable("not a fabric record")
        return record

    def save(self, record: dict[str, Any]) -> None:
        self.file.save(record)


class FabricHistory:
    """The fabric test's runs, oldest first: {"format": FORMAT, "runs": [...]}. Every run writes it, read-only
    runs too (as --changes-only does): two runs at once may lose one run's record."""

    FORMAT = "opsctl-fabric-test-history/1"

    def __init__(self, directory: Path):
        self.file = JsonFile(directory, "fabric-test-history.json")

    def load(self) -> list[dict[str, Any]]:
        """The runs' records ([] before the first run); a file that is not this history is unreadable."""
        data = self.file.load(None)
        if data is None:
            return []
        if not (isinstance(data, dict) and data.get("format") == self.FORMAT and isinstance(data.get("runs"), list)
                and all(isinstance(run, dict) for run in data["runs"])):
            raise self.file.unreadable(f"not a fabric-test history ({self.FORMAT})")
        runs: list[dict[str, Any]] = data["runs"]
        return runs

    def save(self, runs: list[dict[str, Any]]) -> None:
        self.file.save({"format": self.FORMAT, "runs": runs})


class Requeues:
    """opsctl's requeues of jobs (opsctl/recover/): job id -> [{"at", "culprit"}], oldest first. The count per
    job is its cap, the last hour's entries the budget and the breaker. A job's entries are kept a week after
    its last requeue (a job requeued again after that starts its count anew)."""

    KEEP = 7 * DAY

    def __init__(self, directory: Path):
        self.file = JsonFile(directory, "requeues.json")

    def load(self) -> dict[str, list[dict[str, Any]]]:
        data = self.file.load({})
        if not isinstance(data, dict) or not all(
                isinstance(v, list) and all(isinstance(e, dict) and isinstance(e.get("at"), int | float) for e in v)
                for v in data.values()):
            raise self.file.unreadable("not job id -> requeues")
        return data

    @staticmethod
    def recent(requeues: dict[str, list[dict[str, Any]]], now: float) -> list[dict[str, Any]]:
        """Every requeue of the last hour, of any job, from what load() read."""
        return [e for entries in requeues.values() for e in entries if now - e["at"] < HOUR]

    def record(self, job: str, culprit: str, now: float) -> None:
        data = {j: v for j, v in self.load().items() if v and now - v[-1]["at"] < self.KEEP}
        data[job] = data.get(job, []) + [{"at": now, "culprit": culprit}]
        self.file.save(data)


class State:
    """The stores of one state directory."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.budgets = Budgets(self.path)
        self.holds = Holds(self.path)
        self.handled = HandledEvents(self.path)
        self.healthy_since = NodeTimes(self.path, "healthy_since.json")  # since when a drained node reads ok
        self.resumes = Resumes(self.path)
        self.custody = Custody(self.path)
        self.validations = NodeTimes(self.path, "validated.json")  # when its last validation job ended
        self.validate_queue = ValidateQueue(self.path)
        self.last_runs = LastRuns(self.path)
        self.fabric = AcceptedFabric(self.path)  # the accepted InfiniBand fabric
        self.fabric_history = FabricHistory(self.path)  # the fabric test's runs
        self.requeues = Requeues(self.path)  # opsctl's requeues of failed jobs
