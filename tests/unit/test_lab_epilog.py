"""The lab's EpilogSlurmctld is the slurm_controller role's own template, rendered for the lab's spool, and
the lab's stand-in for the opsctl-why.path unit sees a job left there. The lab tier runs both under the real
slurmctld (tests/integration/lab/test_lab_recover.py)."""

from opsctl_lab import paths as lp
from opsctl_lab.slurm_lab import EPILOG_TEMPLATE, epilog_slurmctld, write_epilog_slurmctld
from opsctl_lab.why_spool import has_entries


def test_the_lab_renders_the_roles_epilog_for_its_own_spool(tmp_path):
    paths = lp.LabPaths(tmp_path)
    paths.slurm.mkdir()
    write_epilog_slurmctld(paths)
    script = epilog_slurmctld(paths).read_text()
    assert script.startswith("#!/bin/sh\n# Rendered by `opsctl lab up`")
    assert f': > "{paths.why_spool}/$SLURM_JOB_ID"' in script and "{{" not in script
    # Every line of the role's template past its header is there: the lab runs the role's epilog, not its own.
    role_lines = [line for line in EPILOG_TEMPLATE.read_text().splitlines()[2:] if "{{" not in line]
    assert role_lines and all(line in script.splitlines() for line in role_lines)
    assert epilog_slurmctld(paths).stat().st_mode & 0o777 == 0o755


def test_the_spool_watcher_sees_a_job_left_in_the_spool(tmp_path):
    spool = tmp_path / "spool"
    assert not has_entries(str(spool))  # not made yet
    spool.mkdir()
    assert not has_entries(str(spool))
    (spool / "17").touch()
    assert has_entries(str(spool))
