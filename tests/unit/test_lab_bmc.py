"""The lab's BMC (opsctl_lab.bmc) without running it: the emulator's settings, the listener's decisions (which
notice powers which node off or on), the `bmc` section of the lab's opsctl config, and a reboot that hangs
(opsctl_lab.slurm_reboot, `reboot-hang`). tests/component/test_lab_bmc.py runs the real emulator."""

from pathlib import Path

import pytest

from opsctl.config.schema import parse_config
from opsctl_lab import bmc, processes
from opsctl_lab.errors import LabError
from opsctl_lab.hardware import FAULTS, NodeHardware
from opsctl_lab.paths import LabPaths
from opsctl_lab.slurm_reboot import HANG_EXIT, main, reboot_hangs, write_program
from tests.unit.fakes import RecordedPower


def settings(text: str) -> dict:
    """The names a sushy-emulator config file sets, as Flask's from_pyfile reads them."""
    namespace: dict = {}
    exec(compile(text, "emulator.conf", "exec"), namespace)
    return {name: value for name, value in namespace.items() if name.isupper()}


def test_the_emulator_holds_one_powered_on_notifying_system_per_node_addressed_by_its_name():
    text = bmc.emulator_config(["gpu001", "gpu002"], port=16850, notify_url="http://127.0.0.1:16860/",
                               state_dir=Path("/lab/bmc/state"), auth_file=Path("/lab/bmc/htpasswd"))
    assert settings(text) == {
        "SUSHY_EMULATOR_LISTEN_IP": "127.0.0.1",
        "SUSHY_EMULATOR_LISTEN_PORT": 16850,
        "SUSHY_EMULATOR_FAKE_DRIVER": True,
        "SUSHY_EMULATOR_FAKE_SYSTEMS": [
            {"uuid": node, "name": node, "power_state": "On", "external_notifier": True, "nics": []}
            for node in ("gpu001", "gpu002")],
        "EXTERNAL_NOTIFICATION_URL": "http://127.0.0.1:16860/",
        "SUSHY_EMULATOR_STATE_DIR": "/lab/bmc/state",
        "SUSHY_EMULATOR_AUTH_FILE": "/lab/bmc/htpasswd",
    }


def test_the_bmc_listens_on_its_own_ports_moved_by_the_slot(monkeypatch):
    monkeypatch.delenv("OPSCTL_LAB_SLOT", raising=False)
    assert (bmc.url(), bmc.power_url()) == ("http://127.0.0.1:16850", "http://127.0.0.1:16860/")
    monkeypatch.setenv("OPSCTL_LAB_SLOT", "3")
    assert (bmc.url(), bmc.power_url()) == ("http://127.0.0.1:16853", "http://127.0.0.1:16863/")


def notice(node: str, power_state: str, pending: str | None = None) -> dict:
    """What the fake driver PUTs: the system, with its pending action."""
    return {"uuid": node, "name": node, "power_state": power_state, "external_notifier": True, "nics": [],
            "pending_power": {"power_state": pending, "apply_time": 1} if pending else None}


ON_BOTH = {"gpu001": "On", "gpu002": "On"}


@pytest.mark.parametrize("states,sent,change", [
    (ON_BOTH, notice("gpu002", "Off"), ("gpu002", "Off")),
    ({"gpu001": "Off", "gpu002": "On"}, notice("gpu001", "On"), ("gpu001", "On")),
    (ON_BOTH, notice("gpu001", "On", pending="Off"), None),  # ForceOff asked for: nothing happens until applied
    (ON_BOTH, notice("gpu001", "Off", pending="ForceRestart"), ("gpu001", "Off")),  # a restart is Off at once
    (ON_BOTH, notice("gpu001", "On"), None),  # the state it has already
    (ON_BOTH, notice("gpu009", "Off"), None),  # no node of the lab
    (ON_BOTH, notice("gpu001", "Paused"), None),
    (ON_BOTH, ["gpu001", "Off"], None),
])
def test_the_listener_acts_on_a_change_of_a_known_nodes_power_state_only(states, sent, change):
    assert bmc.power_change(states, sent) == change


def test_a_notice_powers_its_node_once_and_a_repeated_one_does_nothing(tmp_path):
    states, power = tmp_path / "power.json", RecordedPower()
    bmc.write_power_states(states, dict(ON_BOTH))
    for sent in (notice("gpu002", "On", pending="Off"), notice("gpu002", "Off"), notice("gpu002", "Off"),
                 notice("gpu002", "Off", pending="On"), notice("gpu002", "On"), notice("gpu002", "On")):
        bmc.apply_notice(states, sent, power)
    assert power.actions == [("Off", "gpu002"), ("On", "gpu002")]
    assert bmc.read_power_states(states) == ON_BOTH


