"""Config loading: the lab's minimal file works, every key is checked, errors name the key."""

from pathlib import Path

import pytest
import yaml

from opsctl.config import Config, Duration, load_config, parse_config
from opsctl.config.fields import walk
from opsctl.config.rails import names_of, regex_of
from opsctl.errors import ConfigError, ExitCode
from tests.conftest import REPO

LAB = "prometheus:\n  url: http://127.0.0.1:19090\nslurm:\n  backend: cli\n"


def write(tmp_path, text):
    path = tmp_path / "opsctl.yaml"
    path.write_text(text)
    return str(path)


def test_lab_config_is_accepted(tmp_path):
    config = load_config(write(tmp_path, LAB), env={})
    assert config.prometheus.url == "http://127.0.0.1:19090"
    assert config.slurm.backend == "cli"
    assert str(config.state_dir) == "/var/lib/opsctl" and str(config.audit_log) == "/var/log/opsctl/audit.jsonl"


def test_env_points_at_the_file_and_moves_state(tmp_path):
    path = write(tmp_path, LAB)
    config = load_config(None, env={"OPSCTL_CONFIG": path, "OPSCTL_STATE_DIR": str(tmp_path / "st")})
    assert config.source == path
    assert config.state_dir == tmp_path / "st" and config.audit_log == tmp_path / "st" / "audit.jsonl"


def test_config_keys_move_state(tmp_path):
    config = load_config(write(tmp_path, LAB + f"state_dir: {tmp_path}/s\naudit_log: {tmp_path}/a.jsonl\n"), env={})
    assert (config.state_dir, config.audit_log) == (tmp_path / "s", tmp_path / "a.jsonl")


def test_missing_default_file_means_defaults():
    config = load_config(None, env={})  # /etc/opsctl/config.yaml does not exist on test machines
    assert config.slurm.backend == "cli" and config.safety.max_drains_per_run == 4


def test_missing_explicit_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "nope.yaml"), env={})


@pytest.mark.parametrize("text,key", [
    ("prometheus: {url: ftp://x}", "prometheus.url"),
    ("prometheus: {urll: http://x}", "prometheus.urll"),
    ("prometheus: {timeout_seconds: -1}", "prometheus.timeout_seconds"),
    ("prometheus: {timeout_seconds: yes}", "prometheus.timeout_seconds"),
    ("prometheus: {bearer_token_file: /nonexistent/token}", "prometheus.bearer_token_file"),
    ("prometheus: {basic_auth: {username: a}}", "prometheus.basic_auth"),
    ("prometheus: {basic_auth: {username: a, password: b}}", "prometheus.basic_auth.password"),
    ("prometheus: {jobs: {dcgm: 'a\"b'}}", "prometheus.jobs.dcgm"),
    ("prometheus: {stale_after: soon}", "prometheus.stale_after"),
    ("slurm: {backend: rest}", "slurm.backend"),
    ("catalog: {xid_source: both}", "catalog.xid_source"),
    ("catalog: {files: [/nonexistent.yaml]}", "catalog.files[0]"),
    ("node_mapping: {labels: [node]}", "node_mapping.labels"),
    ("node_mapping: {target_label: 'a b'}", "node_mapping.target_label"),
    ("node_mapping: {exporter_labels: [1]}", "node_mapping.exporter_labels"),
    ("prometheus: {scrape_interval: 0s}", "prometheus.scrape_interval"),
    ("prometheus: {jobs: {dcgm: null}}", "prometheus.jobs.dcgm"),
    ("slurm: {partitions: []}", "slurm.partitions"),
    ("slurm: {partitions: gpu}", "slurm.partitions"),
    ("safety: {max_out_of_service_fraction: 2}", "safety.max_out_of_service_fraction"),
    ("safety: {max_resumes_per_run: -1}", "safety.max_resumes_per_run"),
    ("safety: {max_resumes_per_hour: x}", "safety.max_resumes_per_hour"),
    ("node_mapping: {names: {a: 1}}", "node_mapping.names"),
    ("hardware: {gpus_per_node: 0}", "hardware.gpus_per_node"),
    ("hardware: {ib_devices: 'mlx5_[0-7'}", "hardware.ib_devices"),
    ("safety: {breaker_fraction: 2}", "safety.breaker_fraction"),
    ("safety: {max_drains_per_run: 1.5}", "safety.max_drains_per_run"),
    ("safety: {resume_after: 10 minutes}", "safety.resume_after"),
    ("safety: {reason_max_length: 10}", "safety.reason_max_length"),
    ("safty: {}", "safty"),
    ("prometheus: [1, 2]", "prometheus"),
])
def test_bad_values_name_their_key(tmp_path, text, key):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text), env={})
    assert f"config key {key}:" in str(err.value)
    assert err.value.exit_code == ExitCode.USAGE and "\n" not in str(err.value)


