"""`make provision` against the lab machines, and what the provisioned cluster must then do.

The module runs `make provision` (it starts the machines when they are not running), restarts the
machines, then provisions again to prove it changes nothing, then checks (in check mode) that one
slurm.conf setting would change exactly the files that depend on it and fire exactly their
handlers. The other tests use the result: Slurm across the machines, the epilog, Prometheus'
targets, and the opsctl timer draining a node whose emulated GPU fails.

The lab machines track job processes through /proc (their cgroup v1 controllers are read-only
inside systemd-nspawn, see inventory/lab/group_vars/all.yml): the leftover-process test here
proves the epilog's cleanup; real cgroup enforcement is covered on `opsctl lab up`'s host-level
slurmd (docs/provisioning.md). Needs root, systemd-nspawn and `make deps-machines`.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.alerting import Webhook, alert_states, post_alerts

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="the lab machines need root")]
NEEDS_MACHINES = pytest.mark.skipif(shutil.which("systemd-nspawn") is None, reason="make deps-machines")
REPO = Path(__file__).resolve().parents[2]
INVENTORY = REPO / "inventory" / "lab"
BIN = Path(sys.executable).parent
# The fact cache `make provision` keeps for this inventory, so that runs here with --limit find it too.
ENV = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "playbooks" / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
       "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(INVENTORY / ".facts")}
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def recap(output: str) -> dict:
    """host -> {changed, unreachable, failed} from the PLAY RECAP."""
    return {m[1]: {"changed": int(m[3]), "unreachable": int(m[4]), "failed": int(m[5])} for m in RECAP.finditer(output)}


def changed_tasks(output: str) -> set[tuple[str, str]]:
    """{(task or handler title, host)} for every `changed:` line of the default callback's output."""
    found, title = set(), None
    for line in output.splitlines():
        header = re.match(r"^(TASK|RUNNING HANDLER) \[(.+?)\] \*+", line)
        if header:
            title = f"{'handler ' if header[1] == 'RUNNING HANDLER' else ''}{header[2]}"
            continue
        change = re.match(r"^changed: \[([^\]]+?)(?: -> [^\]]+)?\]", line)
        if change and title:
            found.add((title, change[1]))
    return found


def make_provision(*playbook_args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "provision", f"PLAYBOOK_ARGS={' '.join(playbook_args)}"],
                          capture_output=True, text=True, timeout=1800, cwd=REPO, env=ENV)


def playbook(*args, timeout=1200) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(INVENTORY), "playbooks/site.yml", *args],
                          capture_output=True, text=True, timeout=timeout, env=ENV, cwd=REPO)


class Machines:
    def __init__(self):
        doc = yaml.safe_load((INVENTORY / "hosts.yml").read_text())
        self.hosts = {}
        self.groups = {}

        def walk(name, node):
            for host, hostvars in (node.get("hosts") or {}).items():
                self.hosts[host] = hostvars
                self.groups.setdefault(name, set()).add(host)
            for child, sub in (node.get("children") or {}).items():
                walk(child, sub or {})
                self.groups.setdefault(name, set()).update(self.groups.get(child, set()))

        walk("all", doc["all"])
        self.head = sorted(self.groups["controller"])[0]
        self.gpu_nodes = sorted(self.groups["gpu_nodes"])

    def addr(self, host: str) -> str:
        return self.hosts[host]["ansible_host"]

    @property
    def provisioning_user(self) -> str:
        return self.hosts[self.head]["ansible_user"]

    def ssh(self, host: str, command: str, user: str = "root", check=True, timeout=120):
        hv = self.hosts[host]
        argv = ["ssh", "-i", hv["ansible_ssh_private_key_file"], *shlex.split(hv.get("ansible_ssh_common_args", "")),
                "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", f"{user}@{hv['ansible_host']}", command]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if check:
            assert out.returncode == 0, f"{user}@{host}: {command}: rc={out.returncode}\n{out.stdout}\n{out.stderr}"
        return out

    def on_head(self, command: str, **kwargs) -> str:
        return self.ssh(self.head, command, **kwargs).stdout

    def node_state(self, node: str) -> tuple[str, str]:
        line = self.on_head(f"sinfo -h -N -n {node} -o '%T|%E'").strip().splitlines()[0]
        state, _, reason = line.partition("|")
        return state, reason

    def drained(self, node: str) -> tuple[str, str] | None:
        state, reason = self.node_state(node)
        return (state, reason) if "drain" in state else None

    def resume(self, node: str):
        self.ssh(self.head, f"scontrol update nodename={node} state=resume", check=False)


