"""The lab machines tier for real: systemd-nspawn machines with systemd and sshd, reached over SSH
with strict host-key checking; emulated tools checked from inside the machines with this project's
parsers. Needs root and `make deps-machines`.

The machines are this directory's (conftest.py, support.py): their own lab network and state, the
cached image shared."""

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from opsctl.fabrictest.ib_write_bw import parse_ib_write_bw
from opsctl.gpu.nvidia_smi import parse_nvidia_smi_csv
from opsctl.ib.ibstat import parse_ibstat
from opsctl.ib.ibv_devinfo import parse_ibv_devinfo
from opsctl.storage.lustre import parse_check_servers, parse_imports
from opsctl.storage.mountinfo import parse_mountinfo
from opsctl_lab.machines import keys, net, nspawn, readiness
from opsctl_lab.machines.settings import PROVISIONING_USER, STORAGE_MACHINE
from opsctl_lab.processes import cmdline
from tests.integration.machines.support import ENV, GPUS, LAB_DIR, MACHINES_MARKS, NAMES, ROOT, SETTINGS, on, opsctl

pytestmark = MACHINES_MARKS


def test_up_is_idempotent_and_restarts_nothing():
    """`up` on running machines starts nothing again: the same machine processes, "already up". Its wall time
    (2-3 s on an idle host, docs/lab-machines.md) is not asserted: beside the provisioning stream's first run
    it took 15.7 s, all of it the SSH logins waiting for the CPU."""
    before = {name: nspawn.running_pid(SETTINGS, name) for name in NAMES}
    out = opsctl("up")
    assert out.returncode == 0 and "already up" in out.stdout
    assert all(before.values()) and {name: nspawn.running_pid(SETTINGS, name) for name in NAMES} == before
    assert opsctl("status").returncode == 0  # every machine and the apt cache run


