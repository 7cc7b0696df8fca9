"""The one result of every command that acts on nodes outside `opsctl health` (which returns a RunResult
with its verdicts): `drain`, `resume`, `ib quarantine`, `ib fabric-test --drain` and `node check
--drain-self`. Each command's renderer prints `lines` (JSON carries them as `actions`) and exits with
`exit_code`."""

from dataclasses import dataclass, field

from opsctl.errors import ExitCode


@dataclass
class Outcome:
    lines: list[str] = field(default_factory=list)  # a line per change, refusal or stop, in the order they came
    drained: list[str] = field(default_factory=list)  # drained (with --dry-run: would be)
    resumed: list[str] = field(default_factory=list)  # resumed (with --dry-run: would be)
    stop: str = ""  # the safety stop, when a limit stopped (some of) the changes
    exit_code: ExitCode = ExitCode.OK