def wait_until(check, timeout: float, what: str, interval: float = 2.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def lab_cli(*args):
    out = subprocess.run([sys.executable, "-m", "opsctl", "lab", "machines", *args], capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return out.stdout


def timed_provision(what: str, times: dict) -> str:
    start = time.monotonic()
    proc = make_provision()
    times[what] = time.monotonic() - start
    sys.stderr.write("".join(line + "\n" for line in proc.stdout.splitlines() if line.startswith("== provision")))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    return proc.stdout


def restart_keeping_a_fault_and_a_drain(machines: "Machines", times: dict) -> dict:
    """A fault on gpu1 and a person's drain of gpu2 outlive a restart of the machines, as on real
    hardware: `lab machines up` reports both, and `lab machines reset` clears them and says so."""
    # A warning, so that the timer on the head drains nothing while it lasts.
    lab_cli("inject", "gpu1", "pcie-replays", "--gpu", "3")
    machines.on_head("scontrol update nodename=gpu2 state=drain reason='ticket-123 bad dimm'")
    start = time.monotonic()
    lab_cli("down")
    up = lab_cli("up")
    times["restart"] = time.monotonic() - start
    # slurmctld and the slurmds come back with the machines; gpu2's drain is in slurmctld's saved state.
    wait_until(lambda: machines.node_state("gpu2")[0].startswith("drain"), 90, "gpu2 drained after the restart")
    return {"up": up, "reset": lab_cli("reset")}


@pytest.fixture(scope="module")
def provisioned():
    """`make provision` (it brings the machines up when needed), then a restart of the machines with a
    fault and a drain kept, then `lab machines reset`, then `make provision` again: that run must
    change nothing. Wall times go to the test log."""
    times: dict[str, float] = {}
    first = timed_provision("first", times)
    machines = Machines()
    restart = restart_keeping_a_fault_and_a_drain(machines, times)
    after_restart = timed_provision("after the restart", times)
    sys.stderr.write("wall time: " + ", ".join(f"{what} {secs:.0f} s" for what, secs in times.items()) + "\n")
    return {"runs": [first, after_restart], "times": times, "machines": machines, "restart": restart}


@pytest.fixture(scope="module")
def machines(provisioned):
    return provisioned["machines"]


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
    assert {"common", "slurm", "total"} <= set(timed) and timed["total"] > 0, summary


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
    hosts = recap(provisioned["runs"][1])
    assert hosts and all(h == {"changed": 0, "unreachable": 0, "failed": 0} for h in hosts.values()), \
        (hosts, sorted(changed_tasks(provisioned["runs"][1])))


@pytest.mark.provision
@NEEDS_MACHINES
def test_one_variable_changes_exactly_its_files_and_handlers(machines):
    """SlurmdTimeout lives in slurm.conf only: slurm.conf would change on every Slurm host, slurmctld
    restart on the controller and slurmd on the compute nodes; nothing else. A check-mode run with
    --diff says what a run would change, task by task and handler by handler, and changes nothing, so
    nothing has to be put back (the first provision and the munge rotation make real changes and
    restarts). Only the plays tagged slurm read slurm_config (tests/unit/test_roles_static.py), so a
    `--tags slurm` run shows all that would change."""
    lab_vars = yaml.safe_load((INVENTORY / "group_vars" / "all.yml").read_text())
    changed = {"slurm_config": {**lab_vars["slurm_config"], "SlurmdTimeout": 299}}
    # What a real run would change: the file, and slurmctld's start time (a restart).
    state = "md5sum /etc/slurm/slurm.conf; systemctl show -p ActiveEnterTimestamp slurmctld"
    before = machines.on_head(state)
    proc = playbook("--check", "--diff", "--tags", "slurm", "-e", json.dumps(changed))
    assert proc.returncode == 0, proc.stdout[-6000:]
    head, gpus = machines.head, machines.gpu_nodes
    expected = {("slurm : Template slurm.conf", host) for host in [head, *gpus]}
    expected |= {("handler slurm : Restart slurmctld", head)}
    expected |= {("handler slurm : Restart slurmd", gpu) for gpu in gpus}
    assert changed_tasks(proc.stdout) == expected
    assert "\n-SlurmdTimeout=300\n" in proc.stdout and "\n+SlurmdTimeout=299\n" in proc.stdout
    assert machines.on_head(state) == before, "check mode changed the file or restarted slurmctld"


@pytest.mark.provision
@NEEDS_MACHINES
def test_srun_on_three_nodes(machines):
    wait_until(lambda: all(machines.node_state(n)[0] in ("idle", "mixed", "allocated") for n in machines.gpu_nodes),
               90, "all GPU nodes idle")
    out = machines.on_head("timeout 60 srun -N3 hostname")
    assert sorted(out.split()) == machines.gpu_nodes


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
def test_prometheus_scrapes_every_exporter_with_node_labels(machines):
    url = f"http://{machines.addr(machines.head)}:9090/api/v1/targets"

    def targets():
        with urllib.request.urlopen(url, timeout=10) as resp:
            active = json.load(resp)["data"]["activeTargets"]
        got = {(t["labels"]["job"], t["labels"].get("node")): t["health"] for t in active}
        return got if all(h == "up" for h in got.values()) and len(got) >= len(machines.hosts) else None

    got = wait_until(targets, 90, "every target up")
    expected = {("node", h) for h in machines.hosts} | {("dcgm", h) for h in machines.gpu_nodes}
    assert expected <= set(got)


@pytest.mark.provision
@NEEDS_MACHINES
def test_opsctl_timer_has_fired_and_exited_0_or_1(machines):
    def last_run():
        props = dict(line.split("=", 1) for line in machines.on_head(
            "systemctl show opsctl-health.service -p ExecMainExitTimestampMonotonic -p ExecMainStatus "
            "-p Result").splitlines() if "=" in line)
        return props if props.get("ExecMainExitTimestampMonotonic", "0") != "0" else None

    props = wait_until(last_run, 75, "opsctl-health.service to have run")
    assert props["ExecMainStatus"] in ("0", "1"), props
    assert props["Result"] == "success", props
    assert "opsctl-health.timer" in machines.on_head("systemctl list-timers --no-pager opsctl-health.timer")


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
def test_provisioning_one_node_with_limit_changes_nothing(machines):
    """The most common run of all: one replaced node. The other nodes' facts come from the fact cache,
    so gres.conf, slurm.conf and /etc/hosts render exactly as for the whole cluster."""
    node = machines.gpu_nodes[1]
    proc = make_provision("--limit", node)
    assert proc.returncode == 0, proc.stdout[-6000:]
    hosts = recap(proc.stdout)
    assert set(hosts) == {node}, hosts
    assert hosts[node] == {"changed": 0, "unreachable": 0, "failed": 0}, sorted(changed_tasks(proc.stdout))


@pytest.mark.provision
@NEEDS_MACHINES
def test_munge_key_rotation_keeps_slurm_working(machines):
    """A rotated key reaches every Slurm host before any munged restarts; the controller's munged restarts
    first, then the nodes'. Afterwards every Slurm host has the new key and jobs run across nodes."""
    slurm_hosts = [machines.head, *machines.gpu_nodes]  # the storage node runs no munge

    def key_sums():
        return {h: machines.ssh(h, "sha256sum /etc/munge/munge.key").stdout.split()[0] for h in slurm_hosts}

    before = key_sums()
    proc = playbook("--tags", "munge", "-e", "munge_rotate_key=true")
    assert proc.returncode == 0, proc.stdout[-6000:]
    after = key_sums()
    assert len(set(after.values())) == 1 and set(after.values()) != set(before.values())
    controller = proc.stdout.index("RUNNING HANDLER [munge : Restart munge on the controller]")
    assert proc.stdout.index("RUNNING HANDLER [munge : Restart munge on the nodes]") > controller
    assert ("handler munge : Restart munge on the controller", machines.head) in changed_tasks(proc.stdout)
    wait_until(lambda: all(machines.node_state(n)[0] in ("idle", "mixed") for n in machines.gpu_nodes), 90,
               "all GPU nodes idle after the rotation")
    assert sorted(machines.on_head("timeout 60 srun -N3 hostname").split()) == machines.gpu_nodes


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


@pytest.mark.provision
@NEEDS_MACHINES
def test_nvidia_role_reports_the_skipped_reboot_and_checks_the_driver(machines):
    """A changed boot file needs a reboot: the lab's GPU nodes say so and skip it. The check afterwards
    compares the loaded driver with the pin: a pin the node does not run stops the play with one line."""
    node = machines.gpu_nodes[0]
    machines.ssh(node, "rm /etc/modprobe.d/opsctl-nvidia-blacklist.conf")
    proc = playbook("--tags", "nvidia", "--limit", node, "-e", "nvidia_driver_version=570.999.99")
    assert proc.returncode != 0
    assert (f"{node}: the NVIDIA driver or its kernel modules changed, which needs a reboot; skipped: this node's "
            "GPUs are emulated (nvidia_emulated)") in " ".join(proc.stdout.split())
    assert (f"{node}: the loaded NVIDIA driver is 570.133.20, nvidia_driver_version is 570.999.99 "
            "(a reboot may be pending)") in " ".join(proc.stdout.split())
    machines.ssh(node, "grep -x 'blacklist nouveau' /etc/modprobe.d/opsctl-nvidia-blacklist.conf")


# Debian 12's own archive key (debian-archive-keyring), armored: a key the lab machines have, for a
# repository they can reach. The fingerprint is the primary key's, B8B8...; 4CB5... is its subkey.
DEBIAN_KEY = {"name": "opsctl-test-debian", "uris": "http://deb.debian.org/debian", "suites": "bookworm-updates",
              "components": "main", "key_url": "file:///etc/apt/trusted.gpg.d/debian-archive-bookworm-automatic.asc",
              "key_fingerprint": "B8B80B5B623EAB6AD8775C45B7C5D7D6350947F8"}


@pytest.mark.provision
@NEEDS_MACHINES
def test_a_repository_is_added_only_with_the_expected_key(machines, tmp_path):
    """The common role's apt_repository (CUDA, DOCA, a site's Slurm): a key whose fingerprint is not the
    expected one stops the run with one line and installs nothing; the right one is installed, named
    in Signed-By, and apt reads the repository with it."""
    node = machines.gpu_nodes[2]
    sources = f"/etc/apt/sources.list.d/{DEBIAN_KEY['name']}.sources"

    def add(fingerprint: str) -> subprocess.CompletedProcess:
        play = [{"name": "One repository", "hosts": node, "gather_facts": False, "tasks": [{
            "name": "Add it", "ansible.builtin.include_role": {"name": "common", "tasks_from": "apt_repository"},
            "vars": {"common_apt_repository": {**DEBIAN_KEY, "key_fingerprint": fingerprint}}}]}]
        (tmp_path / "repository.yml").write_text(yaml.safe_dump(play, sort_keys=False))
        return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(INVENTORY), str(tmp_path / "repository.yml")],
                              capture_output=True, text=True, timeout=600, env=ENV, cwd=REPO)

    try:
        refused = add("0123456789ABCDEF0123456789ABCDEF01234567")
        assert refused.returncode != 0
        assert ("apt repository opsctl-test-debian: the key at file:///etc/apt/trusted.gpg.d/debian-archive-bookworm-"
                "automatic.asc has fingerprints B8B80B5B623EAB6AD8775C45B7C5D7D6350947F8, "
                "4CB50190207B4758A3F73A796ED0E7B82643E131, expected 0123456789ABCDEF0123456789ABCDEF01234567; "
                "not trusted") in " ".join(refused.stdout.split())
        assert machines.ssh(node, f"test -e {sources}", check=False).returncode == 1
        added = add(DEBIAN_KEY["key_fingerprint"])
        assert added.returncode == 0, added.stdout[-4000:]
        assert "Signed-By: /etc/apt/keyrings/opsctl-test-debian.asc" in machines.ssh(node, f"cat {sources}").stdout
        policy = machines.ssh(node, "apt-cache policy").stdout
        assert "http://deb.debian.org/debian bookworm-updates/main amd64 Packages" in policy
    finally:
        machines.ssh(node, f"rm -f {sources} /etc/apt/keyrings/opsctl-test-debian.asc", check=False)