def test_ansible_ping_with_host_key_checking():
    ansible = Path(sys.executable).with_name("ansible")
    env = dict(os.environ, ANSIBLE_HOST_KEY_CHECKING="True")
    out = subprocess.run([str(ansible), "-i", str(SETTINGS.inventory_dir), "all", "-m", "ansible.builtin.ping",
                          "-o"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert sorted(line.split()[0] for line in out.stdout.splitlines() if "SUCCESS" in line) == sorted(NAMES)


def test_inventory_is_connection_data_and_groups_only():
    import yaml

    doc = yaml.safe_load((SETTINGS.inventory_dir / "hosts.yml").read_text())
    groups = doc["all"]["children"]["cluster"]["children"]
    assert list(groups["controller"]["hosts"]) == ["head"]
    assert list(groups["gpu_nodes"]["hosts"]) == GPUS == ["gpu1", "gpu2", "gpu3"]
    hosts = {name: host for group in groups.values() for name, host in group["hosts"].items()}
    assert sorted(hosts) == sorted(NAMES)  # every machine in one group
    for name, host in hosts.items():
        assert host == {
            "ansible_host": SETTINGS.addr(name), "ansible_user": "opsadmin", "ansible_become": True,
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_private_key_file": str(SETTINGS.ssh_key),
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={SETTINGS.known_hosts} -o StrictHostKeyChecking=yes"}
    assert oct(SETTINGS.ssh_key.stat().st_mode & 0o777) == "0o600"


def test_a_wrong_host_key_is_refused(tmp_path):
    # gpu1's address with gpu2's host key: ssh must refuse, not learn the new key.
    lines = {line.split(",")[0]: line for line in SETTINGS.known_hosts.read_text().splitlines()}
    bad = tmp_path / "known_hosts"
    bad.write_text(lines["gpu1"].split()[0] + " " + " ".join(lines["gpu2"].split()[1:]) + "\n")
    args = [a.replace(str(SETTINGS.known_hosts), str(bad)) for a in keys.ssh_args(SETTINGS, "gpu1")]
    assert subprocess.run(args + ["true"], capture_output=True, timeout=30).returncode != 0


def test_machines_are_real_systemd_hosts_with_apt_through_the_cache():
    for machine in ("head", "gpu1"):
        assert on(machine, "hostname").stdout.strip() == machine
        # Booted (provisioned services are not this tier's to judge); the lab's own units are active.
        state = on(machine, "systemctl is-system-running --wait", check=False).stdout.strip()
        assert state in ("running", "degraded")
    on("head", "systemctl is-active ssh")
    on("gpu1", "systemctl is-active ssh opsctl-hw-sysfs dcgm-exporter")
    assert "opsctl-lab" not in on("head", "ip route").stdout  # only the lab subnet, no default route
    assert "default" not in on("head", "ip route").stdout
    on("head", "apt-get -q update && apt-cache policy munge | grep -q Candidate")


def first_child(pid: int) -> int:
    return int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])


def test_each_machine_runs_in_cgroups_of_its_own():
    # Machines that shared one cgroup removed each other's unit cgroups while booting (219/CGROUP), and a
    # failed systemd-user-sessions kept /run/nologin, so SSH never came.
    inits = {}
    for machine in NAMES:
        supervisor = nspawn.running_pid(SETTINGS, machine)  # its child is nspawn, and nspawn's the machine's init
        nspawn_pid = first_child(supervisor)
        assert cmdline(nspawn_pid).startswith("systemd-nspawn ")
        init = first_child(nspawn_pid)
        inits[machine] = {line.split(":", 2)[2] for line in Path(f"/proc/{init}/cgroup").read_text().splitlines()
                          if line.split(":")[1] in ("", "name=systemd")}
    for machine, groups in inits.items():
        assert groups == {f"/opsctl-lab/{SETTINGS.netns(machine)}/payload/init.scope"}, groups
    for machine in NAMES:
        attach_failures = on(machine, "journalctl -b -q -o cat | grep -c 'Failed to attach to cgroup'", check=False)
        assert attach_failures.stdout.strip() == "0", machine


def test_nvidia_smi_in_a_gpu_machine():
    rows = parse_nvidia_smi_csv(on("gpu1", "nvidia-smi --query-gpu=name,memory.total --format=csv").stdout)
    assert rows == [{"name": "NVIDIA H200", "memory.total": 143771}] * 8
    assert on("gpu1", "nvidia-smi").stdout.count("NVIDIA H200") == 8


def test_infiniband_tools_in_a_gpu_machine():
    cas = parse_ibstat(on("gpu1", "ibstat").stdout)
    devs = parse_ibv_devinfo(on("gpu1", "ibv_devinfo").stdout)
    assert len(cas) == len(devs) == 9
    assert all(ca.ports[0].rate == 400 and ca.ports[0].state == "Active" for ca in cas[:8])
    state = on("gpu1", "cat /var/lib/opsctl-hw/sys/class/infiniband/mlx5_0/ports/1/state").stdout
    assert state == "4: ACTIVE\n"


def test_dcgm_exporter_service_agrees_with_nvidia_smi():
    on("gpu1", "systemctl is-active dcgm-exporter")
    for _ in range(50):
        try:
            url = f"http://{SETTINGS.addr('gpu1')}:9400/metrics"
            body = urllib.request.urlopen(url, timeout=5).read().decode()
            break
        except OSError:
            time.sleep(0.2)
    used = parse_nvidia_smi_csv(on("gpu1", "nvidia-smi --query-gpu=index,memory.used --format=csv").stdout)
    for row in used:
        line = next(x for x in body.splitlines() if x.startswith(f'DCGM_FI_DEV_FB_USED{{gpu="{row["index"]}"'))
        assert int(line.rsplit(" ", 1)[1]) == row["memory.used"]


def _bandwidth(client, server, hca):
    on(server, f"ib_write_bw -d {hca} --report_gbits >/tmp/ib_write_bw.server 2>&1 &")
    time.sleep(0.7)
    return parse_ib_write_bw(on(client, f"ib_write_bw -d {hca} --report_gbits {server}").stdout)


def test_ib_write_bw_between_machines_follows_the_fabric_model():
    assert _bandwidth("gpu1", "gpu2", "mlx5_3").bw_average > 390
    assert opsctl("inject", "gpu2", "ib-slow", "--hca", "3").returncode == 0
    try:
        assert 190 < _bandwidth("gpu1", "gpu2", "mlx5_3").bw_average < 200
        assert _bandwidth("gpu1", "gpu3", "mlx5_3").bw_average > 390
    finally:
        opsctl("clear", "gpu2")


def fabric_test(tmp_path, *args, inventory=LAB_DIR / "inventory"):
    """`opsctl ib fabric-test` from the host, as an admin runs it from the control host."""
    config = tmp_path / "config.yml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\naudit_log: {tmp_path / 'audit.jsonl'}\n")
    return subprocess.run([sys.executable, "-m", "opsctl", "ib", "fabric-test", "--inventory", str(inventory),
                           "--config", str(config), *args], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=600)


