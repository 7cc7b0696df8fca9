"""docs/health.md is the one place that states every config key with its default and every shipped
rule: these tests keep it true to the code."""

import re

import click
import yaml

from opsctl.cli import main
from opsctl.config import parse_config
from opsctl.health.catalog import load_catalog
from tests.conftest import REPO

DOC = (REPO / "docs" / "health.md").read_text()


def test_every_config_key_in_the_doc_is_known_and_its_default_is_the_code_default():
    block = DOC.split("Every key, with its default:", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    documented = parse_config(yaml.safe_load(block), "docs/health.md", {})  # an unknown key raises
    defaults = parse_config({}, "docs/health.md", {})
    assert documented == defaults


def test_every_shipped_rule_is_in_the_catalog_table():
    table = DOC.split("## The rule catalog", 1)[1].split("### Rule fields", 1)[0]
    for rule in load_catalog(parse_config({}, "t", {})):
        if rule.xid is not None:
            row = next(line for line in table.splitlines() if line.startswith("| `xid-") and f" {rule.xid} " in
                       line.replace("`xid-", "` ").replace("`", " "))
            assert f"{rule.severity} / {rule.action}" in row, rule.id
        else:
            row = next(line for line in table.splitlines() if line.startswith(f"| `{rule.id}` |"))
            assert f"{rule.severity} / {rule.action}" in row, rule.id
            resume = "auto" if rule.auto_resume else "person"
            assert re.search(rf"\| ({resume}|-) / ({rule.memory if rule.memory != 'none' else '-'}) \|", row), rule.id


def test_the_synopsis_names_every_option_of_opsctl_health():
    synopsis = DOC.split("## Commands", 1)[1].split("```", 2)[1]
    health = main.get_command(click.Context(main), "health")
    options = [opt for param in health.params for opt in param.opts if opt.startswith("--") and opt != "--help"]
    assert "--changes-only" in options
    assert [opt for opt in options if f"[{opt}" not in synopsis] == []