@pytest.fixture(scope="module")
def alert_webhook(machines):
    """Where the lab inventory's Alertmanager sends notifications: the host side of the lab bridge."""
    hook = Webhook(machines.addr(machines.head).rsplit(".", 1)[0] + ".1", ALERT_WEBHOOK_PORT)
    yield hook
    hook.close()


@pytest.fixture(scope="module")
def row_remap_failure_on_gpu2(machines, alert_webhook):
    """A row-remap failure injected on gpu2, kept while the tests that need it run (the timer's drain,
    then the page through Alertmanager), cleared and resumed at the end of the module."""
    node = "gpu2"
    wait_until(lambda: machines.node_state(node)[0] in ("idle", "mixed"), 90, f"{node} idle")
    lab_cli("inject", node, "row-remap-failure")
    yield {"node": node, "since": time.monotonic()}
    lab_cli("clear", node)
    machines.resume(node)


@pytest.mark.provision
@NEEDS_MACHINES
def test_injected_row_remap_failure_is_drained_by_the_timer(machines, row_remap_failure_on_gpu2):
    node = row_remap_failure_on_gpu2["node"]
    state, reason = wait_until(lambda: machines.drained(node), 120, f"{node} drained by the opsctl timer", interval=3)
    sys.stderr.write(f"{node} drained after {time.monotonic() - row_remap_failure_on_gpu2['since']:.0f} s: {reason}\n")
    assert reason.startswith("opsctl:"), reason


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


