"""What `opsctl why --spool` runs, from the head's opsctl-why.path unit, for every job that slurmctld's
EpilogSlurmctld left in its spool: explain and record it (opsctl.why.run.why_job with --record), then, for a
job that opted in, requeue it without its culprit (opsctl.recover.run). Here and not in opsctl/why/, so that
`why` does not depend on recovery."""

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from opsctl.clients import Clients
from opsctl.errors import ConfigError, ExitCode, OpsctlError, worst
from opsctl.health.catalog import load_catalog
from opsctl.recover.run import recover_job
from opsctl.why.run import why_job


@dataclass
class Spooled:
    """What a `--spool` run did: the jobs it explained and a line per entry it could not (`opsctl: ...`)."""

    explained: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)  # requeued without their culprit (opsctl/recover/)
    not_requeued: list[str] = field(default_factory=list)  # opted in, and refused (the audit log says why)
    errors: list[str] = field(default_factory=list)
    exit_code: ExitCode = ExitCode.OK


def why_spooled(clients: Clients, spool: Path, wait: float, warn: Callable[[str], None]) -> Spooled:
    """`--record` for every job that the controller's EpilogSlurmctld left in `spool`, an empty file named by
    its id, oldest first; each entry is removed before its job is explained, so a job that cannot be
    explained is said once and not retried forever (and the path unit that starts this run sees the
    directory empty). Only names are read: root never opens a file that the Slurm user made. A job that
    fails is one line, handed to `warn` as it happens and kept in the result; the others go on."""
    clients.config(acting=True)
    try:
        entries = sorted((e.stat(follow_symlinks=False).st_mtime, e.name) for e in os.scandir(spool))
    except OSError as err:
        raise ConfigError(f"--spool {spool}: {err.strerror}") from None
    result = Spooled()

    def error(line: str) -> None:
        result.errors.append(line)
        warn(line)

    rules = load_catalog(clients.config())  # once for every job of the run
    for _, name in entries:
        try:
            os.unlink(spool / name)
        except FileNotFoundError:
            continue  # another run took it
        except OSError as err:
            error(f"opsctl: --spool {spool}: cannot remove {name!r}: {err.strerror}")
            continue
        if not name.isdigit():
            error(f"opsctl: --spool {spool}: removed {name!r}, not a job id")
            continue
        try:
            answered = why_job(clients, name, True, wait, rules=rules)
        except OpsctlError as err:
            error(f"opsctl: job {name}: {err}")
            result.exit_code = worst(result.exit_code, err.exit_code)
            continue
        result.explained.append(name)
        if answered.answer is None:
            continue
        try:  # the answer is recorded: a requeue that fails is said, and the other jobs go on
            recovery = recover_job(clients, answered.answer)
        except OpsctlError as err:
            error(f"opsctl: job {name}: not requeued: {err}")
            result.exit_code = worst(result.exit_code, err.exit_code)
            continue
        if recovery is not None:
            (result.requeued if recovery.requeued else result.not_requeued).append(name)
            warn(f"opsctl: job {name}: {recovery.why}")
    return result