def test_fabric_test_names_the_slow_hca_and_only_it(tmp_path):
    """`opsctl ib fabric-test` over SSH into the machines, real ib_write_bw processes on both ends: a clean
    fabric passes; ib-slow on one HCA of gpu2 is named exactly (node and rail), in the 3 rounds that
    3 nodes need (round 1 finds the slow pair, 2 and 3 test each end against a good partner)."""
    clean = fabric_test(tmp_path, "--json")
    assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr
    report = json.loads(clean.stdout)
    assert report["verdict"] == "pass" and report["culprits"] == []
    assert {n["node"] for n in report["nodes"]} == {"gpu1", "gpu2", "gpu3"}
    assert all(m["gbps"] > 390 for n in report["nodes"] for h in n["hcas"] for m in h["measurements"])

    assert opsctl("inject", "gpu2", "ib-slow", "--hca", "5").returncode == 0
    try:
        slow = fabric_test(tmp_path, "--json")
    finally:
        opsctl("clear", "gpu2")
    assert slow.returncode == 1, slow.stdout[-3000:] + slow.stderr
    report = json.loads(slow.stdout)
    assert report["culprits"] == [{"node": "gpu2", "hca": "mlx5_5", "verdict": "slow"}], report["culprits"]
    assert report["rounds"] == 3
    gpu2 = next(n for n in report["nodes"] if n["node"] == "gpu2")
    rail5 = next(h for h in gpu2["hcas"] if h["hca"] == "mlx5_5")
    assert rail5["measurements"] and all(190 < m["gbps"] < 200 for m in rail5["measurements"])
    others = [h["verdict"] for n in report["nodes"] for h in n["hcas"] if (n["node"], h["hca"]) != ("gpu2", "mlx5_5")]
    assert others == ["good"] * 23


def test_fabric_test_refuses_a_wrong_host_key(tmp_path):
    """The inventory's known_hosts is the truth: gpu3's address with gpu2's key is refused, and nothing is
    tested (exit 3, one line naming gpu3)."""
    inventory = tmp_path / "inventory"
    shutil.copytree(LAB_DIR / "inventory", inventory)
    lines = {line.split(",")[0]: line for line in SETTINGS.known_hosts.read_text().splitlines()}
    known = inventory / ".ssh" / "known_hosts"
    lines["gpu3"] = lines["gpu3"].split()[0] + " " + " ".join(lines["gpu2"].split()[1:])
    known.write_text("".join(line + "\n" for line in lines.values()))
    hosts = inventory / "hosts.yml"
    hosts.write_text(hosts.read_text().replace(str(SETTINGS.known_hosts), str(known)))
    out = fabric_test(tmp_path, inventory=inventory)
    assert out.returncode == 3, out.stdout + out.stderr
    assert "gpu3" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_fault_changes_that_machine_only():
    def snapshot(machine):
        return (on(machine, "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader").stdout,
                on(machine, "ibstat mlx5_2").stdout.replace("\t", ""))

    before = {m: snapshot(m) for m in ("gpu1", "gpu2", "gpu3")}
    assert opsctl("inject", "gpu2", "gpu-leftover-memory", "--gpu", "4").returncode == 0
    assert opsctl("inject", "gpu2", "ib-down", "--hca", "2").returncode == 0
    try:
        apps = parse_nvidia_smi_csv(on("gpu2", "nvidia-smi --query-compute-apps=pid,used_memory "
                                                        "--format=csv").stdout)
        assert len(apps) == 1 and apps[0]["used_gpu_memory"] > 80000
        assert parse_ibstat(on("gpu2", "ibstat mlx5_2").stdout)[0].ports[0].state == "Down"
        assert snapshot("gpu1") == before["gpu1"] and snapshot("gpu3") == before["gpu3"]
    finally:
        assert opsctl("clear", "gpu2").returncode == 0
    assert parse_ibstat(on("gpu2", "ibstat mlx5_2").stdout)[0].ports[0].state == "Active"