def test_new_keys_and_their_defaults():
    config = parse_config({}, "t", {})
    assert (str(config.prometheus.scrape_interval), config.slurm.partitions, config.catalog.xid_source) == \
        ("30s", None, "auto")
    assert (config.node_mapping.target_label, config.node_mapping.exporter_labels) == ("node", ("Hostname", "hostname"))
    safety = config.safety
    assert (safety.max_resumes_per_run, safety.max_resumes_per_hour, safety.max_out_of_service_fraction) == (4, 8, 0.2)
    config = parse_config({"prometheus": {"jobs": {"node": None}}, "slurm": {"partitions": ["gpu", "h200"]}}, "t", {})
    assert config.prometheus.jobs == {"dcgm": "dcgm"} and config.slurm.partitions == ("gpu", "h200")


def test_invalid_yaml_names_the_line(tmp_path):
    with pytest.raises(ConfigError, match="opsctl.yaml line 2: not valid YAML"):
        load_config(write(tmp_path, "prometheus:\n  url: : : x\n"), env={})


def test_secrets_are_files_and_their_content_is_not_in_the_config(tmp_path):
    (tmp_path / "pw").write_text("hunter2")
    config = parse_config({"prometheus": {"basic_auth": {"username": "ops", "password_file": str(tmp_path / "pw")}}},
                          "t", {})
    assert "hunter2" not in repr(config)


def test_the_defaults_are_written_once_and_config_is_them():
    assert Config() == parse_config({}, env={}) == parse_config(None, "somewhere", {})
    assert parse_config({}, env={}).source == "built-in defaults"


def as_yaml(value):
    """A default as a file would spell it."""
    if isinstance(value, Duration | Path):
        return str(value)
    return list(value) if isinstance(value, tuple) else value


def test_every_attribute_is_named_as_its_yaml_key():
    raw = {}
    for path, default in walk(Config):
        *sections, name = path.split(".")
        node = raw
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = as_yaml(default)
    raw["ib"]["rails"] = "auto"  # the default; a list written out pins the rails (test_rails_auto_or_pinned)
    assert parse_config(raw, env={}) == Config()  # an unknown key would raise; every key read back to its default
    assert {"prometheus.timeout_seconds", "prometheus.connect_timeout_seconds", "prometheus.basic_auth.username",
            "prometheus.jobs", "slurm.timeout_seconds", "ib.rails"} <= {path for path, _ in walk(Config)}


@pytest.mark.parametrize("spelling,seconds,shown", [
    ("90s", 90, "90s"), ("2m", 120, "2m"), (120, 120, "2m"), (7200.0, 7200, "2h"), ("1d", 86400, "1d"),
    (0.5, 0.5, "500ms"), ("0s", 0, "0s"),
])
def test_a_duration_is_stored_one_way_whichever_way_it_is_spelled(spelling, seconds, shown):
    value = parse_config({"prometheus": {"stale_after": spelling}}, env={}).prometheus.stale_after
    assert isinstance(value, Duration) and value == seconds and str(value) == f"{value}" == shown


