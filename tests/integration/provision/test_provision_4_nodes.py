"""The GPU node roles on the provisioned machines: a driver change rolls out a batch of machines at a time
under running jobs, the common role adds an APT repository only with the expected key, and a node that
lost a GPU gets a NodeName= line of its own and is drained while the others keep theirs.
"""

import json
import re
import shlex
import subprocess
import threading

import pytest
import yaml

from opsctl.slurm.hostlist import hostlist_expression
from opsctl_lab.vendor_repos import spec
from tests.integration.provision.support import (
    BIN,
    ENV,
    INVENTORY,
    NEEDS_MACHINES,
    NEEDS_ROOT,
    REPO,
    BackgroundPlaybook,
    changed_tasks,
    lab_cli,
    playbook,
    wait_until,
)
from tests.vendor_stack import (
    BRANCH,
    DPKG_QUERY,
    LUSTRE,
    NEWER,
    PINNED,
    branch_builds,
    installed,
    platform_packages,
)

pytestmark = [NEEDS_ROOT]
LAB_GPU_VARS = yaml.safe_load((INVENTORY / "group_vars" / "gpu_nodes.yml").read_text())
MODPROBE = " ".join(LAB_GPU_VARS["nvidia_modprobe_command"])  # the lab kernel's module loading
LOADED_MODULES = LAB_GPU_VARS["nvidia_loaded_modules_dir"]
BATCH = 2  # GPU machines per batch of the driver rollout


@pytest.mark.provision
@NEEDS_MACHINES
def test_the_first_run_installed_the_vendor_stack_at_its_pins_from_the_lab_repositories(machines):
    """`make provision` installed DOCA, the driver, fabric manager, NSCQ, DCGM and the Lustre client on every
    GPU machine from the lab's vendor repositories with real apt, and rebooted them: every package of the
    driver's branch, named or pulled in, is at the pinned build although a newer one is in the repository;
    DCGM is at its pin; nvidia_peermem and Lustre's ko2iblnd were built against DOCA's MLNX_OFED and are
    loaded; the common role holds them."""
    ofed = spec.load("doca").package("mlnx-ofed-kernel-dkms").versions[0]
    named = platform_packages("driver_packages") + platform_packages("fabric_packages")
    for node in machines.gpu_nodes:
        packages = installed(machines.ssh(node, DPKG_QUERY).stdout)
        assert {wanted.split("=")[0]: packages.get(wanted.split("=")[0]) for wanted in named} == \
            {name: version for name, version in (wanted.split("=") for wanted in named)}, node
        branch = {name: v for name, v in packages.items() if v.startswith(f"{BRANCH}.")}
        assert len(branch) > len(named) and not branch_builds(packages, PINNED), (node, branch)
        assert NEWER in machines.ssh(node, "apt-cache policy nvidia-driver-cuda").stdout
        assert packages["mlnx-ofed-kernel-dkms"] == ofed, node
        assert packages["datacenter-gpu-manager-4-core"] == "1:4.2.3" and "1:4.4.1-1" in machines.ssh(
            node, "apt-cache policy datacenter-gpu-manager-4-core").stdout, node
        assert machines.ssh(node, "systemctl is-active nvidia-dcgm").stdout.strip() == "active"
        assert packages["lustre-client-modules-dkms"] == packages["lustre-client-utils"] == f"{LUSTRE}-1", node
        # DKMS needs the running kernel's headers and image: from the lab's kernel repository, held.
        release = machines.ssh(node, "uname -r").stdout.strip()
        assert packages["linux-image-amd64"] == packages[f"linux-image-{release}"] == f"{release}-1", node
        modules = machines.ssh(node, "cat /lib/modules/$(uname -r)/updates/dkms/nvidia-peermem.ko "
                                     "/lib/modules/$(uname -r)/updates/kernel/net/lustre/ko2iblnd.ko").stdout.split()
        assert modules.count(f"ib_core={ofed}") == 2, (node, modules)
        # Loaded at the boot after the install (nvidia_peermem: modules-load.d), or now (ko2iblnd).
        machines.ssh(node, f"test -d {LOADED_MODULES}/nvidia_peermem && {MODPROBE} ko2iblnd")
        held = set(machines.ssh(node, "apt-mark showhold").stdout.split())
        assert {"nvidia-driver-cuda", "libnvidia-ml1", "libcuda1", "datacenter-gpu-manager-4-core",
                "mlnx-ofed-kernel-dkms", "linux-image-amd64"} <= held


