"""The grafana role refuses to run without a fit admin password, trusts a downloaded APT signing key
only with the fingerprint it is told, and its checker refuses what Grafana must not get. The role's
full run (in lab mode: its one line, the rendered and checked files, the password in a 0600 file and
never in the output) is tested where it runs, on the lab machines
(tests/integration/provision/test_provision_5_observability.py)."""

import functools
import json
import os
import subprocess
import threading
from http.server import SimpleHTTPRequestHandler

import pytest
import yaml

from opsctl_lab.dcgm_emulator import QuietHTTPServer
from tests.component.test_slurm_render import BIN, PLAYBOOKS, REPO, ROLES, lab_inventory
from tests.unit.test_roles_static import LAB_HOSTS

CHECKER = ROLES / "grafana" / "files" / "opsctl-grafana-check"


def run_role(tmp, tasks_from: str = "main", inventory=None, plays: dict | None = None,
             **extra) -> subprocess.CompletedProcess:
    """One ansible-playbook run of the role; `plays` (play name -> its vars) runs it once per play, in order."""
    playbook = tmp / "grafana.yml"
    playbook.write_text(yaml.safe_dump([
        {"name": name, "hosts": "head", "gather_facts": False, "vars": play_vars, "tasks": [
            {"name": "Grafana", "ansible.builtin.include_role": {"name": "grafana", "tasks_from": tasks_from}}]}
        for name, play_vars in (plays or {"Grafana": {}}).items()]))
    paths = {"grafana_config_dir": tmp / "etc", "grafana_provisioning_dir": tmp / "etc" / "provisioning",
             "grafana_dashboards_dir": tmp / "dashboards", "grafana_checker": tmp / "opsctl-grafana-check",
             "grafana_render_dir": tmp / "render"}
    variables = {"ansible_become": False, "ansible_connection": "local",
                 "ansible_python_interpreter": "/usr/bin/python3", **{k: str(v) for k, v in paths.items()}, **extra}
    env = {**os.environ, "ANSIBLE_CONFIG": str(PLAYBOOKS / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROLES),
           "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory or lab_inventory(tmp)), str(playbook),
                           "--diff",
                           "-e", json.dumps(variables)], capture_output=True, text=True, timeout=300, env=env,
                          cwd=REPO)


def test_no_password_fails_naming_the_variable(tmp_path):
    """An inventory that sets no grafana_admin_password (the lab's sets one), then one that sets it empty."""
    hosts = tmp_path / "hosts.yml"
    hosts.write_text(LAB_HOSTS)
    missing = run_role(tmp_path, inventory=hosts)
    assert missing.returncode != 0
    assert "missing required arguments: grafana_admin_password" in missing.stdout
    empty = run_role(tmp_path, grafana_admin_password="")
    assert empty.returncode != 0 and "grafana_admin_password: use 12 characters or more" in empty.stdout


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


def test_the_apt_key_is_trusted_only_with_the_fingerprint_it_is_told(tmp_path):
    """A key served over HTTP as apt.grafana.com serves its own: the right fingerprint passes, another fails."""
    home, served = tmp_path / "gnupg", tmp_path / "served"
    home.mkdir(mode=0o700)
    served.mkdir()
    gpg = ["gpg", "--homedir", str(home), "--batch"]
    subprocess.run([*gpg, "--passphrase", "", "--quick-gen-key", "Repository <repo@example.org>", "ed25519", "sign",
                    "never"], check=True, capture_output=True, timeout=60)
    (served / "gpg.key").write_bytes(subprocess.run([*gpg, "--armor", "--export"], check=True, capture_output=True,
                                                    timeout=30).stdout)
    listing = subprocess.run([*gpg, "--with-colons", "--list-keys"], check=True, capture_output=True, text=True).stdout
    fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
    server = QuietHTTPServer(("127.0.0.1", 0), functools.partial(SimpleHTTPRequestHandler, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    key = {"grafana_apt_key_url": f"http://127.0.0.1:{server.server_port}/gpg.key",
           "grafana_apt_key_file": str(tmp_path / "keyrings" / "grafana.asc")}
    try:
        # One run, two plays: the key with its own fingerprint, then with another (the failing play ends the run).
        proc = run_role(tmp_path, "repository_key", plays={
            "good": {"grafana_apt_key_fingerprint": fingerprint},
            "bad": {"grafana_apt_key_fingerprint": "B53AE77BADB630A683046005963FA27710458545"}}, **key)
        good, _, bad = proc.stdout.partition("PLAY [bad]")
        assert "PLAY [good]" in good and "Check the signing key's fingerprint]" in good and "fatal:" not in good, \
            good[-3000:]
        assert proc.returncode != 0 and "is not the key with fingerprint B53AE77BADB630A6" in bad, proc.stdout[-3000:]
    finally:
        server.shutdown()
        server.server_close()
