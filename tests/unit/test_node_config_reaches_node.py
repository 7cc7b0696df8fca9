"""The head's ladder settings reach the node, and the node check's unit outlasts the node's ladder step.

The node's side of the remediation ladder (`opsctl node check --remediate-self`, opsctl/ladder/node_step.py)
runs on every GPU node with the node's own config, /etc/opsctl/node-check.yaml, which the node_check role
renders; the head's config (the opsctl role's opsctl_config) is where a site sets the ladder. Here the role is
rendered as Ansible renders it on a GPU node (its defaults and vars, the site's variables, the head's
opsctl_config through hostvars of the first controller), with Ansible's own templating, and:
- the node's config carries the head's value of every setting the node's step reads;
- the unit's TimeoutStartSec covers the step's tools, each at the timeout opsctl gives it, at every
  dcgmi diag level;
- a node_check_timeout shorter than that, or a ladder setting given to the node alone, is refused.
"""

import ast
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleError
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import filter_loader
from ansible.template import Templar, trust_as_template

from opsctl.config import parse_config, schema
from opsctl.config.fields import duration_seconds, parse_duration
from opsctl.errors import ConfigError
from opsctl.gpu import tools
from opsctl.ladder import node_step
from opsctl.ladder.node_step import take_step
from tests.unit.fakes import FakeSlurm, node

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "playbooks" / "roles" / "node_check"
LEVELS = (1, 2, 3, 4)
NOW = 1_800_000_000.0
# The sections of the node's config that are the node's own (where its tools are, and the all-reduce's floor on
# its GPUs, as `opsctl node validate` reads them there), not the head's settings.
NODE_OWN_SECTIONS = {"gpu", "validate"}
filter_loader.add_directory(str(ROLE / "filter_plugins"))


def trusted(node_value):
    """YAML as Ansible loads it from a role or an inventory: its strings are templates."""
    if isinstance(node_value, str):
        return trust_as_template(node_value)
    if isinstance(node_value, dict):
        return {key: trusted(value) for key, value in node_value.items()}
    if isinstance(node_value, list):
        return [trusted(value) for value in node_value]
    return node_value


