"""slurm_common's table of the slurm.conf keys a reconfigure does not apply (vars/main.yml,
_slurm_restart_keys), against the installed Slurm's own slurm.conf(5): every parameter the manual marks
"A restart of ... is required" is in the table, or names a plugin (…Type, …Plugin), which the filter
restarts for anyway."""

import gzip
import re
from pathlib import Path

import pytest

from tests.unit.test_roles_static import ROLES, load_yaml

MANUAL = Path("/usr/share/man/man5/slurm.conf.5.gz")  # Debian's slurm-client (make deps-test)


def restart_marked(roff: str) -> set[str]:
    """Parameters (`.TP` then `\\fBName\\fR`) whose text says that a restart is required."""
    marked, current, lines = set(), None, roff.splitlines()
    for previous, line in zip([""] + lines[:-1], lines, strict=True):
        term = re.fullmatch(r"\\fB([A-Za-z]+)\\fR\s*", line)
        if term and previous.strip() == ".TP":
            current = term[1]
        elif current and re.search(r"A restart of (the )?slurm(ctld|d)", line):
            marked.add(current)
    return marked


@pytest.mark.skipif(not MANUAL.exists(), reason="slurm-client's manual pages are not installed")
def test_every_key_the_manual_marks_for_a_restart_restarts():
    marked = restart_marked(gzip.decompress(MANUAL.read_bytes()).decode())
    assert {"SelectType", "SlurmctldPort", "StateSaveLocation", "GresTypes"} <= marked  # the parse works
    table = set(load_yaml(ROLES / "slurm_common" / "vars" / "main.yml")["_slurm_restart_keys"])
    # `defer` is an option of SchedulerParameters, whose entry in the manual it is.
    options = {"defer": "SchedulerParameters"}
    missing = {options.get(key, key) for key in marked} - table
    assert {key for key in missing if not key.endswith(("Type", "Plugin"))} == set()
