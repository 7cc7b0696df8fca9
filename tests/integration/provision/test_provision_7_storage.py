"""Storage on the provisioned lab machines.

- The storage machine: its disk prepared by the nfs_server role, /home and /shared exported by
  NFS-Ganesha, and the exports proved from every GPU machine with libnfs's userspace client (the lab
  kernel has no NFS client): a user's file reads back identical, and root is squashed. The role's
  refusal of a disk that holds data, proved untouched by its checksum.
- Storage health: the GPU machines' node check timers (node_check role) see the lab's storage faults,
  Prometheus on the head has their results, and `opsctl health` there drains, resumes, or stops naming
  storage. slurmd does not start while a required mount is missing.

The session's `provisioned` fixture (conftest.py) provisions the machines. The node check timers run
once a minute; the tests stop them and run the timer's command at once rather than wait. Needs root,
systemd-nspawn and `make deps-machines`.
"""

import json
import shlex
import subprocess
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration.provision.support import (
    NEEDS_MACHINES,
    NEEDS_ROOT,
    Machines,
    changed_tasks,
    clear_faults_and_resume,
    lab_cli,
    playbook,
    wait_until,
)

pytestmark = [NEEDS_ROOT, NEEDS_MACHINES]

STORAGE = "stor1"
EXPORT_ROOT = "/srv/nfs"  # nfs_server_root
USER, UID = "labuser", 2001  # inventory/lab/group_vars/all.yml common_local_users
SQUASHED_UID = 65534  # nfs_server_anonymous_uid


@pytest.fixture(scope="module")
def machines(machines):
    """The session's provisioned machines (conftest.py; proved to change nothing on a second run), with their
    storage machine serving."""
    assert STORAGE in machines.hosts, "no storage machine: `opsctl lab machines up` then `make provision`"
    machines.ssh(STORAGE, "systemctl is-active nfs-ganesha")
    return machines


def nfs_url(machines: Machines, path: str) -> str:
    return f"nfs://{machines.addr(STORAGE)}{path}?version=4"


def on_storage(machines: Machines, command: str) -> str:
    return machines.ssh(STORAGE, command).stdout.strip()


@pytest.fixture(scope="module")
def user_dirs(machines):
    """A home of the job user's own (0700) and a scratch directory anyone may write (1777) on the
    exports, as the site's account tooling would make them."""
    on_storage(machines, f"install -d -o {UID} -g {UID} -m 0700 {EXPORT_ROOT}/home/{USER} && "
                         f"install -d -m 1777 {EXPORT_ROOT}/shared/scratch")
    return machines


@pytest.mark.provision
def test_storage_exports_home_and_shared_through_ganesha_from_its_own_xfs_disk(machines):
    assert on_storage(machines, f"findmnt -n -o SOURCE,FSTYPE,LABEL --target {EXPORT_ROOT}").split() == [
        "/dev/vdb", "xfs", "opsctl-nfs"]
    assert on_storage(machines, "systemctl is-active nfs-ganesha") == "active"
    # The server waits for its disk: a boot without /dev/vdb mounted never serves an empty directory.
    requires = on_storage(machines, "systemctl show -p RequiresMountsFor --value nfs-ganesha")
    assert EXPORT_ROOT in requires.split()
    gpu = machines.gpu_nodes[0]
    listing = machines.ssh(gpu, f"nfs-ls {shlex.quote(nfs_url(machines, '/'))}").stdout.split()
    assert {"home", "shared"} <= set(listing), listing


@pytest.mark.provision
def test_a_users_file_reads_back_identical_from_every_gpu_machine(user_dirs):
    """3000 random bytes: Debian 12's libnfs 4.0 client fails an NFSv4 write of 4000 bytes or more (3500 pass)
    on its own side, before a WRITE reaches the server (Ganesha's log shows none)."""
    machines = user_dirs
    for gpu in machines.gpu_nodes:
        remote = f"/home/{USER}/{gpu}.bin"
        on_storage(machines, f"rm -f {EXPORT_ROOT}{remote}")  # nfs-cp never overwrites
        script = (f"set -e; cd /tmp; head -c 3000 /dev/urandom > {gpu}.out; "
                  f"nfs-cp {gpu}.out {shlex.quote(nfs_url(machines, remote))} >/dev/null; "
                  f"nfs-cp {shlex.quote(nfs_url(machines, remote))} {gpu}.back >/dev/null; "
                  f"sha256sum < {gpu}.out; sha256sum < {gpu}.back; rm -f {gpu}.out {gpu}.back")
        sums = machines.ssh(gpu, f"runuser -u {USER} -- sh -c {shlex.quote(script)}").stdout.split()
        assert len(sums) == 4 and sums[0] == sums[2], (gpu, sums)
        # Written as the user, kept as the user, on the storage machine's disk.
        assert on_storage(machines, f"stat -c %u:%s {EXPORT_ROOT}{remote}") == f"{UID}:3000"