def load(path: Path):
    return trusted(yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def tasks() -> list[dict]:
    return load(ROLE / "tasks" / "main.yml")


def config_task() -> dict:
    return next(task for task in tasks() if task["name"] == "Template the node check config")


def templar(head_config: dict | None = None, **site) -> Templar:
    """The node_check role's variables on gpu001 (precedence: defaults, the inventory, the role's vars, the
    task's vars), the head's opsctl_config set in the controller's group_vars."""
    variables = dict(load(ROLE / "defaults" / "main.yml"))
    variables |= trusted(site)
    variables |= load(ROLE / "vars" / "main.yml")
    variables |= config_task().get("vars", {})
    head = {} if head_config is None else {"opsctl_config": trusted(head_config)}
    variables |= {"inventory_hostname": "gpu001", "groups": {"controller": ["head01"], "gpu_nodes": ["gpu001"]},
                  "hostvars": {"head01": head, "gpu001": {}}, "ansible_managed": "Ansible managed"}
    return Templar(loader=DataLoader(), variables=variables)


def node_config_text(head_config: dict | None = None, **site) -> str:
    return templar(head_config, **site).template(config_task()["ansible.builtin.copy"]["content"])


def node_config(head_config: dict | None = None, **site) -> dict:
    return yaml.safe_load(node_config_text(head_config, **site))


def unit_timeout_s(head_config: dict | None = None, **site) -> float:
    """TimeoutStartSec of the rendered opsctl-node-check.service, in seconds."""
    source = (ROLE / "templates" / "opsctl-node-check.service.j2").read_text()
    unit = templar(head_config, **site).template(trust_as_template(source))
    (value,) = re.findall(r"^TimeoutStartSec=(.+)$", unit, re.MULTILINE)
    return span_seconds(value)


def span_seconds(span: str) -> float:
    """A systemd time span as the unit may spell it (systemd.time(7)): 900, 900s, 15min, 1h 30min."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}
    parts = re.findall(r"(\d+)\s*([a-z]*)", span)
    assert parts and re.fullmatch(r"(\s*\d+\s*[a-z]*)+\s*", span), span
    return sum(int(number) * units[unit] for number, unit in parts)


def head_level(level: int) -> dict:
    """A head's opsctl_config that sets validate_level, with a step_timeout that a step at that level fits."""
    return {"remediation": {"validate_level": level, "step_timeout": "4h"}}


def refusals(head_config: dict | None = None, **site) -> list[str]:
    """The fail_msg of each assert of the role's tasks that refuses these variables."""
    render = templar(head_config, **site)
    failed = []
    for task in tasks():
        check = task.get("ansible.builtin.assert")
        conditions = [check["that"]] if check and isinstance(check["that"], str) else (check or {}).get("that", [])
        if check and not all(render.evaluate_conditional(trust_as_template(that)) for that in conditions):
            failed.append(" ".join(render.template(check["fail_msg"]).split()))
    return failed


def declared_node_settings() -> tuple[str, ...]:
    return getattr(schema, "NODE_LADDER_SETTINGS", ())


def covered(key: str, settings) -> bool:
    """`key` (section.key) is among `settings`, where a section stands for all its keys."""
    return key in settings or key.split(".")[0] in settings


# ---- (a) the head's values are in the node's config -------------------------------------------------------
@pytest.mark.parametrize("level", LEVELS)
def test_defect_7_the_heads_validate_level_is_the_nodes(level):
    """What the site sets on the head (opsctl_config.remediation.validate_level) is in node-check.yaml, and
    opsctl on the node reads it: the node runs `dcgmi diag -r <that level>`."""
    rendered = node_config(head_level(level))
    assert rendered["remediation"]["validate_level"] == level
    assert parse_config(rendered, "node-check.yaml", {}).remediation.validate_level == level


def test_defect_7_the_nodes_config_names_the_ladder_settings_with_the_heads_defaults():
    """With nothing set on the head, node-check.yaml still says which level the node runs (opsctl's
    default, the head's too), and the file is one opsctl's loader takes."""
    rendered = node_config()
    defaults = parse_config({}, "defaults", {})
    assert rendered["remediation"]["validate_level"] == defaults.remediation.validate_level
    assert rendered["safety"]["reason_max_length"] == defaults.safety.reason_max_length
    assert parse_config(rendered, "node-check.yaml", {}).remediation == defaults.remediation


def test_defect_7_the_site_node_settings_stay_beside_the_heads():
    """The node's own settings (node_check_config, here the lab's) are merged as before; the head's ladder
    settings come on top."""
    lab = yaml.safe_load((REPO / "inventory" / "lab" / "group_vars" / "gpu_nodes.yml").read_text())
    rendered = node_config(head_level(3), node_check_config=lab["node_check_config"])
    assert rendered["ib"]["sysfs_root"] == "/var/lib/opsctl-hw/sys" and rendered["storage"]["timeout_seconds"] == 8
    assert rendered["gpu"]["kernel_log_path"] == "/var/lib/opsctl-hw/kmsg"
    assert rendered["remediation"]["validate_level"] == 3


# ---- (b) the node-side keys, from the code, against what the role renders ------------------------------------
def config_reads(module) -> set[str]:
    """Every `config.<section>.<key>` that a module's source reads."""
    reads = set()
    for found in ast.walk(ast.parse(Path(module.__file__).read_text())):
        if (isinstance(found, ast.Attribute) and isinstance(found.value, ast.Attribute)
                and isinstance(found.value.value, ast.Name) and found.value.value.id == "config"):
            reads.add(f"{found.value.attr}.{found.attr}")
    return reads


def test_defect_7_every_head_setting_the_nodes_step_reads_is_declared_and_rendered():
    """The node's step reads remediation.validate_level and safety.reason_max_length (its answer is capped as
    the head caps its requests); opsctl/config declares them once (NODE_LADDER_SETTINGS), the role renders
    that same list, and a value the head gives each reaches the node's config."""
    reads = config_reads(node_step) - {key for key in config_reads(node_step) if key.split(".")[0] in NODE_OWN_SECTIONS}
    assert {"remediation.validate_level", "safety.reason_max_length"} <= reads
    declared = declared_node_settings()
    assert [key for key in sorted(reads) if not covered(key, declared)] == []
    assert list(templar().template(trust_as_template("{{ _node_check_ladder_settings | default([]) }}"))) \
        == list(declared)
    defaults = parse_config({}, "defaults", {})
    for key in sorted(reads):
        section, name = key.split(".")
        value = getattr(getattr(defaults, section), name) + 1  # another valid value than the default
        head: dict = {"remediation": {"step_timeout": "4h"}}
        head.setdefault(section, {})[name] = value
        parse_config(head, "head", {})  # a head config opsctl takes
        assert node_config(head)[section][name] == value, key


def test_defect_7_a_ladder_setting_given_to_the_node_alone_is_refused():
    """node_check_config may not set what the head's config sets for both sides: one value, the head's."""
    (refused,) = refusals(node_check_config={"remediation": {"validate_level": 4}})
    assert "node_check_config" in refused and "opsctl_config" in refused
    assert refusals(node_check_config={"gpu": {"dcgmi": "/usr/bin/dcgmi"}}) == []


# ---- (c) the unit's timeout covers the longest step at every level ------------------------------------------
class RecordedRun:
    """subprocess.run of the node's step: records each tool's timeout; the fabric trains only at the end of the
    wait for it (`ready_s`, on the run's own clock: it is the step's pace), and every diag finds nothing it can
    read (so that the step goes on to nvidia-smi -q and, after a reboot, nvidia-bug-report.sh)."""

    def __init__(self, ready_s: float):
        self.timeouts: list[float] = []
        self.ready_s, self.now = ready_s, 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def monotonic(self) -> float:
        return self.now

    def __call__(self, argv, **kwargs):
        if argv[1].startswith("--query-gpu="):  # the polls of the wait: its bound is the wait's, not theirs
            state = "Completed, Success" if self.now >= self.ready_s else "In Progress, N/A"
            return subprocess.CompletedProcess(argv, 0, f"0, {state}, Enabled\n", "")
        if argv[1] == "is-active":
            return subprocess.CompletedProcess(argv, 0, "active\n" * len(argv[2:]), "")
        self.timeouts.append(kwargs["timeout"])
        return subprocess.CompletedProcess(argv, 0, "Serial Number : 1654922000001\n" if "-q" in argv else "", "")


def longest_step_s(tmp_path: Path, level: int) -> float:
    """The sum of the timeouts of the node's step at `level`, after a reset and after a reboot, whichever
    is longer: each tool as long as opsctl lets it run."""
    longest = 0.0
    for step, state, flags in (("reset", "idle", ("DRAIN",)), ("reboot", "down", ())):
        state_dir = tmp_path / f"{level}-{step}"
        config = parse_config(head_level(level), "t", {"OPSCTL_STATE_DIR": str(state_dir)})
        slurm = FakeSlurm({"gpu007": node("gpu007", state=state, flags=flags,
                                          reason=f"opsctl:{step} gpu2 xid-79 xid=79 count=1")})
        run = RecordedRun(ready_s=float(config.remediation.ready_timeout) - 1)
        take_step(config, slurm, "gpu007", True, "", run=run, now=NOW, pace=run)
        assert len(run.timeouts) >= 3, (step, run.timeouts)  # the diag, nvidia-smi -q and more ran
        longest = max(longest, sum(run.timeouts) + run.now)
    return longest


@pytest.mark.parametrize("level", LEVELS)
def test_defect_7_the_node_check_unit_outlasts_the_longest_step_at_every_level(tmp_path, level):
    """The default unit's TimeoutStartSec is at least the node's step at the head's level (the diag's own
    timeout, which grows with the level, and the tools around it), so systemd never kills a diag that opsctl
    still waits for."""
    step_s = longest_step_s(tmp_path, level)
    assert step_s >= tools.DIAG_TIMEOUT_S[level] + node_step.BUG_REPORT_TIMEOUT_S
    assert tools.node_step_bound_s(level) >= step_s
    # a step over every GPU of an HGX node (a reason may name several: each reset, all checked at once)
    assert unit_timeout_s(head_level(level)) >= max(step_s, tools.node_step_bound_s(level, gpus=8))


def test_defect_7_the_diag_timeout_grows_with_the_level():
    assert [tools.DIAG_TIMEOUT_S[level] for level in LEVELS] == sorted(tools.DIAG_TIMEOUT_S[level] for level in LEVELS)
    assert tools.DIAG_TIMEOUT_S[3] >= 15 * 60 * 2  # DCGM: "approximately 15 minutes"; room for a slow node


def test_defect_7_a_node_check_timeout_shorter_than_the_longest_step_is_refused(tmp_path):
    """A site's node_check_timeout shorter than the step at the head's level stops the role with one line that
    names the variable; a longer one is the unit's timeout as given."""
    (refused,) = refusals(head_level(3), node_check_timeout="15min")
    assert refused.startswith("node_check_timeout:") and "validate_level 3" in refused
    assert refusals(head_level(2), node_check_timeout="3h") == []
    assert unit_timeout_s(head_level(2), node_check_timeout="3h") == 3 * 3600
    assert unit_timeout_s(head_level(3), node_check_timeout="3h") >= longest_step_s(tmp_path, 3)


@pytest.mark.parametrize("level", LEVELS)
def test_defect_7_the_heads_step_timeout_is_refused_shorter_than_the_nodes_step(tmp_path, level):
    """The head takes an unanswered step as failed after remediation.step_timeout: a timeout shorter than the
    node's step at validate_level would reboot a node whose diag still runs. Such a config is refused, naming
    the key; the default step_timeout fits the default level."""
    step_s = longest_step_s(tmp_path, level)
    with pytest.raises(ConfigError, match=r"^config key remediation\.step_timeout: must be at least ") as refused:
        parse_config({"remediation": {"validate_level": level, "step_timeout": int(step_s) - 60}}, "t", {})
    least = parse_duration(str(refused.value).split("must be at least ", 1)[1].split()[0])
    assert least >= step_s and f"validate_level {level}" in str(refused.value)
    fits = parse_config({"remediation": {"validate_level": level, "step_timeout": str(least)}}, "t", {})
    assert fits.remediation.step_timeout == least
    default = parse_config({}, "t", {}).remediation
    assert duration_seconds(default.step_timeout) >= longest_step_s(tmp_path / "default", default.validate_level)


def test_defect_7_the_roles_bounds_are_opsctls():
    """The role's table of diag timeouts and its times of the step's other tools are opsctl's own
    (opsctl/gpu/tools.py), so a timeout raised in opsctl cannot leave the unit shorter."""
    render = templar()

    def value(name: str):
        return render.template(trust_as_template("{{ " + name + " }}"))

    assert {int(level): seconds for level, seconds in value("_node_check_diag_timeout_s").items()} \
        == tools.DIAG_TIMEOUT_S
    gpus, per_gpu, bug_report, runs, ready, reset, nccl = (int(value(name)) for name in (
        "_node_check_step_gpus", "_node_check_gpu_tools_s", "_node_check_bug_report_s", "_node_check_diag_runs",
        "_node_check_ready_s", "_node_check_reset_once_s", "_node_check_nccl_s"))
    assert gpus == 8 and nccl == tools.NCCL_TIMEOUT_S
    assert all(runs * tools.DIAG_TIMEOUT_S[level] + ready + reset + gpus * per_gpu + bug_report + runs * nccl
               == tools.node_step_bound_s(level, gpus) for level in LEVELS)


@pytest.mark.parametrize("span,seconds", [
    ("15min", 900), ("1h 30min", 5400), ("2400", 2400), ("2400s", 2400), ("1h30min", 5400), (" 2 hours ", 7200),
    ("500ms", 0.5), ("1d", 86400), ("infinity", float("inf")),
])
def test_systemd_seconds_reads_the_spans_systemd_takes(span, seconds):
    assert templar(span=span).template(trust_as_template("{{ span | systemd_seconds }}")) == seconds


@pytest.mark.parametrize("span", ["", "15 fortnights", "min", "-5s", "1h x"])
def test_systemd_seconds_refuses_what_is_no_time_span(span):
    with pytest.raises(AnsibleError, match="is not a systemd time span"):
        templar(span=span).template(trust_as_template("{{ span | systemd_seconds }}"))
