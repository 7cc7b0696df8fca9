"""Slurm on the provisioned machines: jobs across the nodes, slurmd's memlock limit for jobs, the epilog
(leftover GPU memory, a hung nvidia-smi, minor numbers in gres.conf), leftover processes of an ended job,
pam_slurm_adopt and the provisioning account's login, and one run under a running job that changes a
slurm.conf key (`scontrol reconfigure` applies it) and rotates the munge key, keeping Slurm working; and
accounting: a finished job in `sacct --json` on the head (slurmdbd and MariaDB, the slurm_dbd role).

The lab machines track job processes through /proc (their cgroup v1 controllers are read-only inside
systemd-nspawn, see inventory/lab/group_vars/all.yml): the leftover-process test here proves the
epilog's cleanup; real cgroup enforcement is covered on `opsctl lab up`'s host-level slurmd
(tests/integration/lab/test_lab_cgroup.py, docs/provisioning.md).
"""

import json
import time

import pytest
import yaml

from tests.integration.provision.support import (
    INVENTORY,
    NEEDS_MACHINES,
    NEEDS_ROOT,
    changed_tasks,
    lab_cli,
    playbook,
    wait_until,
)

pytestmark = [NEEDS_ROOT]


@pytest.mark.provision
@NEEDS_MACHINES
def test_srun_on_three_nodes(machines):
    wait_until(lambda: all(machines.node_state(n)[0] in ("idle", "mixed", "allocated") for n in machines.gpu_nodes),
               90, "all GPU nodes idle")
    out = machines.on_head("timeout 60 srun -N3 hostname")
    assert sorted(out.split()) == machines.gpu_nodes


@pytest.mark.provision
@NEEDS_MACHINES
def test_a_finished_job_is_in_slurmdbds_accounting_with_its_node_and_gpus(machines):
    """Accounting (slurm_dbd role): a job that ran on a GPU machine is listed by `sacct -j ID --json` on the
    head (what `opsctl why` reads), with its node, its end state, the cluster slurmctld registered by
    itself, and its GPU (AccountingStorageTRES=gres/gpu). slurmdbd's config is readable by the Slurm user
    only, and the head's MariaDB and its database user are reachable from localhost only."""
    node = machines.gpu_nodes[1]
    job = machines.on_head(f"runuser -u labuser -- sbatch --parsable -D /tmp -o /dev/null -w {node} "
                           "--gres=gpu:1 --wrap 'true'").strip()

    def record():
        out = machines.on_head(f"sacct -j {job} --json")
        jobs = [j for j in json.loads(out)["jobs"] if j["job_id"] == int(job)]
        return jobs[0] if jobs and jobs[0]["state"]["current"] == "COMPLETED" else None

    found = wait_until(record, 60, f"job {job} COMPLETED in sacct")
    # 22.05's JSON names the user from the job's association, and the lab adds none (no
    # AccountingStorageEnforce): "user" is null there, so the job is known by its id, node and cluster.
    assert found["nodes"] == node and found["cluster"] == "opsctl-lab", found
    allocated = {f"{t['type']}/{t['name']}" if t["name"] else t["type"]: t["count"]
                 for t in found["tres"]["allocated"]}
    assert allocated.get("gres/gpu") == 1, found["tres"]
    assert machines.on_head("stat -c '%U %a' /etc/slurm/slurmdbd.conf").strip() == "slurm 600"
    listening = machines.on_head("ss -Hltn 'sport = :3306'").split()
    assert listening[3::5] == ["127.0.0.1:3306"], listening
    hosts = machines.on_head("mariadb -N -B -e \"SELECT Host FROM mysql.user WHERE User = 'slurm'\"").split()
    assert hosts == ["localhost"], hosts