FAULT_MACHINE = "gpu3"  # the GPU machine that the storage fault tests break
# opsctl's own storage probe (opsctl.storage.probe: a child that stats the mount and writes a new probe
# file), run in the machine from the copy of opsctl that its emulated tools use: it needs nothing else.
PROBE_HOME = ("cd / && PYTHONPATH=/opt/opsctl-hw python3 -c 'from opsctl.storage.probe import probe_mounts; "
              "r = probe_mounts({\"/home\": \"/home/.opsctl-probe\", \"/lustre\": None}, 3); "
              "print(r[\"/home\"].status, r[\"/lustre\"].status)'")
# A unit that needs the storage as slurmd does with its drop-in `RequiresMountsFor=/shared /lustre`.
NEEDS_STORAGE = "opsctl-test-needs-storage.service"
NEEDS_STORAGE_UNIT = """[Unit]
Description=needs /shared and /lustre, as slurmd does
RequiresMountsFor=/shared /lustre

[Service]
ExecStart=/bin/sleep infinity
"""


def lustre_down(machine):
    """The Lustre targets that `lctl get_param` and `lfs check servers` show down, read by opsctl's parsers."""
    imports = parse_imports(on(machine, "lctl get_param 'osc.*.import' 'mdc.*.import'").stdout)
    servers = on(machine, "lfs check servers")
    assert len(imports) == 5
    return (sorted(i.target for i in imports if not i.healthy),
            sorted(s.target for s in parse_check_servers(servers.stdout + servers.stderr) if not s.active))


def is_active(machine, unit):
    return on(machine, f"systemctl is-active {unit}", check=False).stdout.strip()


def mounted(machine):
    """The mount points of the emulated mountinfo (what `opsctl node check` reads)."""
    return set(parse_mountinfo(on(machine, "cat /var/lib/opsctl-hw/storage/mountinfo").stdout))


def hung_home(machine):
    """The filesystem types mounted on /home, from the machine's own mountinfo (a stat would hang)."""
    out = on(machine, "awk '$5 == \"/home\" {split($0, a, \" - \"); split(a[2], b, \" \"); print b[1]}' "
                      "/proc/self/mountinfo").stdout
    return out.split()


