"""NVIDIA's XID catalog as opsctl ships it, the action of each code, and the rule families built on it."""

import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml

from opsctl.config import parse_config
from opsctl.errors import ConfigError
from opsctl.health.catalog import load_catalog
from opsctl.health.xid import ACTIONS, DRAIN_ACTIONS, action_of, code_regex, value_filter, xid_catalog

REPO = Path(__file__).resolve().parents[2]
GPUD_COPY = REPO / "tests" / "fixtures" / "gpu" / "gpud_xid_catalog_generated.go.txt"
FAMILIES = ("xid-reset", "xid-reboot", "xid-inspect", "xid-report")


def generator():
    spec = importlib.util.spec_from_file_location("gen_xid_catalog", REPO / "tools" / "gen_xid_catalog.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rules_of(raw=None):
    return {r.id: r for r in load_catalog(parse_config(raw or {}, "t", {}))}


def family_codes(rule) -> set[int]:
    """The codes an XID family's windowed-count selector matches."""
    regex = re.search(r'xid=~"([^"]*)"', rule.expr).group(1)
    return {code for code in range(1, 1000) if re.fullmatch(regex, str(code))}


def test_the_shipped_json_is_the_generator_output_of_the_recorded_source():
    shipped = json.loads((REPO / "opsctl" / "health" / "xid_catalog.json").read_text())
    made = generator().parse(GPUD_COPY.read_text())
    assert made["entries"] == shipped["entries"]
    assert (made["source"], made["read_at"]) == (shipped["source"], shipped["read_at"])
    assert shipped["source"] == "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"


def test_the_generator_refuses_a_file_that_is_not_the_catalog():
    with pytest.raises(SystemExit, match="not a gpud catalog_generated.go"):
        generator().parse("package xid\n")


@pytest.mark.parametrize("code,action", [(79, "reboot"), (46, "reset"), (48, "reset"), (74, "reset"),
                                         (154, "reboot"), (54, "inspect"), (13, "restart_app"), (43, "none"),
                                         (45, "none"), (1, "unused"), (162, "unspecified")])
def test_nvidias_buckets_become_actions(code, action):
    assert xid_catalog().action(code) == action


def test_a_code_outside_the_catalog_has_no_action_and_a_new_bucket_needs_a_person():
    assert xid_catalog().action(999) is None
    assert action_of("SOME_NEW_BUCKET", "Something") == "inspect"


def test_every_code_has_an_action():
    catalog = xid_catalog()
    assert sorted(catalog.entries) == list(range(1, 173))
    assert {entry.action for entry in catalog.entries.values()} <= set(ACTIONS)


def test_the_rules_of_their_own_agree_with_nvidias_catalog():
    catalog = xid_catalog()
    own = [rule for rule in rules_of().values() if rule.xid is not None]
    assert len(own) == 22
    for rule in own:
        assert (rule.action == "drain") == (catalog.action(rule.xid) in DRAIN_ACTIONS), rule.id


def test_families_and_own_rules_give_every_catalog_code_exactly_one_rule():
    rules = rules_of()
    own = {rule.xid for rule in rules.values() if rule.xid is not None}
    seen: dict[int, str] = {code: f"xid-{code}" for code in own}
    for rid in FAMILIES:
        for code in family_codes(rules[rid]) & set(xid_catalog().entries):
            assert code not in seen, f"XID {code} in {rid} and {seen[code]}"
            seen[code] = rid
    assert sorted(seen) == sorted(xid_catalog().entries)
    assert {46, 143, 156, 158} <= family_codes(rules["xid-reset"])
    assert family_codes(rules["xid-reboot"]) & set(xid_catalog().entries) == {151}  # RESTART_VM
    unknown = re.search(r'xid!~"([^"]*)"', rules["xid-unknown"].expr).group(1)
    assert not re.fullmatch(unknown, "999") and re.fullmatch(unknown, "79")


def test_a_disabled_rule_does_not_come_back_through_its_family():
    rules = rules_of({"catalog": {"disable": ["xid-79"]}})
    assert "xid-79" not in rules and 79 not in family_codes(rules["xid-reboot"])
    with pytest.raises(ConfigError, match="no such rule 'xid-46'"):  # a family's code: give it a rule instead
        rules_of({"catalog": {"disable": ["xid-46"]}})


def test_a_site_rule_for_a_code_takes_it_out_of_its_family(tmp_path):
    own = tmp_path / "site.yaml"
    own.write_text(yaml.safe_dump({"rules": [{
        "id": "xid-46", "source": "dcgm", "device_label": "gpu", "xid": 46, "op": ">", "threshold": 0,
        "expr": 'DCGM_EXP_XID_ERRORS_COUNT{job="${dcgm}", xid="46"}', "severity": "warn", "action": "report",
        "description": "Reported only at this site.", "remediation": "None."}]}))
    rules = rules_of({"catalog": {"files": [str(own)]}})
    assert rules["xid-46"].action == "report" and 46 not in family_codes(rules["xid-reset"])


def test_family_rules_take_the_code_from_the_series_and_the_gauge_variant():
    rules = rules_of({"catalog": {"xid_source": "gauge"}})
    family = rules["xid-reset"]
    assert family.xid is None and family.xid_series
    assert "DCGM_EXP_XID_ERRORS_COUNT" not in family.expr and "DCGM_FI_DEV_XID_ERRORS" in family.expr
    assert "== 46" in family.expr and "== 79" not in family.expr


def test_code_selectors_are_short_and_exact():
    assert value_filter("m", [5, 1, 2, 3, 9]) == "(m >= 1 <= 3 or m == 5 or m == 9)"
    assert value_filter("m", []) == "(m == -1)"
    assert code_regex([]) == "-" and code_regex([4, 40]) == "4|40"
