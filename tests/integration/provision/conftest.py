"""The provisioned lab machines, once per test session, for every module of this directory.

The modules run in the order of their file names (pytest's: by name, each module's tests in file order),
and the numbers in the names say that order, because later modules find the machines in the state that
earlier ones left: test_provision_1_runs.py checks the two provisioning runs first (the second one, after a
restart of the machines, must change nothing) before any other test drains, injects or re-provisions.
Then the services (2), Slurm and its jobs (3), the GPU node roles (4), alerts and the observability stack
(5), the InfiniBand precheck and fabric test (6), storage (7, 8), and the remediation ladder (9).
"""

import sys

import pytest

from tests.integration.provision.support import (
    Machines,
    provision_with_a_machine_stopped,
    restart_keeping_a_fault_and_a_drain,
    start_from_new_machines,
    timed_provision,
)


@pytest.fixture(scope="session")
def provisioned():
    """`make provision` on new machines (it brings them up), then a restart of the machines with a
    fault and a drain kept, then `lab machines reset`, then `make provision` again with one GPU machine
    stopped: that run must change nothing on the others and name the stopped one. Wall times go to the
    test log."""
    times: dict[str, float] = {}
    start_from_new_machines()
    first = timed_provision("first", times)
    machines = Machines()
    restart = restart_keeping_a_fault_and_a_drain(machines, times)
    stopped = machines.gpu_nodes[-1]
    after_restart = provision_with_a_machine_stopped(machines, stopped, times)
    sys.stderr.write("wall time: " + ", ".join(f"{what} {secs:.0f} s" for what, secs in times.items()) + "\n")
    return {"runs": [first, after_restart], "times": times, "machines": machines, "restart": restart,
            "stopped": stopped}


@pytest.fixture(scope="session")
def machines(provisioned):
    return provisioned["machines"]