def test_a_failed_node_action_is_not_remembered_so_the_next_notice_tries_again(tmp_path):
    states = tmp_path / "power.json"
    bmc.write_power_states(states, dict(ON_BOTH))

    class Failing(RecordedPower):
        def power_off(self, node: str) -> None:
            raise LabError("slurmd would not die")

    with pytest.raises(LabError):
        bmc.apply_notice(states, notice("gpu001", "Off"), Failing())
    assert bmc.read_power_states(states) == ON_BOTH


def test_node_names_map_back_to_their_index():
    assert [bmc.node_index(node) for node in ("gpu001", "gpu064", "gpu1000")] == [0, 63, 999]
    for bad in ("gpu0", "gpu01", "node001", "gpux"):
        with pytest.raises(LabError):
            bmc.node_index(bad)


def test_the_ladders_bmc_section_names_the_emulator_and_the_password_file_when_it_runs(tmp_path, monkeypatch):
    paths = LabPaths(tmp_path)
    assert bmc.opsctl_config(paths) is None  # no BMC runs: no power rung
    monkeypatch.setattr(processes, "running", lambda run_dir: {"bmc": 4242, "bmc-power": 4243})
    monkeypatch.delenv("OPSCTL_LAB_SLOT", raising=False)
    section = bmc.opsctl_config(paths)
    assert section == {"protocol": "redfish", "url": "http://127.0.0.1:16850", "system": "{node}",
                       "user": "opsctl", "password_file": str(tmp_path / "bmc" / "password")}
    bmc.password_file(paths).parent.mkdir()
    bmc.password_file(paths).write_text("secret\n")
    parsed = parse_config({"bmc": section}, "lab", {}).bmc  # opsctl's own config takes it as written
    assert (parsed.protocol, parsed.url, parsed.system, parsed.user) == ("redfish", "http://127.0.0.1:16850",
                                                                         "{node}", "opsctl")


def test_reboot_hang_is_a_node_fault_that_only_a_power_cycle_ends():
    spec = FAULTS["reboot-hang"]
    assert spec.target == "node" and spec.survives_reset and not spec.survives_reboot
    assert spec.seen_by == ("reboot-timeout",)  # slurmctld's ResumeTimeout, on which the ladder power-cycles
    hw = NodeHardware(node="gpu003")
    hw.inject("reboot-hang")
    assert [f.fault for f in hw.reboot()] == ["reboot-hang"]


def test_a_hanging_reboot_leaves_the_hardware_as_it_was_and_says_so_by_its_exit_status(tmp_path, capsys):
    paths = LabPaths(tmp_path)
    hw = NodeHardware(node="gpu003")
    hw.inject("reboot-hang", now=1000.0)
    hw.inject("xid:79", gpu=2, now=1000.0)
    hw.save(paths.hardware("gpu003"))
    assert reboot_hangs(paths, "gpu003")
    assert main(["hardware", str(tmp_path), "gpu003"]) == HANG_EXIT == 3
    assert "hangs" in capsys.readouterr().out
    after = NodeHardware.load(paths.hardware("gpu003"), "gpu003")
    assert sorted(f.fault for f in after.active) == ["reboot-hang", "xid"] and after.booted == hw.booted


def test_a_reboot_without_the_hang_reboots_the_hardware(tmp_path):
    paths = LabPaths(tmp_path)
    hw = NodeHardware(node="gpu004")
    hw.inject("xid:79", gpu=2, now=1000.0)
    hw.save(paths.hardware("gpu004"))
    assert not reboot_hangs(paths, "gpu004")
    assert main(["hardware", str(tmp_path), "gpu004"]) == 0
    assert NodeHardware.load(paths.hardware("gpu004"), "gpu004").active == []


def test_the_program_leaves_slurmd_down_on_a_hang_and_boots_a_powered_on_node_as_after_a_reboot(tmp_path):
    program = tmp_path / "reboot"
    write_program(program, cluster="the opsctl lab", run_dir="/lab/run", log_dir="/lab/log",
                  slurm_conf="/lab/slurm.conf", hardware=["/venv/bin/python", "-m", "opsctl_lab.slurm_reboot",
                                                          "hardware", "/lab"])
    text = program.read_text()
    assert "\nHANG_EXIT=3\n" in text
    hang = text[text.index('if [ "$status" = "$HANG_EXIT" ]; then'):]
    assert hang.index("exit 0") < hang.index('boot "$node"')  # a hang returns before slurmd starts again
    assert 'if [ "$1" = --boot ]; then\n    boot "$2"\nfi\n' in text
    boot = text[text.index("boot() {"):text.index('if [ "$1" = --boot ]')]
    assert 'pidfile "$RUN_DIR/slurmd.$node.pid"' in boot
    assert 'exec env --default-signal slurmd -D -b -N "$node" -f "$SLURM_CONF"' in boot
