"""What the provision tests share: the lab inventory, ansible-playbook and `make provision` runs, the
lab machines over SSH, and waiting.

The machines are provisioned once per test session (conftest.py, the `provisioned` fixture); every module
under tests/integration/provision/ uses them. Needs root, systemd-nspawn and `make deps-machines`.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="the lab machines need root")
NEEDS_MACHINES = pytest.mark.skipif(shutil.which("systemd-nspawn") is None, reason="make deps-machines")
REPO = Path(__file__).resolve().parents[3]
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


def make_provision(*playbook_args: str, make_vars: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "provision", f"PLAYBOOK_ARGS={' '.join(playbook_args)}",
                           *make_vars], capture_output=True, text=True, timeout=1800, cwd=REPO, env=ENV,
                          stdin=subprocess.DEVNULL)


SITE_PLAYBOOK = [str(BIN / "ansible-playbook"), "-i", str(INVENTORY), "playbooks/site.yml"]


def playbook(*args, timeout=1200) -> subprocess.CompletedProcess:
    return subprocess.run([*SITE_PLAYBOOK, *args], capture_output=True, text=True, timeout=timeout, env=ENV, cwd=REPO,
                          stdin=subprocess.DEVNULL)


class BackgroundPlaybook:
    """A site.yml run that a test watches while it goes on. Its output (stdout and stderr together) goes to
    `log` as it comes, so that a test that gives up waiting on the run can say how far it got, and stop()
    ends it, so that no run outlives its test and changes the machines under the next one."""

    def __init__(self, *args: str, log: Path):
        self.log = log
        with log.open("w") as out:
            self.proc = subprocess.Popen([*SITE_PLAYBOOK, *args], stdout=out, stderr=subprocess.STDOUT, text=True,
                                         stdin=subprocess.DEVNULL, env=ENV, cwd=REPO)

    def ended(self) -> bool:
        return self.proc.poll() is not None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def story(self) -> str:
        """Where the run is: its exit code or 'still running', and the last of its output."""
        state = "still running" if self.proc.poll() is None else f"ended, exit {self.proc.returncode}"
        return f"the run {state}; its output ends with:\n{self.output()[-6000:]}"

    def finish(self, timeout: float) -> subprocess.CompletedProcess:
        self.proc.wait(timeout)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, self.output(), "")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Machines:
    """The lab machines of an inventory (the lab's by default): their hosts and groups, and SSH to them."""

    def __init__(self, inventory: Path = INVENTORY):
        doc = yaml.safe_load((inventory / "hosts.yml").read_text())
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
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
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


def wait_until(check, timeout: float, what: str, interval: float = 2.0, explain=None):
    """check() until it returns something true, and that; at the timeout an AssertionError that says what
    was awaited, the last answer, and explain() (how far what should bring it about got) when given."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})"
                         + (f"; {explain()}" if explain else ""))


def lab_cli(*args):
    out = subprocess.run([sys.executable, "-m", "opsctl", "lab", "machines", *args], capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return out.stdout


def start_from_new_machines() -> None:
    """The first run provisions new machines: those an earlier test session left (one stopped halfway leaves
    its drains, faults and reservations; a whole one leaves the GPU machines on the rollout's newer
    driver, below the inventory's pin) are removed first. The cached image stays: new machines cost
    seconds."""
    from opsctl_lab.machines.lifecycle import known
    from opsctl_lab.machines.settings import Settings

    if known(Settings()):
        sys.stderr.write(lab_cli("down", "--purge"))


def timed_provision(what: str, times: dict, exit_code: int = 0, make_vars: tuple[str, ...] = ()) -> str:
    start = time.monotonic()
    proc = make_provision(make_vars=make_vars)
    times[what] = time.monotonic() - start
    sys.stderr.write("".join(line + "\n" for line in proc.stdout.splitlines() if line.startswith("== provision")))
    assert proc.returncode == exit_code, proc.stdout[-6000:] + proc.stderr[-3000:]
    return proc.stdout


def provision_with_a_machine_stopped(machines: "Machines", stopped: str, times: dict) -> str:
    """One node in 64 is usually down: `make provision` with one GPU machine stopped goes on for the
    others and exits with ansible-playbook's 4 (a host unreachable). Then `lab machines up` starts that
    machine again (the running ones are left as they are), and its slurmd registers: ReturnToService=1
    takes it back even where slurmctld had marked it down meanwhile."""
    from opsctl_lab.machines import nspawn
    from opsctl_lab.machines.settings import Settings

    nspawn.stop(Settings(), stopped)
    # INVENTORY as for a real cluster: without it `make provision` starts the lab machines that are not
    # running first. make exits 2 for any failed recipe line (here ansible-playbook's 4: a host unreachable).
    output = timed_provision(f"with {stopped} stopped", times, exit_code=2, make_vars=("INVENTORY=inventory/lab",))
    lab_cli("up")
    wait_until(lambda: machines.node_state(stopped)[0] == "idle", 120, f"{stopped} back in service")
    return output


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


def clear_faults_and_resume(machines, owned: str) -> None:
    """Clear every GPU machine's faults and resume the drains whose reason starts with `owned`."""
    for name in machines.gpu_nodes:
        lab_cli("clear", name)
        state = machines.drained(name)
        if state and state[1].startswith(owned):
            machines.resume(name)