# ---- observability: alerts, Alertmanager, opsctl's metrics, Grafana's files ----------------------
ALERT_WEBHOOK_PORT = 9199  # inventory/lab/group_vars/controller.yml, alertmanager_webhooks


@pytest.mark.provision
@NEEDS_MACHINES
def test_gpu_fault_pages_through_alertmanager_grouped_by_node_and_rule(row_remap_failure_on_gpu2, alert_webhook):
    """The row-remap failure on gpu2 (Prometheus' rule, then Alertmanager, then the webhook):
    one group per node and rule, whose alerts are the GPU's own alert or, once opsctl drained the node,
    the page that it needs a person (the drain inhibits the GPU's alert)."""
    group = (("node", "gpu2"), ("rule_id", "row-remap-failure"))
    page = wait_until(lambda: alert_webhook.groups().get(group), 60, "gpu2's page at the webhook")
    assert {name for name, _ in page} <= {"OpsctlRowRemapFailure", "OpsctlNodeNeedsPerson"}, page
    needs_person = wait_until(lambda: ("OpsctlNodeNeedsPerson", "") in alert_webhook.groups().get(group, set()),
                              60, "the needs-person page for the drained gpu2")
    assert needs_person
    for labels in alert_webhook.groups():
        assert dict(labels).get("rule_id") != "opsctl-node-drained", "inhibition sources notify no one"


