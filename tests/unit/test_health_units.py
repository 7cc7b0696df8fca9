"""Evidence for people: port states by name, rates in Gb/s with the expected rate, clock events as flag
names with the mask, temperatures with units; the raw number stays in the check's value."""

import pytest

from opsctl.config import parse_config
from opsctl.errors import ConfigError
from opsctl.health.catalog import load_catalog
from opsctl.health.units import clock_events, fill
from tests.unit.fakes import World


def rules(raw=None):
    return {r.id: r for r in load_catalog(parse_config(raw or {}, "t", {}))}


@pytest.mark.parametrize("rule,device,value,evidence", [
    ("ib-down", "mlx5_2", 1, "mlx5_2 DOWN (state_id=1)"),
    ("ib-down", "mlx5_2", 2, "mlx5_2 INIT (state_id=2)"),
    ("ib-down", "mlx5_2", 9, "mlx5_2 state 9 (state_id=9)"),
    ("ib-degraded", "mlx5_2", 2.5e10, "mlx5_2 200 Gb/s, expected 400 (rate_bytes=25000000000)"),
    ("ib-degraded", "mlx5_2", 1.25e10, "mlx5_2 100 Gb/s, expected 400 (rate_bytes=12500000000)"),
    ("clocks-hw-slowdown", "gpu5", 8, "gpu5 HW_SLOWDOWN (0x8)"),
    ("clocks-hw-slowdown", "gpu5", 72, "gpu5 HW_SLOWDOWN,HW_THERMAL (0x48)"),
    ("gpu-temp-high", "gpu3", 92, "gpu3 92°C (threshold 87°C)"),
    ("clock-slowdown", "gpu2", 8, "gpu2 hw-slowdown"),
    ("clock-slowdown", "gpu2", 0x88, "gpu2 hw-slowdown,power-brake"),
    ("clock-slowdown", "gpu2", 0x48, "gpu2 hw-slowdown,hw-thermal"),
    ("clock-slowdown", "gpu2", 0x20, "gpu2 sw-thermal"),
    ("pcie-downtrained", "gpu3", 0.5, "gpu3 PCIe link at 50% of its maximum"),
    ("pcie-downtrained", "gpu3", 0.25, "gpu3 PCIe link at 25% of its maximum"),
    ("fabric-not-ready", "gpu2", 2, "gpu2 fabric In Progress"),
    ("fabric-not-ready", "gpu2", 1, "gpu2 fabric Not Started"),
    ("fabric-not-ready", "gpu2", 4, "gpu2 fabric Failure"),
    ("fabric-not-ready", "gpu2", 9, "gpu2 fabric status 9"),
    ("fabric-manager-down", "", 8, "fabric untrained on all 8 GPUs"),
    ("mig-enabled", "gpu4", 1, "gpu4 MIG mode enabled"),
    ("ecc-disabled", "gpu1", 0, "gpu1 ECC mode disabled"),
    ("compute-mode", "gpu2", 2, "gpu2 compute mode Exclusive_Process, not Default"),
    ("nvswitch-fatal", "00000000:06:00.0 sxid 20034", 1, "00000000:06:00.0 sxid 20034 fatal, 1 in its window"),
    ("compute-mode", "gpu2", 1, "gpu2 compute mode Prohibited, not Default"),
    ("compute-mode", "gpu2", 7, "gpu2 compute mode 7, not Default"),
    ("gpu-temp-high", "gpu3", 91.25, "gpu3 91.2°C (threshold 87°C)"),
])
def test_evidence_is_written_for_people(rule, device, value, evidence):
    assert rules()[rule].format_evidence(device, value) == evidence


def test_a_site_that_runs_exclusive_process_expects_it_and_a_default_gpu_breaches():
    rule = rules({"hardware": {"compute_mode": "exclusive-process"}})["compute-mode"]
    assert (rule.threshold, rule.healthy) == (2, 2)
    assert not rule.breaches(2) and rule.breaches(0)
    assert rule.format_evidence("gpu2", 0) == "gpu2 compute mode Default, not Exclusive_Process"
    assert rules()["compute-mode"].breaches(2) and not rules()["compute-mode"].breaches(0)


def test_an_unknown_compute_mode_is_a_one_line_config_error():
    with pytest.raises(ConfigError) as err:
        parse_config({"hardware": {"compute_mode": "exclusive"}}, "t", {})
    assert str(err.value).startswith("config key hardware.compute_mode: must be one of default, prohibited, "
                                     "exclusive-process") and "\n" not in str(err.value)


def test_clock_event_masks_name_every_flag_and_keep_unknown_bits():
    assert clock_events(0x1 | 0x4 | 0x20) == "GPU_IDLE,SW_POWER_CAP,SW_THERMAL (0x25)"
    assert clock_events(0) == "none (0x0)"
    assert clock_events(0x1000 | 0x80) == "HW_POWER_BRAKE,0x1000 (0x1080)"


def test_a_template_without_a_format_shows_the_number_and_unknown_placeholders_stay():
    assert fill("v=${value} t=${threshold} x=${xid}", 0.123456, 5e10) == "v=0.123 t=50000000000 x=${xid}"


def test_an_override_naming_an_unknown_format_is_a_config_error():
    with pytest.raises(ConfigError, match="evidence: unknown format furlongs"):
        rules({"catalog": {"overrides": {"gpu-temp-high": {"evidence": "${value:furlongs}"}}}})


def test_the_json_keeps_the_raw_values(tmp_path):
    w = World(tmp_path)
    w.prom.breach("ib-degraded", "gpu040", "mlx5_2", 2.5e10)
    _, nodes, _ = w.json()
    [check] = [c for c in nodes["gpu040"]["checks"] if c["id"] == "ib-degraded"]
    assert (check["value"], check["threshold"], check["hca"]) == (25000000000, 50000000000, "mlx5_2")
    assert check["evidence"] == "mlx5_2 200 Gb/s, expected 400 (rate_bytes=25000000000)"
