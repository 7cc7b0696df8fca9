"""The one result of what an acting command did, whichever command: the actor fills it as it acts.

- `done`: a line per change made, in the order made (`drain gpu007: opsctl:xid-79 gpu3 ...`): what the
  error of a failing run lists as done before it too;
- `would`: with --dry-run, a line per change the run would have made, in the same words;
- `refused`: node -> why, per change opsctl decided not to make (someone else's drain, a safety limit,
  Slurm changed since the plan), each also an audit record; a refusal of the whole run (a partial answer
  from Prometheus) is under the key `*`;
- `skipped`: node -> why, per node left alone on purpose before any change was planned for it (not a
  Slurm node, held by a person, its jobs outlasted the wait). A mapping, so that `node in skipped` works.

Each feature's own result wraps one (`RunResult.action`, `RemediateResult.action`, ...), and every acting
command's --json carries its fields (docs/json.md). `lines`, `drained` and `resumed` are what the older
commands (`drain`, `resume`, `ib quarantine`, `ib fabric-test --drain`, `node check --drain-self`) print.
"""

from dataclasses import dataclass, field
from typing import Any

from opsctl.errors import ExitCode


@dataclass
class ActionResult:
    done: list[str] = field(default_factory=list)
    would: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)  # a line per change, refusal or stop, in the order they came
    drained: list[str] = field(default_factory=list)  # drained (with --dry-run: would be)
    resumed: list[str] = field(default_factory=list)  # resumed (with --dry-run: would be)
    stop: str = ""  # the safety stop, when a limit stopped (some of) the changes
    exit_code: ExitCode = ExitCode.OK

    def fields(self) -> dict[str, Any]:
        """The fields every acting command's --json has."""
        return {"done": list(self.done), "would": list(self.would), "refused": dict(self.refused),
                "skipped": dict(self.skipped)}