@pytest.mark.provision
@NEEDS_MACHINES
def test_a_tripped_breaker_inhibits_the_per_node_pages(machines, alert_webhook):
    """The installed Alertmanager, sent what Prometheus sends when the breaker trips while nodes fail.
    The alerts resolve after 40 s, so that they silence nothing after this test."""
    url = f"http://{machines.addr(machines.head)}:9093"
    ends = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 40))
    post_alerts(url, {"alertname": "OpsctlCircuitBreakerTripped", "rule_id": "opsctl-circuit-breaker",
                      "severity": "fail"}, ends_at=ends)
    time.sleep(1)
    post_alerts(url, {"alertname": "OpsctlXid79", "node": "gpu3", "gpu": "1", "rule_id": "xid-79", "severity": "fail",
                      "action": "drain"}, ends_at=ends)
    try:
        wait_until(lambda: alert_webhook.groups().get((("rule_id", "opsctl-circuit-breaker"),)), 60,
                   "the breaker's page")
    except AssertionError as err:  # what each side saw, to tell a late notification from a lost one
        with urllib.request.urlopen(f"{url}/api/v2/alerts", timeout=10) as resp:
            held = [(a["labels"]["alertname"], a["status"]["state"]) for a in json.load(resp)]
        raise AssertionError(f"{err}; the webhook got {alert_webhook.groups()}; Alertmanager holds {held}") from None
    assert wait_until(lambda: alert_states(url, "gpu3").get("OpsctlXid79") == "suppressed", 20, "gpu3 inhibited")
    time.sleep(7)  # past the lab's group_wait (5 s) for a new group: an inhibited page would be out by now
    assert (("node", "gpu3"), ("rule_id", "xid-79")) not in alert_webhook.groups()


