"""Config loading: the lab's minimal file works, every key is checked, errors name the key."""

import pytest

from opsctl.config import load_config, parse_config
from opsctl.errors import ConfigError, ExitCode

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
    assert (config.prometheus.scrape_interval, config.slurm.partitions, config.catalog.xid_source) == ("30s", None,
                                                                                                      "auto")
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