def test_durations_keep_the_spellings_that_configs_already_use():
    config = parse_config({"prometheus": {"timeout_seconds": 20, "scrape_interval": "15s"},
                           "safety": {"resume_after": "1h"}, "ib": {"window_seconds": 2.5},
                           "storage": {"timeout_seconds": "1m"}}, env={})
    assert (config.prometheus.timeout_seconds, config.prometheus.scrape_interval) == (20, 15)
    assert (config.safety.resume_after, config.ib.window_seconds) == (3600, 2.5)
    assert config.storage.timeout_seconds == 60  # one spelling for every duration key, old and new alike
    assert config.prometheus.timeout_seconds + 1 == 21.0 and f"{config.ib.window_seconds:g}s" == "2.5s"


@pytest.mark.parametrize("raw,message", [
    ({"prometheus": {"timeout_seconds": "soon"}}, "config key prometheus.timeout_seconds: expected a duration such as "
                                                  "30s, 5m, 1h or a number of seconds, got 'soon'"),
    ({"prometheus": {"timeout_seconds": -1}}, "config key prometheus.timeout_seconds: expected a duration such as "
                                              "30s, 5m, 1h or a number of seconds, got -1"),
    ({"hardware": {"gpus_per_node": 0}}, "config key hardware.gpus_per_node: must be 1-64, got 0"),
    ({"safety": {"max_drains_per_run": 1.5}}, "config key safety.max_drains_per_run: expected int, got float 1.5"),
    ({"safety": {"breaker_fraction": True}}, "config key safety.breaker_fraction: expected a number, got True"),
    ({"prometheus": {"url": "ftp://x"}}, "config key prometheus.url: must start with http:// or https://, got 'ftp://x'"),
    ({"slurm": {"timeout": 5}}, "config key slurm.timeout: unknown key (known: backend, partitions, scontrol, sinfo, "
                                "timeout_seconds)"),
    ({"storage": {"mounts": [{"fstype": "nfs4"}]}}, "config key storage.mounts[0].path: is required; it must be an "
                                                    "absolute, normalised path"),
    ({"prometheus": {"jobs": {"dcgm": None}}}, "config key prometheus.jobs.dcgm: must be a job name of letters, "
                                               "digits, _ and -, got null"),
])
def test_an_error_names_the_key_what_is_expected_and_the_value(raw, message):
    with pytest.raises(ConfigError) as err:
        parse_config(raw, env={})
    assert str(err.value) == message


RAILS = ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")


@pytest.mark.parametrize("raw", [
    {"hardware": {"ib_devices": "mlx5_[0-3]"}},
    {"ib": {"rails": list(RAILS)}},
    {"hardware": {"ib_devices": "mlx5_[0-3]"}, "ib": {"rails": list(RAILS)}},
    {"hardware": {"ib_devices": "mlx5_(0|1|2|3)"}, "ib": {"rails": list(RAILS), "slow_gbps": 300}},
])
def test_either_key_of_the_compute_rails_gives_the_one_list(raw):
    config = parse_config(raw, env={})
    assert config.ib.rails == RAILS and config.ib.rails_regex == "mlx5_[0-3]"
    assert not hasattr(config.hardware, "ib_devices")


def test_the_default_rails_are_the_eight_of_an_h200_node():
    assert Config().ib.rails == tuple(f"mlx5_{i}" for i in range(8)) and Config().ib.rails_regex == "mlx5_[0-7]"


