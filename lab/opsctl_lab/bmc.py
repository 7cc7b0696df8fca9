"""The lab's BMC: a real Redfish service, OpenStack's sushy-emulator (sushy-tools) with its fake driver, that
holds one ComputerSystem per lab node, and the listener that turns its power changes into what power does to
the node.

sushy-emulator's fake driver keeps each system's power state and takes a power action (Systems/<id>/Actions/
ComputerSystem.Reset) as pending, applied 1 to 11 s later on the next GET of that system; each change it PUTs,
as the system's JSON (`power_state`, `pending_power`), to EXTERNAL_NOTIFICATION_URL: this module's listener. It
knows no `PowerCycle`: a client powers a node off (ForceOff, GracefulShutdown), waits for Off, powers it on
(On, ForceOn) and waits for On; ForceRestart and GracefulRestart read Off at once and On once applied.

What power does to a node (LabNodes):
  Off  its slurmd (and a reboot under way) is killed, as a power loss kills it (SIGKILL), and its node_exporter
       stops: the node's exporters stop answering.
  On   (from Off) the node boots: its emulated hardware reboots (slurm_reboot.reboot_hardware, which ends the
       faults a reboot ends, `reboot-hang` among them), its node_exporter starts (unless `exporter-down`), and
       its slurmd starts with -b through the RebootProgram's `--boot NODE`, as after a reboot.

A system's id is the node's name (the fake driver takes any string for `uuid`): /redfish/v1/Systems/gpu001.
Its user is `opsctl`, with a password made at each fresh `opsctl lab up` (<lab>/bmc/password, mode 0600); the
emulator accepts only bcrypt hashes in its htpasswd file. Each fresh start powers every system on, as the lab
starts every node.

    python -m opsctl_lab.bmc listen LAB_DIR    # the listener, as `opsctl lab up` starts it
"""

import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Protocol

import requests

from opsctl.fileio import write_atomic
from opsctl_lab import paths as lp
from opsctl_lab import processes, prometheus_lab, slurm_lab, slurm_reboot
from opsctl_lab.errors import LabError
from opsctl_lab.hardware import NodeHardware

EMULATOR = "sushy-emulator"
USER = "opsctl"
ON, OFF = "On", "Off"
# The lab processes, as `opsctl lab status` and the PID files name them.
EMULATOR_PROCESS = "bmc"
LISTENER_PROCESS = "bmc-power"
READY_TIMEOUT_S = 30.0
# How long a killed slurmd may take to be gone (SIGKILL cannot be caught).
KILL_WAIT_S = 5.0

LOG = logging.getLogger("opsctl_lab.bmc")


def url() -> str:
    return f"http://127.0.0.1:{lp.bmc_port()}"


def power_url() -> str:
    return f"http://127.0.0.1:{lp.bmc_power_port()}/"


def config_file(paths: lp.LabPaths) -> Path:
    return paths.bmc / "emulator.conf"


def password_file(paths: lp.LabPaths) -> Path:
    return paths.bmc / "password"


def htpasswd_file(paths: lp.LabPaths) -> Path:
    return paths.bmc / "htpasswd"


def power_states_file(paths: lp.LabPaths) -> Path:
    """node -> On or Off, as the listener last applied it."""
    return paths.bmc / "power.json"


def emulator_program() -> str | None:
    """sushy-emulator of the Python that runs the lab (its virtualenv's), else the one on PATH."""
    beside = Path(sys.executable).parent / EMULATOR
    return str(beside) if beside.is_file() else shutil.which(EMULATOR)


# ---- the emulator's settings ----------------------------------------------------------------------------------
def fake_system(node: str) -> dict[str, object]:
    """The node's system for the fake driver: addressed by its name, powered on, every change notified."""
    return {"uuid": node, "name": node, "power_state": ON, "external_notifier": True, "nics": []}