@pytest.mark.provision
def test_root_on_a_gpu_machine_is_squashed(user_dirs):
    machines = user_dirs
    gpu = machines.gpu_nodes[-1]
    on_storage(machines, f"rm -f {EXPORT_ROOT}/shared/scratch/root.txt")  # nfs-cp never overwrites
    machines.ssh(gpu, f"echo root > /tmp/root.txt && nfs-cp /tmp/root.txt "
                      f"{shlex.quote(nfs_url(machines, '/shared/scratch/root.txt'))}")
    assert on_storage(machines, f"stat -c %u {EXPORT_ROOT}/shared/scratch/root.txt") == str(SQUASHED_UID)
    # Squashed root is nobody: the user's private home is closed to it.
    denied = machines.ssh(gpu, f"nfs-cp /tmp/root.txt {shlex.quote(nfs_url(machines, f'/home/{USER}/root.txt'))}",
                          check=False)
    assert denied.returncode != 0 and "NFS4ERR_ACCESS" in denied.stdout + denied.stderr, denied
    assert on_storage(machines, f"test -e {EXPORT_ROOT}/home/{USER}/root.txt || echo absent") == "absent"


@pytest.mark.provision
def test_nfs_server_refuses_a_disk_that_holds_a_filesystem_and_leaves_it_untouched(machines):
    """/dev/vdc holds an ext4 filesystem with data (lab/opsctl_lab/machines/disks.py)."""
    checksum = "sha256sum /dev/vdc | cut -d' ' -f1"
    before = on_storage(machines, checksum)
    run = playbook("--tags", "nfs_server", "--limit", STORAGE, "-e", json.dumps({"nfs_server_devices": ["/dev/vdc"]}))
    assert run.returncode != 0, run.stdout[-4000:]
    assert "refusing to touch /dev/vdc (ext4)" in run.stdout, run.stdout[-4000:]
    assert "list it in nfs_server_wipe_devices" in run.stdout, run.stdout[-4000:]
    assert not changed_tasks(run.stdout)
    assert on_storage(machines, checksum) == before
    assert on_storage(machines, "blkid -p -o value -s TYPE /dev/vdc") == "ext4"
    assert on_storage(machines, "systemctl is-active nfs-ganesha") == "active"


# ---- storage health on the provisioned machines: node check timer -> node_exporter -> Prometheus -> opsctl health

OPSCTL = "/opt/opsctl/bin/opsctl"
NODE_CHECK = f"{OPSCTL} node check --json --config /etc/opsctl/node-check.yaml"
# What opsctl-node-check.service runs (roles/node_check), its results for node_exporter's textfile collector.
TIMER_COMMAND = (f"{OPSCTL} node check --config /etc/opsctl/node-check.yaml "
                 "--textfile /var/lib/prometheus/node-exporter/opsctl-node-check.prom")


def node_check_series(machines: Machines, check: str) -> dict[str, float]:
    """{node: value} of opsctl_node_check{check=...} in the head's Prometheus (the nodes' timers' results)."""
    query = urllib.parse.urlencode({"query": f'max by (node) (opsctl_node_check{{job="node", check="{check}"}})'})
    with urllib.request.urlopen(f"http://{machines.addr(machines.head)}:9090/api/v1/query?{query}", timeout=10) as resp:
        return {r["metric"]["node"]: float(r["value"][1]) for r in json.load(resp)["data"]["result"]}


def run_node_checks(machines: Machines, nodes: list[str]) -> None:
    """What the nodes' timers run, now, on all of them at once: the results are in the textfiles when this
    returns. The command itself rather than `systemctl start`: inside the lab's nspawn machines (a cgroup
    v1/v2 hybrid host) systemd at times fails to remove a finished run's cgroup, and a start seconds later
    then fails with 219/CGROUP before the check even runs."""
    def run(name: str) -> None:
        check = machines.ssh(name, TIMER_COMMAND, check=False, timeout=120)
        assert check.returncode in (0, 1), f"{name}: rc={check.returncode}\n{check.stdout[-2000:]}\n{check.stderr}"

    with ThreadPoolExecutor(len(nodes)) as pool:
        list(pool.map(run, nodes))