@pytest.mark.parametrize("raw,message", [
    ({"hardware": {"ib_devices": "mlx5_[0-7]"}, "ib": {"rails": list(RAILS)}},
     "config key hardware.ib_devices: names mlx5_0, mlx5_1, mlx5_2, mlx5_3, mlx5_4, mlx5_5, mlx5_6, mlx5_7 but "
     "ib.rails lists mlx5_0, mlx5_1, mlx5_2, mlx5_3; give the compute rails once, as ib.rails, got 'mlx5_[0-7]'"),
    ({"hardware": {"ib_devices": "mlx5_.*"}}, "config key hardware.ib_devices: must name a fixed list of HCAs such "
     "as mlx5_[0-7], or give them as ib.rails (here '.' matches without bound), got 'mlx5_.*'"),
    ({"hardware": {"ib_devices": "mlx5_[0-9]+"}}, "(here '+' repeats without bound)"),
    ({"hardware": {"ib_devices": "mlx5 [01]"}}, "config key hardware.ib_devices: names 'mlx5 0', not an HCA name"),
    ({"ib": {"rails": ["mlx5_0", "mlx5_0"]}}, "config key ib.rails: must be a list of distinct HCA names"),
])
def test_two_lists_that_differ_or_a_pattern_without_a_list_is_a_config_error(raw, message):
    with pytest.raises(ConfigError, match="^config key ") as err:
        parse_config(raw, env={})
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("pattern,names", [
    ("mlx5_[0-7]", [f"mlx5_{i}" for i in range(8)]),
    ("mlx5_ib\\d", [f"mlx5_ib{i}" for i in range(10)]),
    ("mlx5_([0-3]|bond_0)", ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_bond_0"]),
    ("(?:ib|roce)[02]{1,2}", ["ib0", "ib2", "ib00", "ib02", "ib20", "ib22", "roce0", "roce2", "roce00", "roce02",
                              "roce20", "roce22"]),
    ("hca\\.[ab]?", ["hca.", "hca.a", "hca.b"]),
])
def test_a_rail_pattern_is_spelled_out_and_back_into_a_regex_that_matches_exactly_its_names(pattern, names):
    assert names_of(pattern) == names
    regex = regex_of(tuple(names))
    assert "\\" not in regex and set(names_of(regex)) == set(names)  # no backslash: it goes into a PromQL string


def doc_block(doc, after):
    return yaml.safe_load((REPO / "docs" / doc).read_text().split(after, 1)[1].split("```yaml", 1)[1].split("```")[0])


def test_the_docs_state_every_key():
    documented = doc_block("health.md", "Every key, with its default:")
    documented["storage"] = doc_block("storage.md", "In opsctl's config")["storage"]
    documented["gpu"] = doc_block("gpu-kernel-log.md", "In opsctl's config")["gpu"]
    missing = []
    for path, _ in walk(Config):
        node = documented
        for name in path.split("."):
            if not isinstance(node, dict) or name not in node:
                missing.append(path)
                break
            node = node[name]
    assert missing == []


def test_the_remediation_section_documents_the_code_defaults():
    documented = doc_block("remediation.md", "In opsctl's config")
    assert parse_config(documented, env={}).remediation == Config().remediation
    assert doc_block("health.md", "Every key, with its default:")["remediation"] == documented["remediation"]
    with pytest.raises(ConfigError, match=r"^config key remediation.validate_level: must be 1-4"):
        parse_config({"remediation": {"validate_level": 5}}, env={})


def test_the_gpu_section_documents_the_code_defaults_and_checks_its_path():
    documented = doc_block("gpu-kernel-log.md", "In opsctl's config")
    assert parse_config(documented, env={}).gpu == Config().gpu
    with pytest.raises(ConfigError, match=r"^config key gpu.kernel_log_path: must be an absolute path, got 'kmsg'$"):
        parse_config({"gpu": {"kernel_log_path": "kmsg"}}, env={})


HGX = tuple(f"mlx5_{i}" for i in range(8))


@pytest.mark.parametrize("raw,pinned,rails", [
    ({}, False, HGX),
    ({"ib": {"rails": "auto"}}, False, HGX),
    ({"ib": {"rails": list(RAILS)}}, True, RAILS),
    ({"ib": {"rails": list(HGX)}}, True, HGX),  # the default names, written out: a pin
    ({"hardware": {"ib_devices": "mlx5_[0-3]"}}, True, RAILS),
])
def test_rails_auto_or_pinned(raw, pinned, rails):
    """ib.rails absent or `auto`: each node's rails are discovered, and the names that the health rules
    use stay the HGX ones; a list (or hardware.ib_devices) pins them."""
    config = parse_config(raw, env={})
    assert (config.ib.rails_pinned, config.ib.rails) == (pinned, rails)


@pytest.mark.parametrize("rails", ["discover", ["mlx5_0", 3], {"auto": True}])
def test_rails_other_than_auto_or_a_list_is_a_config_error(rails):
    with pytest.raises(ConfigError, match=r"^config key ib.rails: must be auto or a list of distinct HCA names"):
        parse_config({"ib": {"rails": rails}}, env={})
