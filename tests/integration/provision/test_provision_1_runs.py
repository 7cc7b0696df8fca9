"""The provisioning runs themselves (the session's `provisioned` fixture, conftest.py): `make provision`
against the lab machines with no failed task and its phase times; the restart of the machines in between,
which keeps a fault and a drain that `lab machines reset` then clears; and the second run, which must change
nothing and leaves a stopped machine out. First of the provision modules: the other tests change the
machines (test_provision_3_slurm.py changes one slurm.conf setting and checks exactly what it touches).
"""

import pytest

from tests.integration.provision.support import (
    NEEDS_MACHINES,
    NEEDS_ROOT,
    changed_tasks,
    lab_cli,
    recap,
)

pytestmark = [NEEDS_ROOT]


@pytest.mark.provision
@NEEDS_MACHINES
def test_provision_has_no_failed_task_and_prints_phase_times(provisioned):
    first = provisioned["runs"][0]
    hosts = recap(first)
    assert set(hosts) == set(provisioned["machines"].hosts)
    assert all(h["failed"] == 0 and h["unreachable"] == 0 for h in hosts.values()), hosts
    assert "== provision: playbooks/site.yml on inventory/lab:" in first
    assert "== provision: lab machines" in first
    # The time per role, from ansible-core's junit callback, after the recap: one line per role that ran.
    summary = first.split("== provision: time per role", 1)[1].split("\n== provision:", 1)[0].splitlines()[1:]
    timed = {line.split()[0]: float(line.split()[-2]) for line in summary}
    assert {"common", "slurm_common", "total"} <= set(timed) and timed["total"] > 0, summary


@pytest.mark.provision
@NEEDS_MACHINES
def test_machines_up_reports_the_fault_and_drain_it_finds_and_reset_clears_them(provisioned):
    up, reset = provisioned["restart"]["up"], provisioned["restart"]["reset"]
    assert "  faults gpu1: pcie-replays gpu3" in up, up
    drained = [line.split() for line in up.splitlines() if line.split()[1:2] == ["gpu2"]]
    assert drained and drained[0][0] == "drain" and "ticket-123 bad dimm" in " ".join(drained[0]), up
    assert not any(line.split()[:1] == ["idle"] and "gpu2" in line for line in up.splitlines()), up
    assert "cleared gpu1: pcie-replays gpu3" in reset and "resumed gpu2 (drain)" in reset, reset
    machines = provisioned["machines"]
    assert all(machines.drained(node) is None for node in machines.gpu_nodes)
    # Nothing left to clear or resume; the head's timer may have written its state meanwhile, which a
    # reset empties again (the wording of a clean lab: tests/unit/test_lab_machines_state.py).
    again = lab_cli("reset").splitlines()
    assert not [line for line in again if line.startswith(("cleared ", "resumed "))], again


@pytest.mark.provision
@NEEDS_MACHINES
def test_provision_after_a_restart_changes_nothing(provisioned):
    """The second run of the module, after the machines restarted: the lab and the roles agree on
    every file the lab writes at a machine's start (/etc/hosts among them)."""
    second, stopped = provisioned["runs"][1], provisioned["stopped"]
    hosts = recap(second)
    assert hosts and all(h == {"changed": 0, "unreachable": 0, "failed": 0}
                         for name, h in hosts.items() if name != stopped), (hosts, sorted(changed_tasks(second)))


@pytest.mark.provision
@NEEDS_MACHINES
def test_a_stopped_machine_leaves_the_run_going_for_the_others_and_is_named_at_the_end(provisioned):
    """The second run had one GPU machine stopped (conftest.py): it reached the end for every other host
    (their recap above: nothing failed, nothing changed), exited non-zero (the fixture checked make's 2),
    and its last lines name the stopped machine. slurm.conf kept it: its hardware facts came from the
    fact cache, and the head's slurm.conf did not change. A run with --limit (one replaced node) renders
    the hosts outside it from the same cache."""
    second, stopped, machines = provisioned["runs"][1], provisioned["stopped"], provisioned["machines"]
    assert recap(second)[stopped] == {"changed": 0, "unreachable": 1, "failed": 0}
    last = second.strip().splitlines()[-2:]
    assert last[0].startswith("== provision: unreachable, left out of this run") and f"{stopped} (" in last[0], last
    assert "PLAY [Slurm compute nodes]" in second  # the later plays ran, for the others
    node_names = r"sed -n 's/^NodeName=\([^ ]*\).*/\1/p' /etc/slurm/slurm.conf"
    names = machines.on_head(f"{node_names} | xargs -n1 scontrol show hostnames")
    assert stopped in names.split(), names