def failing_node_checks(machines: Machines) -> dict[str, float]:
    """{node: failed checks} for the GPU nodes whose node check fails anything in Prometheus."""
    query = urllib.parse.urlencode({"query": 'sum by (node) (opsctl_node_check{job="node"}) > 0'})
    with urllib.request.urlopen(f"http://{machines.addr(machines.head)}:9090/api/v1/query?{query}", timeout=10) as resp:
        return {r["metric"]["node"]: float(r["value"][1]) for r in json.load(resp)["data"]["result"]}


def health(machines: Machines, *args: str) -> subprocess.CompletedProcess:
    return machines.ssh(machines.head, f"{OPSCTL} health {' '.join(args)}", check=False, timeout=300)


def wait_for_health_failing(machines: Machines, nodes: list[str]) -> None:
    """Read-only runs until opsctl health judges each node failing: every rule holds for two scrape
    intervals, so a result Prometheus has just scraped does not fail a node yet."""
    def failing() -> bool:
        run = health(machines, "--json")
        if run.returncode not in (0, 1, 4):
            return False
        status = {n["node"]: n["status"] for n in json.loads(run.stdout)["nodes"]}
        return all(status.get(n) == "fail" for n in nodes)

    wait_until(failing, 60, f"opsctl health judging {', '.join(nodes)} failing", interval=3)


@pytest.fixture
def health_timer_stopped(machines):
    """The head's health timer and the GPU machines' node check timers stopped, so that every check, drain
    and resume here is the test's own run, never one that overlaps a fault's change; every GPU machine in
    service first, and again after: faults cleared, opsctl's drains resumed, the timers started."""
    machines.on_head("systemctl stop opsctl-health.timer")
    for name in machines.gpu_nodes:
        machines.ssh(name, "systemctl stop opsctl-node-check.timer && systemctl stop opsctl-node-check.service")
        assert f"ExecStart={TIMER_COMMAND}" in machines.ssh(name, "systemctl cat opsctl-node-check.service").stdout
    try:
        clear_faults_and_resume(machines, "opsctl:")
        # Results from before (the InfiniBand tests' faults) must not count: fresh ones, all passing.
        if failing_node_checks(machines):
            run_node_checks(machines, machines.gpu_nodes)
            wait_until(lambda: failing_node_checks(machines) == {}, 60, "every node check passing in Prometheus")
        for name in machines.gpu_nodes:
            wait_until(lambda name=name: machines.node_state(name)[0] in ("idle", "mixed"), 120, f"{name} in service")
        yield machines
    finally:
        lab_cli("clear", "all")
        for name in machines.gpu_nodes:
            machines.ssh(name, "systemctl start slurmd", check=False)
        # The timer must not see a result from before the clear: every node's checks pass in Prometheus first.
        run_node_checks(machines, machines.gpu_nodes)
        wait_until(lambda: failing_node_checks(machines) == {}, 60, "every node check passing in Prometheus")
        clear_faults_and_resume(machines, "opsctl:")
        for name in machines.gpu_nodes:
            machines.ssh(name, "systemctl start opsctl-node-check.timer")
        machines.on_head("systemctl start opsctl-health.timer")


