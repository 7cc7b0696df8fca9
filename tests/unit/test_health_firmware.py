"""firmware-drift: what hardware.firmware accepts, and what a pin changes in the rule (the PromQL itself runs
on real Prometheus and VictoriaMetrics in tests/component/test_health_evaluate.py and promtool)."""

import pytest

from opsctl.config import parse_config
from opsctl.config.schema import FIRMWARE_COMPONENTS
from opsctl.errors import ConfigError
from opsctl.health import firmware
from opsctl.health.catalog import load_catalog


def drift_rule(raw: dict):
    return next(r for r in load_catalog(parse_config(raw, "t", {})) if r.id == firmware.RULE)


def test_the_config_knows_the_components_the_rule_compares():
    assert set(FIRMWARE_COMPONENTS) == set(firmware.COMPONENTS)


def fleet_rule(raw: dict):
    return next(r for r in load_catalog(parse_config(raw, "t", {})) if r.id == "version-drift")


def test_hca_firmware_and_the_driver_are_read_where_their_exporters_show_them():
    """Each HCA's firmware from node_exporter's node_infiniband_info, against its type; the driver from
    dcgm-exporter's label, folded into one series per node, and the OFED release from the node check's
    textfile, each compared across the fleet."""
    expr = fleet_rule({}).expr
    assert 'node_infiniband_info{job="node", firmware_version!=""}' in expr
    assert "count by (hca_type, firmware_version)" in expr and "on(hca_type) group_left" in expr
    assert 'max by (node, job, instance, DCGM_FI_DRIVER_VERSION) (DCGM_FI_DEV_GPU_TEMP{job="dcgm", ' in expr
    assert "topk (1, count by (DCGM_FI_DRIVER_VERSION) (max by" in expr and "on() group_left" in expr
    assert 'topk (1, count by (version) (opsctl_node_ofed_info{job="node", version!=""}))' in expr


def test_a_gpu_pin_never_makes_a_rollout_minority_drain():
    """A half-done HCA firmware or driver rollout is a minority by design: version-drift warns whatever
    hardware.firmware pins, and reads no pin."""
    rule = fleet_rule({"hardware": {"firmware": {"vbios": "96.00.A5.00.03"}}})
    assert (rule.severity, rule.action) == ("warn", "report")
    assert '"basis", "pinned"' not in rule.expr and "VBIOS" not in rule.expr


def test_without_a_pin_it_warns_against_the_fleets_majority():
    rule = drift_rule({})
    assert (rule.severity, rule.action, rule.device_label) == ("warn", "report", "firmware")
    assert '"basis", "most run"' in rule.expr and "pinned" not in rule.expr


def test_a_pin_compares_its_component_with_the_pin_and_drains():
    rule = drift_rule({"hardware": {"firmware": {"vbios": "96.00.A5.00.03"}}})
    assert (rule.severity, rule.action, rule.auto_resume) == ("fail", "drain", True)
    assert '"DCGM_FI_DEV_VBIOS_VERSION", "96.00.A5.00.03"' in rule.expr
    # the component without a pin still goes by the majority
    assert rule.expr.count('"basis", "most run"') == 2 and rule.expr.count('"basis", "pinned"') == 2


def test_a_sites_override_wins_over_what_a_pin_sets():
    rule = drift_rule({"hardware": {"firmware": {"vbios": "96.00.A5.00.03"}},
                       "catalog": {"overrides": {"firmware-drift": {"action": "report", "severity": "warn"}}}})
    assert (rule.severity, rule.action) == ("warn", "report")


def test_the_rule_holds_by_itself_and_stays_short_enough_for_victoria_metrics():
    """VictoriaMetrics refuses a query over 16 KiB (-search.maxQueryLen): the judged query, pinned, with long
    job names, stays well under it; version-drift too."""
    raw = {"hardware": {"firmware": {"vbios": "96.00.A5.00.03", "inforom": "G520.0280.02.02"}},
           "prometheus": {"jobs": {"dcgm": "kubernetes-dcgm-exporter-pods", "node": "kubernetes-node-exporter"}}}
    rule = drift_rule(raw)
    assert not rule.plot_expr and f"offset {rule.hold})" in rule.expr
    assert len(rule.judged_expr()) < 8192
    assert len(fleet_rule(raw).judged_expr()) < 8192


@pytest.mark.parametrize("pins,message", [
    ({"bios": "1.0"}, "config key hardware.firmware.bios: is not a component opsctl compares"),
    ({"vbios": '96"00'}, "config key hardware.firmware.vbios: must be a version of letters, digits"),
    ({"vbios": 96}, "config key hardware.firmware.vbios: must be a version"),
    (["vbios"], "config key hardware.firmware: must map components (vbios, inforom) to versions"),
])
def test_a_bad_pin_is_a_one_line_error_naming_its_key(pins, message):
    with pytest.raises(ConfigError) as err:
        parse_config({"hardware": {"firmware": pins}}, "t", {})
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