def emulator_config(nodes: list[str], *, port: int, notify_url: str, state_dir: Path, auth_file: Path) -> str:
    """sushy-emulator's --config: a Python file of its settings (doc/source/admin/emulator.conf)."""
    settings: dict[str, object] = {
        "SUSHY_EMULATOR_LISTEN_IP": "127.0.0.1",
        "SUSHY_EMULATOR_LISTEN_PORT": port,
        "SUSHY_EMULATOR_FAKE_DRIVER": True,
        "SUSHY_EMULATOR_FAKE_SYSTEMS": [fake_system(node) for node in nodes],
        "EXTERNAL_NOTIFICATION_URL": notify_url,
        # The fake driver's systems live in <state dir>/fakedriver.sqlite, not in the shared /tmp/sushy-emulator.
        "SUSHY_EMULATOR_STATE_DIR": str(state_dir),
        "SUSHY_EMULATOR_AUTH_FILE": str(auth_file),
    }
    header = "# sushy-emulator's settings for the opsctl lab's BMC (opsctl_lab.bmc)\n"
    return header + "".join(f"{name} = {value!r}\n" for name, value in settings.items())


def write_credentials(paths: lp.LabPaths, password: str) -> None:
    """The password for the ladder (password_file) and its bcrypt hash for the emulator (htpasswd_file)."""
    import bcrypt  # sushy-tools' own dependency: there when the emulator is

    paths.bmc.mkdir(parents=True, exist_ok=True)
    write_atomic(password_file(paths), password + "\n", mode=0o600)  # only its owner reads it, from its creation
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt()).decode()
    write_atomic(htpasswd_file(paths), f"{USER}:{hashed}\n", mode=0o600)


def prepare(paths: lp.LabPaths, nodes: list[str], port: int, notify_url: str) -> None:
    """A fresh BMC: a new password, every system powered on (no state of an earlier lab), its settings."""
    shutil.rmtree(paths.bmc, ignore_errors=True)
    (paths.bmc / "state").mkdir(parents=True)
    write_credentials(paths, secrets.token_urlsafe(24))
    write_power_states(power_states_file(paths), dict.fromkeys(nodes, ON))
    config_file(paths).write_text(emulator_config(nodes, port=port, notify_url=notify_url,
                                                  state_dir=paths.bmc / "state", auth_file=htpasswd_file(paths)))


# ---- the lab's processes ------------------------------------------------------------------------------------
def start(paths: lp.LabPaths, nodes: int) -> str | None:
    """Start the listener and then the emulator (which notifies the listener, and fails a request it cannot
    notify) unless they run; returns why the lab has no BMC, None when it has one."""
    program = emulator_program()
    if program is None:
        return f"{EMULATOR} is not installed (pip install 'opsctl[lab-bmc]')"
    names = [lp.node_name(index) for index in range(nodes)]
    if EMULATOR_PROCESS not in processes.running(paths.run):
        prepare(paths, names, lp.bmc_port(), power_url())
    processes.start(LISTENER_PROCESS, [sys.executable, "-m", "opsctl_lab.bmc", "listen", str(paths.root)],
                    paths.run, paths.logs, env=prometheus_lab.python_env())
    processes.start(EMULATOR_PROCESS, [program, "--config", str(config_file(paths))], paths.run, paths.logs)
    wait_ready(url(), READY_TIMEOUT_S)
    return None