def test_storage_faults_in_a_gpu_machine():
    """lustre-ost-down in lctl and lfs; mount-missing stops the real shared.mount, which cannot start again
    (nor can a unit that requires it) until clear; nfs-hung makes /home hang (a FUSE mount that never
    answers, opsctl_lab.hung_mount): opsctl's probe and a stat of /home wait until clear, which ends the
    hang, its waiters and its mount."""
    m = FAULT_MACHINE
    on(m, "systemctl is-active shared.mount lustre.mount")
    on(m, "touch /shared/written && test -e /var/lib/opsctl-hw/storage/exports/shared/written")  # a real bind mount
    assert mounted(m) == {"/", "/home", "/shared", "/lustre"}
    assert lustre_down(m) == ([], [])
    on(m, f"cat >/etc/systemd/system/{NEEDS_STORAGE} <<'END'\n{NEEDS_STORAGE_UNIT}END\n"
          f"systemctl daemon-reload && systemctl start {NEEDS_STORAGE}")
    try:
        assert opsctl("inject", m, "lustre-ost-down").returncode == 0
        assert lustre_down(m) == (["lustre-OST0002"], ["lustre-OST0002"])
        assert is_active(m, "shared.mount") == "active" and is_active(m, NEEDS_STORAGE) == "active"

        out = opsctl("inject", m, "mount-missing")
        assert out.returncode == 0 and out.stdout == f"{m}: injected mount-missing\n", out.stdout + out.stderr
        assert is_active(m, "shared.mount") == "inactive"
        assert is_active(m, NEEDS_STORAGE) == "inactive"  # stopped with the mount it requires
        assert on(m, "systemctl start shared.mount", check=False).returncode != 0
        assert on(m, f"systemctl start {NEEDS_STORAGE}", check=False).returncode != 0
        assert mounted(m) == {"/", "/home", "/lustre"}
        assert is_active(m, "lustre.mount") == "active"

        assert on(m, PROBE_HOME).stdout.split() == ["ok", "ok"]
        assert opsctl("inject", m, "nfs-hung").returncode == 0
        # In its own SSH session: the hang outlives opsctl-hw and the session that injected it.
        assert on(m, PROBE_HOME).stdout.split() == ["hung", "ok"]
        assert on(m, "timeout 2 stat /home", check=False).returncode == 124  # killed waiting, not failed
        assert hung_home(m) == ["fuse.opsctl-hung"]
        on(m, "setsid stat /home >/tmp/waiter.out 2>&1 </dev/null & echo $! >/tmp/waiter.pid")
    finally:
        assert opsctl("clear", m).returncode == 0
    assert lustre_down(m) == ([], [])
    assert is_active(m, "shared.mount") == "active"
    # The waiter got its answer (ENOTCONN) when the hang ended; the mount and its holder are gone.
    on(m, "for i in $(seq 50); do kill -0 $(cat /tmp/waiter.pid) 2>/dev/null || break; sleep 0.1; done; "
          "! kill -0 $(cat /tmp/waiter.pid) 2>/dev/null && ! pgrep -f 'opsctl-hung-[h]older'")
    assert "Transport endpoint is not connected" in on(m, "cat /tmp/waiter.out").stdout
    assert hung_home(m) == [] and on(m, PROBE_HOME).stdout.split() == ["ok", "ok"]
    on(m, "test -e /shared/written")
    assert mounted(m) == {"/", "/home", "/shared", "/lustre"}
    assert is_active(m, NEEDS_STORAGE) != "active"  # clear mounts again but starts nothing else
    on(m, f"systemctl start {NEEDS_STORAGE} && systemctl stop {NEEDS_STORAGE} && rm /etc/systemd/system/"
          f"{NEEDS_STORAGE} /shared/written && systemctl daemon-reload")


def test_bad_inject_is_one_line_exit_2():
    out = opsctl("inject", "gpu2", "no-such-fault")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    out = opsctl("inject", "gpu9", "dbe")
    assert out.returncode == 2 and out.stderr.startswith("opsctl: error: unknown GPU machine")


# Holds the boot as a slow unit does on a real node: systemd-user-sessions.service, which removes
# /run/nologin, waits for it.
SLOW_BOOT = "opsctl-test-slow-boot.service"
SLOW_BOOT_UNIT = """[Unit]
Description=holds the boot before user sessions (longer than the test: `up` must still find it waiting)
Before=systemd-user-sessions.service

[Service]
Type=oneshot
ExecStart=/bin/sleep 900

[Install]
WantedBy=multi-user.target
"""


def as_provisioning_user(machine):
    return subprocess.run(keys.ssh_args(SETTINGS, machine, PROVISIONING_USER) + ["true"], capture_output=True,
                          text=True, timeout=30)


def without_ssh(argv, **kwargs):
    """subprocess.run for a machine whose sshd does not answer."""
    if argv[0] == "ssh":
        return subprocess.CompletedProcess(argv, 255, "", "ssh: connect to host port 22: Connection refused\n")
    return subprocess.run(argv, **kwargs)


