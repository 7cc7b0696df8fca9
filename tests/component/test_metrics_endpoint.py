"""`opsctl health --watch` serves its metrics on metrics.listen_address: an address it cannot bind is a
config error, before any run. That the lab's Prometheus scrapes the served metrics is tested in
tests/integration/lab/test_dashboard_lab.py."""

import socket

import yaml

from tests.conftest import opsctl


def test_an_address_in_use_is_a_config_error_naming_the_key(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = tmp_path / "opsctl.yaml"
        config.write_text(yaml.safe_dump({"prometheus": {"url": "http://127.0.0.1:9"},
                                          "metrics": {"listen_address": f"127.0.0.1:{taken.getsockname()[1]}"}}))
        proc = opsctl("health", "--watch", "5", "--config", str(config), check=False, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("opsctl: error: config key metrics.listen_address: cannot listen on 127.0.0.1:")
    assert len(proc.stderr.strip().splitlines()) == 1