@pytest.mark.provision
def test_lustre_ost_down_on_gpu2_is_drained_named_and_resumed_after_a_clear(health_timer_stopped):
    machines = health_timer_stopped
    node, others = "gpu2", [n for n in machines.gpu_nodes if n != "gpu2"]
    lab_cli("inject", node, "lustre-ost-down")
    check = machines.ssh(node, NODE_CHECK, check=False)
    assert check.returncode == 1, check.stdout[-3000:] + check.stderr
    findings = json.loads(check.stdout)["storage"]["findings"]
    assert {"check": "lustre-import-down", "device": "lustre-OST0002"} in [
        {k: f[k] for k in ("check", "device")} for f in findings], findings
    run_node_checks(machines, [node])
    wait_until(lambda: node_check_series(machines, "lustre-import-down").get(node) == 1, 60,
               f"Prometheus showing {node}'s failed Lustre import")
    wait_for_health_failing(machines, [node])

    drain = health(machines, "--drain")
    assert drain.returncode == 1, drain.stdout[-3000:] + drain.stderr
    state, reason = machines.drained(node) or ("", "")
    assert "drain" in state and reason.startswith("opsctl:lustre-import-down lustre-OST0002"), (state, reason)
    assert {n: machines.drained(n) for n in others} == dict.fromkeys(others)

    lab_cli("clear", node)
    run_node_checks(machines, [node])
    wait_until(lambda: node_check_series(machines, "lustre-import-down").get(node) == 0, 60,
               f"Prometheus showing {node}'s Lustre imports FULL again")
    # The lab resumes a node once its rules have been ok for 10 s (safety.resume_after); the failed import's
    # last samples still count for one hold (two scrape intervals), when the run still finds it failing (1).
    def resumed():
        resume = health(machines, "--resume")
        assert resume.returncode in (0, 1), resume.stdout[-3000:] + resume.stderr
        return resume.returncode == 0 and machines.drained(node) is None

    wait_until(resumed, 90, f"`opsctl health --resume` returning {node}", interval=5)


@pytest.mark.provision
def test_lustre_ost_down_on_every_machine_stops_the_breaker_naming_storage(health_timer_stopped):
    machines = health_timer_stopped
    lab_cli("inject", "all", "lustre-ost-down")
    run_node_checks(machines, machines.gpu_nodes)
    wait_until(lambda: all(node_check_series(machines, "lustre-import-down").get(n) == 1 for n in machines.gpu_nodes),
               90, "Prometheus showing every machine's failed Lustre import")
    wait_for_health_failing(machines, machines.gpu_nodes)
    run = health(machines, "--drain", "--json")
    assert run.returncode == 4, run.stdout[-3000:] + run.stderr
    assert json.loads(run.stdout)["summary"]["outage"] == "storage"
    assert "circuit breaker: storage" in run.stderr + run.stdout
    assert {n: machines.drained(n) for n in machines.gpu_nodes} == dict.fromkeys(machines.gpu_nodes)


@pytest.mark.provision
def test_slurmd_does_not_start_while_a_required_mount_is_missing(health_timer_stopped):
    """slurm_compute_required_mounts (/shared, /lustre in the lab) become RequiresMountsFor= of slurmd:
    with /shared gone (mount-missing stops shared.mount and takes its source away), slurmd stops with it
    and cannot start; back once the mount is."""
    machines = health_timer_stopped
    node = machines.gpu_nodes[0]
    assert {"/shared", "/lustre"} <= set(
        machines.ssh(node, "systemctl show -p RequiresMountsFor --value slurmd").stdout.split())
    lab_cli("inject", node, "mount-missing")
    assert machines.ssh(node, "systemctl is-active slurmd", check=False).stdout.strip() != "active"
    start = machines.ssh(node, "systemctl start slurmd", check=False)
    assert start.returncode != 0, start
    assert machines.ssh(node, "systemctl is-active slurmd", check=False).stdout.strip() != "active"
    check = machines.ssh(node, NODE_CHECK, check=False)
    assert check.returncode == 1 and "storage-mount-missing" in check.stdout, check.stdout[-3000:]

    lab_cli("clear", node)
    machines.ssh(node, "systemctl start slurmd")
    assert machines.ssh(node, "systemctl is-active slurmd").stdout.strip() == "active"
    wait_until(lambda: machines.node_state(node)[0] in ("idle", "mixed"), 120, f"{node} back in service")


@pytest.mark.provision
def test_a_hung_mount_is_reported_within_the_checks_timeout(health_timer_stopped):
    machines = health_timer_stopped
    node = machines.gpu_nodes[-1]
    lab_cli("inject", node, "nfs-hung")
    began = time.monotonic()
    check = machines.ssh(node, NODE_CHECK, check=False, timeout=60)
    took = time.monotonic() - began
    assert check.returncode == 1, check.stdout[-3000:] + check.stderr
    hung = [f for f in json.loads(check.stdout)["storage"]["findings"] if f["check"] == "storage-mount-hung"]
    assert [f["device"] for f in hung] == ["/home"], hung
    # storage.timeout_seconds is 8 in the lab; the rest is SSH and Python starting.
    assert took < 30, took