def test_up_waits_until_the_provisioning_user_can_log_in():
    """A boot held before systemd-user-sessions lets root in but refuses the provisioning user
    (/run/nologin): `up` times out naming the unit that holds it, the next `up` does not call the machine
    up, and once the unit is gone `up` succeeds and provisioning can log in."""
    m = STORAGE_MACHINE
    on(m, f"cat >/etc/systemd/system/{SLOW_BOOT} <<'END'\n{SLOW_BOOT_UNIT}END\nsystemctl enable -q {SLOW_BOOT}")
    try:
        nspawn.stop(SETTINGS, m)
        out = opsctl("up", "--boot-timeout", "15")
        assert out.returncode == 2, out.stdout + out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert f"({m}: boot not finished, waiting for: " in out.stderr and SLOW_BOOT in out.stderr, out.stderr
        on(m, "test -e /run/nologin")  # root is let in meanwhile
        assert as_provisioning_user(m).returncode == 255  # refused by sshd (pam_nologin), not `true` failing
        # Without root's SSH the boot journal, read from the host, names the unit too.
        from_journal = readiness.boot_waits(SETTINGS, m, run=without_ssh)
        assert "boot waiting for: " in from_journal and SLOW_BOOT in from_journal, from_journal
        out = opsctl("up", "--boot-timeout", "3")
        assert out.returncode == 2 and "already up" not in out.stdout, out.stdout + out.stderr
        assert SLOW_BOOT in out.stderr, out.stderr
    finally:
        on(m, f"systemctl disable -q {SLOW_BOOT} && systemctl stop {SLOW_BOOT} && "
              f"rm /etc/systemd/system/{SLOW_BOOT} && systemctl daemon-reload && systemctl reset-failed")
    out = opsctl("up")
    assert out.returncode == 0, out.stdout + out.stderr
    on(m, "test ! -e /run/nologin")
    assert as_provisioning_user(m).returncode == 0


def _lab_processes():
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(SETTINGS.state_dir) in cmd:
            found.append(cmd)
    return found


def test_down_leaves_nothing_and_up_again_works():
    # Storage faults outlive the restart, as broken hardware does (checked after `up` below); a hung /home
    # keeps no machine from halting.
    assert opsctl("inject", FAULT_MACHINE, "mount-missing").returncode == 0
    assert opsctl("inject", FAULT_MACHINE, "nfs-hung").returncode == 0
    out = opsctl("down")
    assert out.returncode == 0, out.stderr
    assert opsctl("status").returncode == 1  # machines stopped: not what the tier should run
    assert _lab_processes() == []  # nspawn machines and apt-cacher-ng (zombies have no cmdline)
    names = NAMES
    assert net.lab_netns(SETTINGS) == []
    propagate = Path("/run/systemd/nspawn/propagate")
    assert not any((propagate / SETTINGS.nspawn_name(m)).exists() for m in names)
    assert not any(group.exists() for m in names for group in nspawn.cgroups(SETTINGS, m))
    assert subprocess.run(["ip", "link", "show", "dev", SETTINGS.bridge], capture_output=True).returncode != 0
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert not any(f" {SETTINGS.veth(m)}@" in links for m in names)
    assert SETTINGS.subnet not in subprocess.run(["ip", "route", "show", "table", "all"], capture_output=True,
                                                 text=True).stdout
    began = time.monotonic()
    out = opsctl("up")
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - began < 60  # a warm image
    assert "cached" in out.stdout and "total" in out.stdout
    on("gpu3", "nvidia-smi -L")
    assert f"faults {FAULT_MACHINE}: mount-missing, nfs-hung" in out.stdout
    assert is_active(FAULT_MACHINE, "shared.mount") != "active" and "/shared" not in mounted(FAULT_MACHINE)
    assert on(FAULT_MACHINE, "systemctl start shared.mount", check=False).returncode != 0
    assert on(FAULT_MACHINE, PROBE_HOME).stdout.split() == ["hung", "ok"]  # hung again from boot on
    assert opsctl("clear", FAULT_MACHINE).returncode == 0
    assert is_active(FAULT_MACHINE, "shared.mount") == "active" and "/shared" in mounted(FAULT_MACHINE)
    assert hung_home(FAULT_MACHINE) == [] and on(FAULT_MACHINE, PROBE_HOME).stdout.split() == ["ok", "ok"]
