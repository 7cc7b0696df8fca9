"""The BMC clients of the ladder's power cycle over fakes of what they talk to: Redfish's ComputerSystem.Reset
ForceOff, its PowerState polled until Off, On, polled until On (the bodies as DMTF's Redfish schema and
sushy-tools' emulator give them); a BMC that refuses or never changes state is a one-line SourceUnavailable that
never holds the password; IPMI through ipmitool with the password in its file. tests/component/test_lab_bmc.py
talks to the real emulator."""

import subprocess

import pytest

from opsctl.bmc.ipmi import Ipmi
from opsctl.bmc.redfish import Redfish
from opsctl.config import parse_config
from opsctl.errors import SourceUnavailable

SECRET = "s3cret-of-the-bmc"


class Answer:
    def __init__(self, status, body=None):
        self.status_code, self.body = status, body or {}

    def json(self):
        return self.body


class FakeBmcSession:
    """A BMC whose power state follows a reset after `lag` GETs, as a real one applies an action a moment later."""

    def __init__(self, lag=2, status=204, systems=("/redfish/v1/Systems/1",)):
        self.state, self.pending, self.lag, self.status, self.systems = "On", None, lag, status, systems
        self.calls = []

    def request(self, method, url, auth, verify, timeout, json=None):
        self.calls.append((method, url, json, auth))
        if method == "POST":
            self.pending = [{"ForceOff": "Off", "On": "On"}[json["ResetType"]], self.lag]
            return Answer(self.status)
        if url.endswith("/redfish/v1/Systems"):
            return Answer(200, {"Members": [{"@odata.id": s} for s in self.systems]})
        if self.pending:
            self.pending[1] -= 1
            if self.pending[1] <= 0:
                self.state, self.pending = self.pending[0], None
        return Answer(200, {"Id": "1", "PowerState": self.state})


class Clock:
    def __init__(self):
        self.now = 0.0

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def bmc(tmp_path, **over):
    secret = tmp_path / "bmc-password"
    secret.write_text(SECRET + "\n")
    raw = {"protocol": "redfish", "url": "https://{node}-bmc.example", "system": "1", "user": "opsctl",
           "password_file": str(secret), **over}
    return parse_config({"bmc": raw}, "t").bmc


def test_redfish_powers_off_waits_for_off_powers_on_and_waits_for_on(tmp_path):
    session = FakeBmcSession()
    words = Redfish(bmc(tmp_path), session, Clock()).power_cycle("gpu007")
    posts = [(url, body) for method, url, body, _ in session.calls if method == "POST"]
    action = "https://gpu007-bmc.example/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"
    assert posts == [(action, {"ResetType": "ForceOff"}), (action, {"ResetType": "On"})]
    assert words == "BMC power cycle: ForceOff, Off after 2s, On, On after 2s"
    assert session.state == "On" and {auth for *_, auth in session.calls} == {("opsctl", SECRET)}


def test_without_a_system_id_the_bmcs_only_system_is_the_node(tmp_path):
    session = FakeBmcSession(systems=("/redfish/v1/Systems/System.Embedded.1",))
    Redfish(bmc(tmp_path, system=""), session, Clock()).power_cycle("gpu007")
    assert session.calls[1][1].endswith("/redfish/v1/Systems/System.Embedded.1/Actions/ComputerSystem.Reset")
    with pytest.raises(SourceUnavailable, match="2 systems under /redfish/v1/Systems; set bmc.system"):
        Redfish(bmc(tmp_path, system=""), FakeBmcSession(systems=("/a", "/b")), Clock()).power_cycle("gpu007")


def test_a_refusal_or_a_state_that_never_changes_is_one_line_without_the_password(tmp_path):
    with pytest.raises(SourceUnavailable) as refused:
        Redfish(bmc(tmp_path), FakeBmcSession(status=401), Clock()).power_cycle("gpu007")
    assert "HTTP 401" in str(refused.value) and SECRET not in str(refused.value)
    with pytest.raises(SourceUnavailable, match="PowerState On after 120s, not Off"):
        Redfish(bmc(tmp_path), FakeBmcSession(lag=10_000), Clock()).power_cycle("gpu007")


def test_ipmi_cycles_the_chassis_with_the_password_in_its_file(tmp_path):
    seen = []

    def run(argv, **_):
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, "Chassis Power Control: Cycle\n", "")

    config = bmc(tmp_path, protocol="ipmi", url="{node}-bmc", system="")
    assert Ipmi(config, run).power_cycle("gpu007") == "BMC power cycle (IPMI): Chassis Power Control: Cycle"
    assert seen == [["ipmitool", "-I", "lanplus", "-H", "gpu007-bmc", "-U", "opsctl", "-f", config.password_file,
                     "chassis", "power", "cycle"]]
    assert SECRET not in " ".join(seen[0])
    failing = Ipmi(config, lambda argv, **_: subprocess.CompletedProcess(argv, 1, "", "Unable to establish IPMI v2"))
    with pytest.raises(SourceUnavailable, match="ipmitool chassis power cycle exited 1: Unable to establish IPMI v2"):
        failing.power_cycle("gpu007")
