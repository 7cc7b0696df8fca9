"""Real cgroup enforcement on `opsctl lab up`'s host-level slurmd (the lab machines cannot write cgroups
inside systemd-nspawn: their Slurm tracks job processes through /proc, tests/integration/provision/
test_provision_3_slurm.py). Needs root and the simulated cluster's Debian packages.
"""

import os
import subprocess

import pytest

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="the simulated cluster needs root")]


@pytest.mark.lab
def test_cgroup_enforcement_kills_leftovers_of_the_ended_job_only(lab):
    """Real cgroup enforcement (proctrack/cgroup, cgroup/v1), on `opsctl lab up`'s host-level slurmd:
    the lab machines cannot write cgroups inside systemd-nspawn. Job A leaves a setsid and a nohup child
    behind; job B of the same user on the same node keeps running after A ends. Both ask for a little
    memory: with CR_Core_Memory a job without --mem would hold all of the node's memory."""
    states = lab.sinfo_states()
    node = sorted(n for n, st in states.items() if st == "idle")[-1]
    token = str(os.getpid() % 1000).zfill(3)
    keep = lab.run("sbatch", "--parsable", "--mem=100M", "-w", node, "-o", "/dev/null", "-D", "/tmp",
                   "--wrap", f"sleep 300.{token}").stdout.strip()
    try:
        lab.wait_until(lambda: lab.run("squeue", "-h", "-j", keep, "-o", "%t").stdout.strip() == "R", 60,
                       "job B running")
        leaver = lab.run("sbatch", "--parsable", "--mem=100M", "-w", node, "-o", "/dev/null", "-D", "/tmp", "--wrap",
                         f"setsid sleep 8881.{token} & nohup sleep 8882.{token} >/dev/null 2>&1 & sleep 2"
                         ).stdout.strip()
        lab.wait_until(lambda: not lab.run("squeue", "-h", "-j", leaver, "-o", "%t", check=False).stdout.strip(),
                       90, "job A to end")

        def alive(pattern):
            return subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0

        lab.wait_until(lambda: not alive(f"sleep 888[12].{token}"), 30, "job A's leftovers to be killed")
        assert lab.run("squeue", "-h", "-j", keep, "-o", "%t").stdout.strip() == "R"
        assert alive(f"sleep 300.{token}")
    finally:
        lab.run("scancel", keep, check=False)