@pytest.mark.provision
@NEEDS_MACHINES
def test_timer_metrics_reach_prometheus_through_node_exporters_textfile(machines):
    url = f"http://{machines.addr(machines.head)}:9090/api/v1/query?" + urllib.parse.urlencode(
        {"query": 'time() - opsctl_last_success_timestamp_seconds{job="node", node="head"}'})

    def age():
        with urllib.request.urlopen(url, timeout=10) as resp:
            result = json.load(resp)["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    assert wait_until(age, 90, "opsctl's textfile metrics in Prometheus") < 120
    textfile = machines.on_head("cat /var/lib/prometheus/node-exporter/opsctl.prom")
    assert 'opsctl_runs_total{result="ok"}' in textfile and "opsctl_slurm_nodes{" in textfile


def _loaded_rule(machines, alert: str) -> str:
    """The expression of an alert rule as the head node's Prometheus has loaded it."""
    url = f"http://{machines.addr(machines.head)}:9090/api/v1/rules?type=alert"
    with urllib.request.urlopen(url, timeout=10) as resp:
        groups = json.load(resp)["data"]["groups"]
    return next(r["query"] for g in groups for r in g["rules"] if r["name"] == alert)


def _threshold_everywhere(machines) -> dict:
    rules = yaml.safe_load(machines.on_head("cat /etc/prometheus/rules/opsctl.yml"))
    alert = next(r for g in rules["groups"] for r in g["rules"] if r["alert"] == "OpsctlGpuTempHigh")
    dashboard = json.loads(machines.on_head("cat /var/lib/grafana/dashboards/opsctl/opsctl-gpu.json"))
    panel = next(p for p in dashboard["panels"] if p.get("title", "").startswith("gpu-temp-high"))
    listed = next(line for line in machines.on_head("/opt/opsctl/bin/opsctl rules list").splitlines()
                  if line.startswith("gpu-temp-high"))
    # Both print the NaN-safe alert expression: `X unless (X <= <threshold> > -Inf < +Inf)`.
    def threshold(expr: str) -> str:
        return re.search(r" <= (\S+) > -Inf", expr).group(1)

    return {"opsctl": threshold(listed), "alert rule": threshold(alert["expr"]),
            "dashboard": panel["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"]}


@pytest.mark.provision
@NEEDS_MACHINES
def test_an_inventory_override_changes_opsctl_the_installed_alert_rule_and_the_dashboard(machines):
    """A threshold set in the site's opsctl_config reaches /etc/opsctl/config.yaml, the alert rule
    Prometheus loads and the dashboard Grafana provisions; then the plain inventory puts 87 back."""
    # The site's value as extra vars: the lab's group_vars set opsctl_config too, and an inventory's
    # group_vars directory outranks another inventory source's group vars.
    lab_config = yaml.safe_load((INVENTORY / "group_vars" / "controller.yml").read_text()).get("opsctl_config", {})
    override = {"opsctl_config": {**lab_config, "catalog": {"overrides": {"gpu-temp-high": {"threshold": 83}}}}}
    tags = ["--tags", "opsctl_configure,prometheus_configure,grafana_configure", "--limit", "controller"]
    try:
        proc = playbook("-e", json.dumps(override), *tags)
        assert proc.returncode == 0, proc.stdout[-6000:]
        assert _threshold_everywhere(machines) == {"opsctl": "83", "alert rule": "83", "dashboard": 83}
        wait_until(lambda: " <= 83 > -Inf" in _loaded_rule(machines, "OpsctlGpuTempHigh"), 30,
                   "Prometheus to load the changed rule")
    finally:
        restore = playbook(*tags)
        assert restore.returncode == 0, restore.stdout[-6000:]
    assert _threshold_everywhere(machines) == {"opsctl": "87", "alert rule": "87", "dashboard": 87}


@pytest.mark.provision
@NEEDS_MACHINES
def test_grafana_provisioning_is_rendered_and_checked_and_its_password_never_shown(provisioned):
    machines = provisioned["machines"]
    first = provisioned["runs"][0]
    assert first.count("Grafana is not installed (grafana_install_packages: false)") == 1
    files = machines.on_head("ls /var/lib/grafana/dashboards/opsctl /etc/grafana/provisioning/*/").split()
    assert {"opsctl-overview.json", "opsctl-gpu.json", "opsctl-infiniband.json", "opsctl-storage.json",
            "opsctl-runs.json", "opsctl.yaml"} <= set(files)
    machines.on_head("for f in /var/lib/grafana/dashboards/opsctl/*.json; do opsctl-grafana-check dashboard $f; done"
                     " && opsctl-grafana-check ini /etc/grafana/grafana.ini")
    datasource = json.loads(machines.on_head("cat /etc/grafana/provisioning/datasources/opsctl.yaml"))["datasources"][0]
    assert (datasource["url"], datasource["jsonData"]["timeInterval"]) == (f"http://{machines.addr(machines.head)}:9090",
                                                                           "5s")
    assert machines.on_head("stat -c %a /etc/grafana/admin-password").strip() == "600"
    password = (INVENTORY / ".secrets" / "grafana-admin-password").read_text().strip()
    assert len(password) == 24 and all(password not in run for run in provisioned["runs"])


# ---- the InfiniBand precheck (roles/ib_precheck): tagged runs only, about 17 s each -----------------
IB_PRECHECK_NODE = "gpu1"  # gpu2 is the other tests' node
IB_PRECHECK_TASK = "ib_precheck : Quarantine the failing nodes and resume the ones that pass again"


@pytest.fixture
def precheck_alone(machines):
    """Every GPU node in service, and the head's health timer stopped while the test runs: its ib-down rule
    drains a node after a 1 m hold, and the drains seen here must be the precheck's own. The module's
    earlier tests leave gpu2 drained by the timer (row_remap_failure_on_gpu2): its fault is cleared and
    opsctl's own drains resumed first."""
    machines.on_head("systemctl stop opsctl-health.timer")
    try:
        clear_faults_and_resume(machines, "opsctl:")
        for name in machines.gpu_nodes:
            wait_until(lambda name=name: machines.node_state(name)[0] in ("idle", "mixed"), 120, f"{name} in service")
        assert {n: machines.drained(n) for n in machines.gpu_nodes} == dict.fromkeys(machines.gpu_nodes)
        yield machines
    finally:
        clear_faults_and_resume(machines, "opsctl:ib-precheck")
        machines.on_head("systemctl start opsctl-health.timer")


def clear_faults_and_resume(machines, owned: str) -> None:
    """Clear every GPU machine's faults and resume the drains whose reason starts with `owned`."""
    for name in machines.gpu_nodes:
        lab_cli("clear", name)
        state = machines.drained(name)
        if state and state[1].startswith(owned):
            machines.resume(name)


def precheck_run() -> subprocess.CompletedProcess:
    start = time.monotonic()
    proc = make_provision("--tags", "ib_precheck")
    sys.stderr.write(f"ib_precheck tagged run: {time.monotonic() - start:.0f} s\n")
    return proc


@pytest.mark.provision
@NEEDS_MACHINES
def test_ib_precheck_quarantines_exactly_the_failing_node_and_a_clear_returns_it(precheck_alone):
    machines = precheck_alone
    node = IB_PRECHECK_NODE
    others = [n for n in machines.gpu_nodes if n != node]
    lab_cli("inject", node, "ib-down", "--hca", "2")
    down = precheck_run()
    assert down.returncode == 0, down.stdout[-6000:] + down.stderr[-3000:]
    state, reason = machines.drained(node) or ("", "")
    assert "drain" in state and reason.startswith("opsctl:ib-precheck port-state mlx5_2 state DOWN"), (state, reason)
    assert {n: machines.drained(n) for n in others} == dict.fromkeys(others)
    assert f"drained {node}: opsctl:ib-precheck" in down.stdout
    assert {title for title, _ in changed_tasks(down.stdout)} == {IB_PRECHECK_TASK}

    lab_cli("clear", node)
    back = precheck_run()
    assert back.returncode == 0, back.stdout[-6000:] + back.stderr[-3000:]
    assert f"resumed {node}: the InfiniBand precheck passes" in back.stdout
    assert {n: machines.drained(n) for n in machines.gpu_nodes} == dict.fromkeys(machines.gpu_nodes)
    assert {title for title, _ in changed_tasks(back.stdout)} == {IB_PRECHECK_TASK}


@pytest.mark.provision
@NEEDS_MACHINES
def test_ib_precheck_with_every_port_init_quarantines_no_one_and_says_why(precheck_alone):
    machines = precheck_alone
    for name in machines.gpu_nodes:
        lab_cli("inject", name, "sm-down")
    run = precheck_run()
    assert run.returncode != 0, run.stdout[-6000:]
    assert (f"InfiniBand precheck: circuit breaker: every InfiniBand port of the {len(machines.gpu_nodes)} tested "
            "node(s) is in INIT: the subnet manager is down or unreachable, not the nodes; draining none"
            in run.stdout), run.stdout[-6000:]
    assert {n: machines.drained(n) for n in machines.gpu_nodes} == dict.fromkeys(machines.gpu_nodes)
    assert not changed_tasks(run.stdout)


def slurm_over_ssh(machines, directory: Path) -> dict:
    """sinfo and scontrol of the head, as commands on this host: scripts that run them there over SSH
    (root, the lab key, strict host-key checking), so that opsctl here drains in the lab's Slurm."""
    hv = machines.hosts[machines.head]
    ssh = shlex.join(["ssh", "-i", hv["ansible_ssh_private_key_file"],
                      *shlex.split(hv.get("ansible_ssh_common_args", "")), "-o", "BatchMode=yes",
                      f"root@{hv['ansible_host']}"])
    paths = {}
    for tool in ("sinfo", "scontrol"):
        path = directory / tool
        path.write_text(f"#!/bin/bash\nexec {ssh} \"$(printf '%q ' {tool} \"$@\")\"\n")
        path.chmod(0o755)
        paths[tool] = str(path)
    return paths


@pytest.mark.provision
@NEEDS_MACHINES
def test_fabric_test_drains_the_node_of_the_slow_hca(precheck_alone, tmp_path):
    """`opsctl ib fabric-test --drain` from the control host against the provisioned machines: ib-slow on
    one HCA of gpu2 drains gpu2, and only gpu2, with the reason `opsctl:ib-fabric mlx5_4 slow ...`, under
    the site's opsctl config (its drain limits) as the head has it."""
    machines = precheck_alone
    node = "gpu2"
    config = yaml.safe_load(machines.on_head("cat /etc/opsctl/config.yaml"))
    config.update(state_dir=str(tmp_path / "state"), audit_log=str(tmp_path / "audit.jsonl"))
    config["slurm"] = {**config.get("slurm", {}), **slurm_over_ssh(machines, tmp_path)}
    (tmp_path / "config.yml").write_text(yaml.safe_dump(config))
    lab_cli("inject", node, "ib-slow", "--hca", "4")
    try:
        run = subprocess.run([str(BIN / "opsctl"), "ib", "fabric-test", "--inventory", str(INVENTORY), "--drain",
                              "--config", str(tmp_path / "config.yml")],
                             capture_output=True, text=True, timeout=600, cwd=REPO)
        state, reason = machines.drained(node) or ("", "")
        others = {n: machines.drained(n) for n in machines.gpu_nodes if n != node}
    finally:
        lab_cli("clear", node)
        if (machines.drained(node) or ("", ""))[1].startswith("opsctl:ib-fabric"):
            machines.resume(node)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    assert "drain" in state and reason.startswith("opsctl:ib-fabric mlx5_4 slow"), (state, reason, run.stdout)
    assert others == dict.fromkeys(others)
    assert f"drained {node}: opsctl:ib-fabric" in run.stdout
    audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [r["node"] for r in audit if r["event"] == "drain"] == [node]