class OutOfService(threading.Thread):
    """Samples the GPU machines' Slurm states every second while a run goes on: every sample's machines out
    of service (drained, down or rebooting), with their states and reasons."""

    def __init__(self, machines):
        super().__init__(daemon=True)
        self.machines, self.samples, self.done = machines, [], threading.Event()

    def run(self):
        names = ",".join(self.machines.gpu_nodes)
        while not self.done.is_set():
            out = self.machines.ssh(self.machines.head, f"sinfo -h -N -n {names} -o '%N|%T|%E'", check=False).stdout
            rows = [line.split("|", 2) for line in out.splitlines() if line.count("|") == 2]
            self.samples.append({node: (state, reason) for node, state, reason in rows
                                 if any(word in state for word in ("drain", "down", "reboot"))})
            self.done.wait(1.0)


@pytest.mark.provision
@NEEDS_MACHINES
def test_a_driver_change_rolls_out_a_batch_at_a_time_under_running_jobs(machines, tmp_path):
    """A new driver version while a job runs on every GPU machine (as the lab's user; each ends by itself
    10 s after its machine is drained): the nvidia role leaves the change of a node in service to the
    rollout play, which drains one batch at a time (here 2 machines, `provision_batch`: the default, 1 of
    the lab's 3 GPU machines, would take a third batch of drain, install and reboot), waits for its jobs to
    end, moves every package of the branch to the new build (held by the first run's common role), has
    Slurm reboot the machine (`scontrol reboot` through opsctl), checks what booted, and puts it back. No
    job is killed (each writes its last line, in /var/tmp: a reboot empties /tmp), no more machines are
    out of service than the batch at any time, a job submitted meanwhile starts on a machine not being
    changed, and every machine ends on the new version, in service, its packages held again. The boot
    files are written again on the way. The machines stay on the new build: no later test reads the
    driver's version."""
    gpus = machines.gpu_nodes
    new = NEWER.rsplit("-", 1)[0]
    machines.ssh(gpus[0], "rm /etc/modprobe.d/opsctl-nvidia-blacklist.conf")
    booted = {node: machines.ssh(node, "cat /proc/sys/kernel/random/boot_id").stdout for node in gpus}
    # Each job runs until the rollout has drained its machine, then a little longer, and ends by itself:
    # however long the run takes to reach a batch, the drain meets a running job and must wait for it.
    job = ("timeout 600 sh -c 'until scontrol show node $SLURMD_NODENAME | grep -q \"State=[A-Z_+]*DRAIN\"; "
           "do sleep 1; done; sleep 10' && echo finished")
    jobs = {node: machines.on_head(f"runuser -u labuser -- sbatch --parsable -D /var/tmp -o /var/tmp/rollout-%j.out "
                                   f"-w {node} "
                                   f"--wrap {shlex.quote(job)}").strip() for node in gpus}
    sampler = OutOfService(machines)
    run = None
    try:
        wait_until(lambda: all(machines.on_head(f"squeue -h -j {job} -o %t").strip() == "R" for job in jobs.values()),
                   60, "a job running on every GPU machine")
        sampler.start()
        run = BackgroundPlaybook("--tags", "nvidia", "-e", f"nvidia_driver_version={new} provision_batch={BATCH}",
                                 log=tmp_path / "rollout.log")
        wait_until(lambda: any(sampler.samples) or run.ended(), 240, "a machine drained", explain=run.story)
        assert any(sampler.samples), f"no machine drained: {run.story()}"
        during = machines.on_head("runuser -u labuser -- sbatch --parsable -D /tmp -o /dev/null --wrap 'sleep 10'")
        ran_on = wait_until(lambda: machines.on_head(f"squeue -h -j {during.strip()} -o '%t %N'").split()[1:], 60,
                            "the job submitted during the run started")[0]
        # The machine it runs on is not one being changed (drained: out of service with no job left).
        assert machines.node_state(ran_on)[0] != "drained", ran_on
        proc = run.finish(timeout=1200)
    finally:
        if run is not None:
            run.stop()
        sampler.done.set()
        for job in jobs.values():
            machines.on_head(f"scancel {job}", check=False)
    assert proc.returncode == 0, proc.stdout[-8000:]
    out = [sample for sample in sampler.samples if sample]
    assert max(len(sample) for sample in out) == BATCH, out
    assert {node for sample in out for node in sample} == set(gpus), out
    assert all(reason.startswith(f"opsctl:provision nvidia driver {new}") for sample in out
               for _, reason in sample.values()), out
    assert {node for sample in out for node, (state, _) in sample.items() if state == "draining"} == set(gpus), \
        out  # each drain waited for its machine's job
    text = " ".join(proc.stdout.split())
    rebooted = {host for task, host in changed_tasks(proc.stdout)
                if task == "handler nvidia : Reboot the node through Slurm and wait until it registers again"}
    assert rebooted == set(gpus), sorted(changed_tasks(proc.stdout))
    for node in gpus:
        assert f"drained {node}: opsctl:provision nvidia driver {new}" in text
        assert f"resumed {node}: the rollout's change passed its checks" in text
        assert machines.ssh(node, f"cat /var/tmp/rollout-{jobs[node]}.out").stdout == "finished\n"
        assert machines.ssh(node, "cat /proc/sys/kernel/random/boot_id").stdout != booted[node]
        # slurmd started only once Fabric Manager had trained the fabric (the provision tests' machines take 20 s).
        ready = machines.ssh(node, "journalctl -b -u slurmd -o cat | grep 'opsctl-gpus-ready: GPUs'").stdout
        waited = re.search(r"GPUs ready after (\d+)s", ready)
        assert waited and int(waited.group(1)) >= 5, (node, ready)
        # What booted: the new build of every package, its driver and its nvidia_peermem loaded.
        assert not branch_builds(installed(machines.ssh(node, DPKG_QUERY).stdout), NEWER), node
        smi = machines.ssh(node, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout
        assert set(smi.split()) == {new}, (node, smi)
        assert machines.ssh(node, f"cat {LOADED_MODULES}/nvidia_peermem/version").stdout.strip() == new
        # apt dropped the holds of what it moved; the run's last play held them again.
        assert {"nvidia-driver-cuda", "libnvidia-ml1"} <= set(machines.ssh(node, "apt-mark showhold").stdout.split())
    assert proc.stdout.count("PLAY [NVIDIA driver rollout, a batch of GPU nodes at a time]") == -(-len(gpus) // BATCH)
    # The boot file rewritten on gpus[0] outside the rollout waited for its reboot there: no job was ended.
    assert (f"{gpus[0]}: a boot file of the GPU stack changed; the node runs jobs, so it applies at the node's "
            "next boot") in text
    machines.ssh(gpus[0], "grep -x 'blacklist nouveau' /etc/modprobe.d/opsctl-nvidia-blacklist.conf")
    wait_until(lambda: all(machines.node_state(n)[0] in ("idle", "mixed") for n in gpus), 90, "every GPU machine back")


# Debian 12's own archive key (debian-archive-keyring), armored: a key the lab machines have, for a
# repository they can reach. The fingerprint is the primary key's, B8B8...; 4CB5... is its subkey. A suite
# no other sources file names: the nvidia role's (Debian's contrib) already has bookworm and bookworm-updates
# with Debian's keyring, and apt refuses one suite signed by two keys ("Conflicting values set for option
# Signed-By").
DEBIAN_KEY = {"name": "opsctl-test-debian", "uris": "http://deb.debian.org/debian", "suites": "bookworm-backports",
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
        assert "http://deb.debian.org/debian bookworm-backports/main amd64 Packages" in policy
    finally:
        machines.ssh(node, f"rm -f {sources} /etc/apt/keyrings/opsctl-test-debian.asc", check=False)


@pytest.mark.provision
@NEEDS_MACHINES
def test_a_node_that_lost_a_gpu_gets_its_own_line_and_is_drained_hw_mismatch(machines):
    """gpu-missing on one machine before a run: discovery on each node, so that machine gets a NodeName= line
    of its own with 7 GPUs and is drained `opsctl:hw-mismatch`, while the others keep 8 and stay in service.
    With the GPU back, the next run puts it into the shared line again and resumes it. Only the tasks that
    discover the hardware, render the Slurm config and decide (tags facts, slurm_configure, hw_quarantine);
    the head's health timer is stopped meanwhile, so that the only drain is this check's."""
    node, others = machines.gpu_nodes[-1], machines.gpu_nodes[:-1]
    tags = ("--tags", "facts,slurm_configure,hw_quarantine")
    node_lines = "grep '^NodeName=' /etc/slurm/slurm.conf"
    before = machines.on_head(node_lines)
    machines.on_head("systemctl stop opsctl-health.timer")
    try:
        lab_cli("inject", node, "gpu-missing", "--gpu", "7")
        lost = playbook(*tags)
        assert lost.returncode == 0, lost.stdout[-6000:]
        lines = machines.on_head(node_lines).splitlines()
        assert [line.split()[0] for line in lines] == [f"NodeName={hostlist_expression(others)[0]}",
                                                       f"NodeName={node}"], lines
        assert "Gres=gpu:h200:8" in lines[0] and "Gres=gpu:h200:7" in lines[1], lines
        state, reason = wait_until(lambda: machines.drained(node), 60, f"{node} drained")
        assert reason.startswith("opsctl:hw-mismatch gpus 7 (profile 8)"), (state, reason)
        assert {n: machines.drained(n) for n in others} == dict.fromkeys(others)
        assert f"drained {node}: opsctl:hw-mismatch gpus 7 (profile 8)" in lost.stdout
    finally:
        lab_cli("clear", node)
        back = playbook(*tags)
        machines.on_head("systemctl start opsctl-health.timer")
    assert back.returncode == 0, back.stdout[-6000:]
    assert machines.on_head(node_lines) == before
    assert f"resumed {node}: the hardware fits its group's profile again" in back.stdout
    assert any(task.startswith("slurm_compute : Drain the nodes whose hardware differs") for task, _ in
               changed_tasks(back.stdout)), sorted(changed_tasks(back.stdout))
    wait_until(lambda: all(machines.node_state(n)[0] in ("idle", "mixed") for n in machines.gpu_nodes), 90,
               "every GPU machine in service")



@pytest.mark.provision
@NEEDS_MACHINES
def test_a_node_that_boots_without_a_gpu_drains_itself_before_any_job_starts(machines):
    """gpu-missing on a machine, then the machine reboots as after a crash (not through Slurm: nothing drained it
    first). slurmd waits for the GPUs that answer, then runs its HealthCheckProgram before it registers (slurm.conf(5)):
    `opsctl node check --drain-self` counts 7 GPUs where Slurm was told 8 and drains the node `opsctl:node-check
    gpu-count node`, whatever slurmctld shows of the node meanwhile (NOT_RESPONDING, or a job's end the reboot cut
    short: COMPLETING). The head's health timer is stopped meanwhile, so that the only drain is the node's own.
    Afterwards a person resumes it (Slurm set it DOWN for rebooting unexpectedly, which the node check leaves to a
    person). No job is queued for it: one allocated before slurmctld noticed the reboot would meet a node gone,
    which no check on the node can prevent."""
    node = machines.gpu_nodes[0]
    booted = machines.ssh(node, "cat /proc/sys/kernel/random/boot_id").stdout
    machines.on_head("systemctl stop opsctl-health.timer")
    try:
        lab_cli("inject", node, "gpu-missing", "--gpu", "3")
        machines.ssh(node, "systemctl reboot", check=False)
        wait_until(lambda: machines.ssh(node, "cat /proc/sys/kernel/random/boot_id", check=False).stdout
                   not in ("", booted), 180, f"{node} booted again")
        # Drained before slurmd registered; slurmctld may then set it DOWN for the reboot it did not ask for
        # (ReturnToService=1: "Node unexpectedly rebooted" keeps an existing reason), which a person resumes.
        state, reason = wait_until(lambda: (lambda s: s if s[1].startswith("opsctl:") else None)(
            machines.node_state(node)), 240, f"{node} drained by its health check")
        assert reason == "opsctl:node-check gpu-count node", (state, reason)
        log = machines.ssh(node, "journalctl -b -t opsctl-health-check -o cat").stdout
        assert f"drained {node}: opsctl:node-check gpu-count node" in log, log
    finally:
        lab_cli("clear", node)
        # A person's resume, again until it holds: slurmd may register (and slurmctld set the node DOWN for its
        # unasked reboot) after a first one.
        wait_until(lambda: machines.node_state(node)[0] in ("idle", "mixed") or machines.resume(node), 300,
                   f"{node} back in service")
        # The head's timer again only once Prometheus has the eighth GPU: on the scrape before the clear it would
        # drain the node for it (a person's resume leaves opsctl no record to hold that data against).
        wait_until(lambda: healthy_to_the_head(machines, node), 120, f"{node} ok to the head's health run")
        machines.on_head("systemctl start opsctl-health.timer")


def healthy_to_the_head(machines, node) -> bool:
    """A read-only health run on the head judges the node ok."""
    out = machines.ssh(machines.head, f"/opt/opsctl/bin/opsctl health --json --nodes {node}", check=False).stdout
    try:
        return any(n["node"] == node and n["status"] == "ok" for n in json.loads(out)["nodes"])
    except (ValueError, KeyError):
        return False