@pytest.mark.provision
@NEEDS_MACHINES
def test_a_failed_job_is_explained_into_each_nodes_history_by_the_controllers_epilog(machines):
    """EpilogSlurmctld (slurm_controller role) leaves the id of a job that failed in the spool as the Slurm
    user; the head's opsctl-why.path (opsctl role) runs `opsctl why --spool` as root, which records the
    answer in the audit log, one record per node of the job, and empties the spool. A job that completed
    gets no record."""
    node = machines.gpu_nodes[0]
    clean = machines.on_head(f"runuser -u labuser -- sbatch --parsable -D /tmp -o /dev/null -w {node} "
                             "--wrap 'true'").strip()
    failed = machines.on_head(f"runuser -u labuser -- sbatch --parsable -D /tmp -o /dev/null -w {node} "
                              "--wrap 'exit 3'").strip()

    def recorded():
        out = machines.on_head(f"/opt/opsctl/bin/opsctl history {node} --json")
        return [json.loads(line) for line in out.splitlines() if json.loads(line)["event"] == "why"
                and json.loads(line)["reason"] in (f"job {clean}", f"job {failed}")]

    found = wait_until(recorded, 120, f"the head's audit log explaining job {failed}")
    assert [r["reason"] for r in found] == [f"job {failed}"], found
    assert found[0]["detail"].startswith(f"job {failed} FAILED") and found[0]["user"] == "root", found
    assert machines.on_head("ls -A /var/spool/opsctl-why").strip() == ""
    assert machines.on_head("stat -c '%U %a' /var/spool/opsctl-why").strip() == "slurm 700"