def wait_ready(base_url: str, timeout: float) -> None:
    """The service root answers (it needs no credentials)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{base_url}/redfish/v1/", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise LabError(f"the BMC ({EMULATOR}) did not answer at {base_url} within {timeout:.0f} s")


def opsctl_config(paths: lp.LabPaths) -> dict[str, str] | None:
    """The `bmc` section of the lab's opsctl config (the remediation ladder's power rung); None without a BMC."""
    if EMULATOR_PROCESS not in processes.running(paths.run):
        return None
    return {"protocol": "redfish", "url": url(), "system": "{node}", "user": USER,
            "password_file": str(password_file(paths))}


# ---- the listener ------------------------------------------------------------------------------------------
class NodePower(Protocol):
    """What power does to a node."""

    def power_off(self, node: str) -> None: ...

    def power_on(self, node: str) -> None: ...


def read_power_states(path: Path) -> dict[str, str]:
    states: dict[str, str] = json.loads(path.read_text())
    return states


def write_power_states(path: Path, states: dict[str, str]) -> None:
    path.with_suffix(".tmp").write_text(json.dumps(states, indent=1, sort_keys=True))
    path.with_suffix(".tmp").replace(path)


def power_change(states: dict[str, str], notice: object) -> tuple[str, str] | None:
    """(node, On or Off) when the emulator's notice changes a known node's power state; None for a notice of a
    pending action, a repeated one, or one about no node of the lab."""
    if not isinstance(notice, dict):
        return None
    node, state = notice.get("name"), notice.get("power_state")
    if not isinstance(node, str) or node not in states or state not in (ON, OFF) or states[node] == state:
        return None
    return node, str(state)


def apply_notice(states_file: Path, notice: object, power: NodePower) -> tuple[str, str] | None:
    """Apply the power change the notice makes, if any, and remember it; returns it."""
    states = read_power_states(states_file)
    change = power_change(states, notice)
    if change is None:
        return None
    node, state = change
    LOG.info("%s: power %s", node, state)
    if state == OFF:
        power.power_off(node)
    else:
        power.power_on(node)
    states[node] = state
    write_power_states(states_file, states)
    return change


def listener(address: tuple[str, int], states_file: Path, power: NodePower) -> HTTPServer:
    """The HTTP server the emulator PUTs its notices to. One request at a time: a node's changes stay in order."""

    class Notices(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                apply_notice(states_file, json.loads(body), power)
            except ValueError:
                self.send_error(400, "not JSON")
                return
            except Exception as err:  # a failed node action: said in the log and to the emulator's
                LOG.exception("applying %s failed", body[:200])
                self.send_error(500, str(err))
                return
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass  # the emulator logs each request; this log holds the actions

    return HTTPServer(address, Notices)


def node_index(node: str) -> int:
    """gpu001 -> 0 (lp.node_name's inverse)."""
    index = int(node.removeprefix("gpu")) - 1 if node.removeprefix("gpu").isdigit() else -1
    if index < 0 or lp.node_name(index) != node:
        raise LabError(f"{node!r} is no lab node name")
    return index


class LabNodes:
    """What power does to the lab's nodes (this module's docstring)."""

    def __init__(self, paths: lp.LabPaths) -> None:
        self.paths = paths
        self.booting: list[subprocess.Popen[bytes]] = []  # slurmds started here, reaped once they end

    def power_off(self, node: str) -> None:
        for name in (f"reboot.{node}", f"slurmd.{node}"):
            pid = kill(name, self.paths.run)
            if pid is not None:
                LOG.info("%s: %s (pid %d) killed", node, name.split(".")[0], pid)
        processes.stop(f"node_exporter.{node}", self.paths.run)
        self.reap()

    def power_on(self, node: str) -> None:
        index = node_index(node)
        ended = slurm_reboot.reboot_hardware(self.paths, node)
        LOG.info("%s: emulated hardware booted; faults ended: %s", node, ", ".join(ended) or "none")
        if not NodeHardware.load(self.paths.hardware(node), node).node_fault("exporter-down"):
            prometheus_lab.start_node_exporter(self.paths, index)
        if processes.read_pidfile(self.paths.run / f"slurmd.{node}.pid") is None:
            self.booting.append(boot_slurmd(self.paths, node))
            LOG.info("%s: slurmd -b started (pid %d)", node, self.booting[-1].pid)
        self.reap()

    def reap(self) -> None:
        self.booting = [proc for proc in self.booting if proc.poll() is None]


def kill(name: str, run_dir: Path) -> int | None:
    """SIGKILL the lab process `name` (its process group when it leads one) and forget it; returns its PID."""
    pidfile = run_dir / f"{name}.pid"
    pid = processes.read_pidfile(pidfile)
    if pid is not None:
        started = processes.start_time(pid)
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + KILL_WAIT_S
        while processes.alive(pid, started) and time.monotonic() < deadline:
            time.sleep(0.05)
    pidfile.unlink(missing_ok=True)
    return pid


def boot_slurmd(paths: lp.LabPaths, node: str) -> subprocess.Popen[bytes]:
    """The node's slurmd, started with -b by the RebootProgram's `--boot` (which writes its PID file), in a
    session of its own, logging where the node's slurmd logs."""
    with open(paths.logs / f"slurmd.{node}.log", "ab") as log:
        return subprocess.Popen([str(slurm_lab.reboot_program(paths)), "--boot", node], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "listen":
        sys.stderr.write("usage: python -m opsctl_lab.bmc listen LAB_DIR\n")
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    paths = lp.LabPaths(Path(argv[1]))
    server = listener(("127.0.0.1", lp.bmc_power_port()), power_states_file(paths), LabNodes(paths))
    LOG.info("listening for the BMC's power changes on %s", power_url())
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
