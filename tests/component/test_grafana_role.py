"""The grafana role as the lab runs it (no Grafana package: grafana_install_packages false), on this
machine with every path in a temporary directory: it says in one line that Grafana is not installed,
renders and checks the datasource, the dashboard provider, grafana.ini and the dashboards, keeps the
admin password in a file of mode 0600 and out of Ansible's output, and fails without a password."""

import json
import os
import secrets
import subprocess

import pytest
import yaml

from tests.component.test_slurm_render import BIN, PLAYBOOKS, REPO, ROLES, lab_inventory

CHECKER = ROLES / "grafana" / "files" / "opsctl-grafana-check"


def run_role(tmp, **extra) -> subprocess.CompletedProcess:
    playbook = tmp / "grafana.yml"
    playbook.write_text(yaml.safe_dump([{"name": "Grafana", "hosts": "head", "gather_facts": False,
                                         "roles": [{"role": "grafana"}]}]))
    paths = {"grafana_config_dir": tmp / "etc", "grafana_provisioning_dir": tmp / "etc" / "provisioning",
             "grafana_dashboards_dir": tmp / "dashboards", "grafana_checker": tmp / "opsctl-grafana-check",
             "grafana_render_dir": tmp / "render"}
    variables = {"ansible_become": False, "ansible_connection": "local",
                 "ansible_python_interpreter": "/usr/bin/python3", **{k: str(v) for k, v in paths.items()}, **extra}
    env = {**os.environ, "ANSIBLE_CONFIG": str(PLAYBOOKS / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROLES),
           "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(lab_inventory(tmp)), str(playbook), "--diff",
                           "-e", json.dumps(variables)], capture_output=True, text=True, timeout=300, env=env,
                          cwd=REPO)


@pytest.fixture(scope="module")
def provisioned(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grafana")
    password = secrets.token_hex(12)
    proc = run_role(tmp, grafana_admin_password=password)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return {"tmp": tmp, "password": password, "output": proc.stdout + proc.stderr}


def test_says_in_one_line_that_grafana_is_not_installed(provisioned):
    lines = [line for line in provisioned["output"].splitlines() if "Grafana is not installed" in line]
    assert len(lines) == 1, provisioned["output"][-3000:]


def test_renders_and_checks_the_provisioning_files(provisioned):
    tmp = provisioned["tmp"]
    datasources = json.loads((tmp / "etc" / "provisioning" / "datasources" / "opsctl.yaml").read_text())
    assert datasources["datasources"][0]["url"] == "http://10.213.0.10:9090"
    assert datasources["datasources"][0]["jsonData"]["timeInterval"] == "5s"  # the lab's scrape interval
    providers = json.loads((tmp / "etc" / "provisioning" / "dashboards" / "opsctl.yaml").read_text())
    assert providers["providers"][0]["options"]["path"] == str(tmp / "dashboards")
    shipped = sorted(p.name for p in (REPO / "dashboards").glob("*.json"))
    assert sorted(p.name for p in (tmp / "dashboards").glob("*.json")) == shipped
    # The lab's config is the default one: its dashboards are the shipped ones.
    assert all((tmp / "dashboards" / name).read_text() == (REPO / "dashboards" / name).read_text() for name in shipped)
    ini = (tmp / "etc" / "grafana.ini").read_text()
    assert f"admin_password = $__file{{{tmp / 'etc' / 'admin-password'}}}" in ini
    assert "[auth.anonymous]\nenabled = false" in ini and "allow_sign_up = false" in ini


def test_the_admin_password_is_in_a_0600_file_and_never_in_the_output(provisioned):
    path = provisioned["tmp"] / "etc" / "admin-password"
    assert path.read_text() == provisioned["password"]
    assert path.stat().st_mode & 0o777 == 0o600
    assert provisioned["password"] not in provisioned["output"]


def test_no_password_fails_naming_the_variable(tmp_path):
    (tmp_path / "none").mkdir()
    (tmp_path / "short").mkdir()
    proc = run_role(tmp_path / "none", grafana_admin_password=None)
    assert proc.returncode != 0
    assert "grafana_admin_password" in proc.stdout
    short = run_role(tmp_path / "short", grafana_admin_password="admin")
    assert short.returncode != 0 and "12 characters" in short.stdout


@pytest.mark.parametrize("kind, content, problem", [
    ("dashboard", {"uid": "x", "title": "t", "schemaVersion": 41,
                   "panels": [{"id": 1, "datasource": {"type": "prometheus", "uid": "P1809F7CD0C75ACF3"}}]},
     "datasource named by uid 'P1809F7CD0C75ACF3'"),
    ("dashboard", {"uid": "x", "title": "t", "panels": []}, "schemaVersion"),
    ("ini", "[security]\nadmin_password = hunter2hunter2\n", "must be read from a file"),
    ("ini", "[security]\nadmin_password = $__file{/p}\n[auth.anonymous]\nenabled = true\n", "anonymous"),
    ("datasources", {"apiVersion": 1, "datasources": [{"name": "P", "type": "prometheus"}]}, "lacks uid, url"),
])
def test_the_checker_refuses_what_grafana_must_not_get(tmp_path, kind, content, problem):
    path = tmp_path / "file"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    proc = subprocess.run([str(CHECKER), kind, str(path)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and problem in proc.stderr, proc.stderr