@pytest.mark.provision
@NEEDS_MACHINES
def test_jobs_get_slurmds_memlock_limit_not_the_submitters(machines):
    """RDMA needs locked memory: a job gets slurmd's memlock limit (unit LimitMEMLOCK=infinity) even when
    the submitting shell's is lower (PropagateResourceLimitsExcept=MEMLOCK). The lab machines are
    started with an unlimited MEMLOCK rlimit, but where the host itself caps it and may not raise it
    (no CAP_SYS_RESOURCE), slurmd keeps the host's cap: the test then checks propagation of that."""
    node = machines.gpu_nodes[0]
    assert machines.ssh(node, "systemctl show slurmd -p LimitMEMLOCK").stdout.strip() == "LimitMEMLOCK=infinity"
    soft = machines.ssh(node, "awk '/Max locked memory/ {print $4}' /proc/$(pidof slurmd)/limits").stdout.strip()
    expected = "unlimited" if soft == "unlimited" else str(int(soft) // 1024)
    assert expected != "64"
    out = machines.on_head(f"bash -c 'ulimit -S -l 64; timeout 60 srun -w {node} bash -c \"ulimit -l\"'")
    assert out.strip() == expected


@pytest.mark.provision
@NEEDS_MACHINES
def test_leftover_gpu_memory_drains_node_with_epilog_reason(machines):
    node = machines.gpu_nodes[0]
    lab_cli("inject", node, "gpu-leftover-memory", "--gpu", "3")
    try:
        machines.on_head(f"timeout 90 srun -w {node} --gres=gpu:8 true")
        state, reason = wait_until(lambda: machines.drained(node), 60,
                                   f"{node} drained by the epilog")
        assert reason.startswith("opsctl:epilog"), reason
        assert "GPU3=" in reason
    finally:
        lab_cli("clear", node)
        machines.resume(node)


@pytest.mark.provision
@NEEDS_MACHINES
def test_background_processes_die_with_their_job_only(machines):
    """Job A leaves setsid and nohup children behind; job B of the same user on the same node must keep
    running after A ends."""
    node = machines.gpu_nodes[1]
    submit = "runuser -u labuser -- sbatch --parsable -D /tmp -o /dev/null -w " + node
    keep = machines.on_head(f"{submit} --wrap 'sleep 600'").strip()
    try:
        wait_until(lambda: "R" == machines.on_head(f"squeue -h -j {keep} -o %t").strip(), 60, "job B running")
        leaver = machines.on_head(
            f"{submit} --wrap 'setsid sleep 7771 & nohup sleep 7772 >/dev/null 2>&1 & sleep 2'").strip()
        wait_until(lambda: not machines.on_head(f"squeue -h -j {leaver} -o %t 2>/dev/null", check=False).strip(),
                   90, "job A to end")

        def leftovers():
            out = machines.ssh(node, "pgrep -u labuser -f 'sleep 777[12]'", check=False).stdout.split()
            return out or None

        # The epilog finishes after the job leaves squeue: give it its grace period.
        deadline = time.monotonic() + 30
        while leftovers() and time.monotonic() < deadline:
            time.sleep(1)
        assert leftovers() is None
        assert machines.on_head(f"squeue -h -j {keep} -o %t").strip() == "R"
        assert machines.ssh(node, "pgrep -u labuser -f 'sleep 600'", check=False).returncode == 0
    finally:
        machines.on_head("scancel -u labuser", check=False)


@pytest.mark.provision
@NEEDS_MACHINES
def test_ssh_needs_a_job_on_the_node(machines):
    """pam_slurm_adopt: a user without a job on the node is refused; with one, the login is let in (and
    adopted into the job's extern step; in the lab, without job cgroups, adoption cannot be observed)."""
    node = machines.gpu_nodes[2]
    machines.ssh(node, "install -d -o labuser -m 700 ~labuser/.ssh && install -o labuser -m 600 "
                       "~/.ssh/authorized_keys ~labuser/.ssh/authorized_keys")
    denied = machines.ssh(node, "true", user="labuser", check=False)
    assert denied.returncode != 0
    job = machines.on_head(f"runuser -u labuser -- sbatch --parsable -D /tmp -o /dev/null -w {node} "
                           "--wrap 'sleep 300'").strip()
    try:
        wait_until(lambda: "R" == machines.on_head(f"squeue -h -j {job} -o %t").strip(), 60, "job running")
        allowed = machines.ssh(node, "id -un", user="labuser", check=False)
        assert allowed.returncode == 0 and allowed.stdout.strip() == "labuser", allowed.stderr
    finally:
        machines.on_head(f"scancel {job}", check=False)


@pytest.mark.provision
@NEEDS_MACHINES
def test_provisioning_user_logs_in_without_a_job(machines):
    """pam_access lets the provisioning account (and root, and the admin groups) in ahead of
    pam_slurm_adopt, so the next provisioning run is never locked out; labuser without a job is refused
    (test_ssh_needs_a_job_on_the_node)."""
    node = machines.gpu_nodes[2]
    assert machines.provisioning_user != "root"
    # The previous test's job may still be completing (CG) while its epilog runs.
    wait_until(lambda: not machines.on_head(f"squeue -h -w {node}").strip(), 60, f"no job on {node}", interval=1)
    out = machines.ssh(node, "id -un && sudo -n true && echo sudo-ok", user=machines.provisioning_user)
    assert out.stdout.split() == [machines.provisioning_user, "sudo-ok"]
    pam = machines.ssh(node, "grep -B1 pam_slurm_adopt /etc/pam.d/sshd").stdout
    assert "account    sufficient   pam_access.so" in pam


@pytest.mark.provision
@NEEDS_MACHINES
def test_a_live_run_under_a_running_job_reconfigures_slurm_and_rotates_the_munge_key(machines):
    """One run of every Slurm play (--tags slurm) with two changes, as a maintenance run on a busy cluster.
    SlurmdTimeout lives in slurm.conf only, and `scontrol reconfigure` applies it: slurm.conf changes on
    every Slurm host and Slurm is reconfigured once from the controller per play (the controller's and the
    compute nodes'); only the slurm plays read slurm_config (tests/unit/test_roles_static.py), so this is
    all it touches. munge_rotate_key: the new key reaches every Slurm host before any munged restarts, the
    controller's first, then the nodes'. Nothing else changes: slurmctld and the slurmds keep their PIDs
    (they ask the local munged for each message), the running job runs on, slurmctld reports the new
    value, and jobs run across the nodes afterwards. The run back (the config tasks alone, tag
    slurm_configure) leaves slurm.conf as it was."""
    lab_vars = yaml.safe_load((INVENTORY / "group_vars" / "all.yml").read_text())
    head, gpus = machines.head, machines.gpu_nodes
    node = gpus[0]
    pids = "pidof slurmd || true"

    def daemon_pids():
        return {"head": machines.on_head("pidof slurmctld").strip(),
                **{n: machines.ssh(n, pids).stdout.strip() for n in gpus}}

    def slurmd_timeout():
        return machines.on_head("scontrol show config | awk '$1 == \"SlurmdTimeout\" {print $3}'").strip()

    def key_sums():  # the storage node runs no munge
        return {h: machines.ssh(h, "sha256sum /etc/munge/munge.key").stdout.split()[0] for h in [head, *gpus]}

    before, value, keys = daemon_pids(), slurmd_timeout(), key_sums()
    job = machines.on_head(f"runuser -u labuser -- sbatch --parsable -D /tmp -o /dev/null -w {node} "
                           "--wrap 'sleep 600'").strip()
    try:
        wait_until(lambda: "R" == machines.on_head(f"squeue -h -j {job} -o %t").strip(), 60, "job running")
        changed = {"slurm_config": {**lab_vars["slurm_config"], "SlurmdTimeout": int(value) - 1},
                   "munge_rotate_key": True}
        proc = playbook("--diff", "--tags", "slurm", "-e", json.dumps(changed))
        assert proc.returncode == 0, proc.stdout[-6000:]
        tasks = changed_tasks(proc.stdout)
        reconfigure = "handler slurm_common : Reconfigure Slurm"
        reconfigured = {task for task in tasks if task[0] == reconfigure}
        assert {host for _, host in reconfigured} in ({head, gpus[0]}, {head}), reconfigured
        assert proc.stdout.count(f"RUNNING HANDLER [{reconfigure.removeprefix('handler ')}]") == 2
        munge = {task for task in tasks if task[0].removeprefix("handler ").startswith("munge : ")}
        expected = {("slurm_common : Template slurm.conf", host) for host in [head, *gpus]}
        assert tasks - reconfigured - munge == expected, sorted(tasks)
        assert f"\n-SlurmdTimeout={value}\n" in proc.stdout and f"\n+SlurmdTimeout={int(value) - 1}\n" in proc.stdout
        assert slurmd_timeout() == str(int(value) - 1)
        assert daemon_pids() == before
        assert machines.on_head(f"squeue -h -j {job} -o %t").strip() == "R"
        rotated = key_sums()
        assert len(set(rotated.values())) == 1 and set(rotated.values()) != set(keys.values())
        controller = proc.stdout.index("RUNNING HANDLER [munge : Restart munge on the controller]")
        assert proc.stdout.index("RUNNING HANDLER [munge : Restart munge on the nodes]") > controller
        assert ("handler munge : Restart munge on the controller", head) in munge
    finally:
        back = playbook("--tags", "slurm_configure")
        machines.on_head(f"scancel {job}", check=False)
    assert back.returncode == 0 and slurmd_timeout() == value, back.stdout[-6000:]
    assert daemon_pids() == before
    wait_until(lambda: all(machines.node_state(n)[0] in ("idle", "mixed") for n in gpus), 90, "all GPU nodes idle")
    assert sorted(machines.on_head("timeout 60 srun -N3 hostname").split()) == gpus


@pytest.mark.provision
@NEEDS_MACHINES
def test_gres_and_epilog_use_minor_numbers(machines):
    """gpu2's GPUs have minor numbers 7..0 for indexes 0..7 (the lab's hwinstall). gres.conf names their
    device files with the right affinity, and a job's GPU (SLURM_JOB_GPUS holds the minor number) is
    the one the epilog checks: leftover memory on that GPU's index drains the node, with its PID."""
    node = "gpu2"
    gres = machines.on_head("cat /etc/slurm/gres.conf")
    assert f"NodeName={node} Name=gpu Type=h200 File=/dev/nvidia7 Cores=0\n" in gres
    assert f"NodeName={node} Name=gpu Type=h200 File=/dev/nvidia0 Cores=1\n" in gres
    wait_until(lambda: machines.node_state(node)[0] in ("idle", "mixed"), 90, f"{node} idle")
    job = machines.on_head(f"sbatch --parsable -D /tmp -o /tmp/minor-%j.out -w {node} --gres=gpu:1 "
                           "--wrap 'echo $SLURM_JOB_GPUS; sleep 8'").strip()
    try:
        minor = int(wait_until(lambda: machines.ssh(node, f"cat /tmp/minor-{job}.out", check=False).stdout.strip(),
                               60, "the job's GPU"))
        index = 7 - minor
        lab_cli("inject", node, "gpu-leftover-memory", "--gpu", str(index))
        state, reason = wait_until(lambda: machines.drained(node), 90, f"{node} drained by the epilog")
        assert reason.startswith(f"opsctl:epilog job {job} left GPU memory in use: GPU{index}="), reason
        assert f"pids={41000 + 97 * index}(python3)" in reason, reason
    finally:
        lab_cli("clear", node)
        machines.resume(node)


@pytest.mark.provision
@NEEDS_MACHINES
def test_epilog_drains_a_node_whose_gpu_hangs_nvidia_smi(machines):
    node = machines.gpu_nodes[0]
    wait_until(lambda: machines.node_state(node)[0] in ("idle", "mixed"), 90, f"{node} idle")
    lab_cli("inject", node, "gpu-hang", "--gpu", "2")
    try:
        machines.on_head(f"timeout 90 srun -w {node} --gres=gpu:8 true")
        state, reason = wait_until(lambda: machines.drained(node), 90, f"{node} drained by the epilog")
        assert reason.endswith("nvidia-smi did not answer within 5s"), reason
    finally:
        lab_cli("clear", node)
        machines.resume(node)
