"""The lab's BMC (opsctl_lab.bmc): the real sushy-emulator, run with the settings and credentials the lab writes,
answers a Redfish client with basic auth, and each power change it applies reaches the lab's power listener,
whose node actions a test double records here instead of killing and starting slurmds."""

import socket
import subprocess
import threading
import time

import pytest
import requests

from opsctl_lab import bmc
from opsctl_lab.paths import LabPaths
from tests.unit.fakes import RecordedPower

NODES = ["gpu001", "gpu002"]
POLL_S = 20.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def lab_bmc(tmp_path):
    """The emulator and the listener as `opsctl lab up` prepares them, in tmp_path: (its URL, the password, the
    recorded node actions)."""
    paths = LabPaths(tmp_path)
    power = RecordedPower()
    server = bmc.listener(("127.0.0.1", 0), bmc.power_states_file(paths), power)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = free_port()
    bmc.prepare(paths, NODES, port, f"http://127.0.0.1:{server.server_address[1]}/")
    log = open(tmp_path / "bmc.log", "wb")
    proc = subprocess.Popen([bmc.emulator_program(), "--config", str(bmc.config_file(paths))],
                            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        bmc.wait_ready(base, 30)
        yield base, bmc.password_file(paths).read_text().strip(), power
    finally:
        proc.terminate()
        proc.wait(10)
        server.shutdown()
        server.server_close()
        log.close()


def power_state(base, node, auth):
    answer = requests.get(f"{base}/redfish/v1/Systems/{node}", auth=auth, timeout=5)
    answer.raise_for_status()
    return answer.json()["PowerState"]


def reset(base, node, auth, reset_type):
    answer = requests.post(f"{base}/redfish/v1/Systems/{node}/Actions/ComputerSystem.Reset",
                           json={"ResetType": reset_type}, auth=auth, timeout=5)
    assert answer.status_code in (200, 202, 204), answer.text


def poll_until(base, node, auth, state):
    """GET the system (which applies a pending action once due) until it reads `state`, within POLL_S."""
    deadline = time.monotonic() + POLL_S
    while time.monotonic() < deadline:
        if power_state(base, node, auth) == state:
            return
        time.sleep(0.5)
    raise AssertionError(f"{node} not {state} within {POLL_S:.0f} s")


def test_the_credentials_are_private_and_only_the_right_password_gets_in(lab_bmc, tmp_path):
    base, password, _ = lab_bmc
    assert bmc.password_file(LabPaths(tmp_path)).stat().st_mode & 0o777 == 0o600
    assert power_state(base, "gpu001", (bmc.USER, password)) == "On"
    assert requests.get(f"{base}/redfish/v1/Systems/gpu001", auth=(bmc.USER, "wrong"), timeout=5).status_code == 401
    assert requests.get(f"{base}/redfish/v1/Systems/gpu001", timeout=5).status_code == 401
    systems = requests.get(f"{base}/redfish/v1/Systems", auth=(bmc.USER, password), timeout=5).json()
    assert sorted(member["@odata.id"] for member in systems["Members"]) == [
        f"/redfish/v1/Systems/{node}" for node in NODES]


def test_a_power_off_and_on_reach_the_listener_for_that_node_only(lab_bmc):
    base, password, power = lab_bmc
    auth = (bmc.USER, password)
    reset(base, "gpu002", auth, "ForceOff")
    poll_until(base, "gpu002", auth, "Off")
    assert power.actions == [("Off", "gpu002")]
    assert power_state(base, "gpu001", auth) == "On"
    reset(base, "gpu002", auth, "On")
    poll_until(base, "gpu002", auth, "On")
    assert power.actions == [("Off", "gpu002"), ("On", "gpu002")]


def test_a_restart_powers_the_node_off_at_once_and_on_when_applied(lab_bmc):
    base, password, power = lab_bmc
    auth = (bmc.USER, password)
    reset(base, "gpu001", auth, "ForceRestart")
    assert power.actions == [("Off", "gpu001")]
    poll_until(base, "gpu001", auth, "On")
    assert power.actions == [("Off", "gpu001"), ("On", "gpu001")]


def test_the_emulator_knows_no_power_cycle(lab_bmc):
    """So the ladder's client powers off, waits for Off, powers on and waits for On."""
    base, password, power = lab_bmc
    answer = requests.post(f"{base}/redfish/v1/Systems/gpu001/Actions/ComputerSystem.Reset",
                           json={"ResetType": "PowerCycle"}, auth=(bmc.USER, password), timeout=5)
    assert answer.status_code >= 400 and power.actions == []

