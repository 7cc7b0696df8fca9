"""The alertmanager role's config, rendered by Ansible from the role (`tasks_from: render`) with the lab
inventory, checked by amtool, and run in the real Alertmanager (Debian's prometheus-alertmanager)
with a webhook receiver in this process: notifications are grouped by node and rule, a drained node
does not page again per GPU, and a tripped circuit breaker silences the per-node alerts it explains.
The same role in the lab machines, fed by Prometheus: tests/integration/provision/test_provision_5_observability.py."""

import json
import os
import shutil
import subprocess
import time
import urllib.request

import pytest
import yaml

from tests.alerting import Webhook, alert_states, post_alerts
from tests.component.promlab import free_port
from tests.component.test_slurm_render import BIN, PLAYBOOKS, REPO, ROLES, lab_inventory

pytestmark = pytest.mark.skipif(shutil.which("amtool") is None or shutil.which("prometheus-alertmanager") is None,
                                reason="needs prometheus-alertmanager (make deps-test)")


def render(tmp, webhook_url: str) -> str:
    playbook = tmp / "render.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "Render alertmanager.yml", "hosts": "controller", "gather_facts": False,
        "tasks": [{"name": "Render", "ansible.builtin.include_role": {"name": "alertmanager", "tasks_from": "render"},
                   "vars": {"alertmanager_render_dir": str(tmp / "out")}}]}]))
    extra = {"ansible_become": False, "ansible_connection": "local", "alertmanager_group_wait": "1s",
             "alertmanager_group_interval": "1s", "alertmanager_webhooks": [{"url": webhook_url}]}
    env = {"ANSIBLE_CONFIG": str(PLAYBOOKS / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROLES), "ANSIBLE_NOCOLOR": "1"}
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(lab_inventory(tmp)), str(playbook),
                           "-e", json.dumps(extra)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env}, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return str(tmp / "out" / "alertmanager.yml")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("alertmanager")
    webhook = Webhook()
    config = render(tmp, webhook.url)
    port = free_port()
    proc = subprocess.Popen(["prometheus-alertmanager", f"--config.file={config}", f"--storage.path={tmp / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
                             "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait(lambda: _get(f"{url}/-/ready") is not None, "Alertmanager ready")
        yield {"config": config, "url": url, "webhook": webhook}
    finally:
        proc.terminate()
        proc.wait(10)
        webhook.close()


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return json.load(resp) if resp.headers.get_content_type() == "application/json" else resp.read()
    except OSError:
        return None


def wait(check, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def gpu_alert(node, gpu, rule="row-remap-failure", name="OpsctlRowRemapFailure"):
    return {"alertname": name, "node": node, "gpu": gpu, "rule_id": rule, "severity": "fail", "action": "drain",
            "job": "dcgm"}


def amtool(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["amtool", *args], capture_output=True, text=True, timeout=30)


def test_amtool_accepts_the_config_and_routes_info_alerts_to_no_one(stack):
    check = amtool("check-config", stack["config"])
    assert check.returncode == 0 and "SUCCESS" in check.stdout, check.stdout + check.stderr
    assert "2 receivers" in check.stdout  # "opsctl" (every integration the inventory sets) and "null"
    page = amtool("config", "routes", "test", f"--config.file={stack['config']}", "--verify.receivers=opsctl",
                  "alertname=OpsctlRowRemapFailure", "node=gpu2", "rule_id=row-remap-failure", "severity=fail")
    assert page.returncode == 0, page.stdout + page.stderr
    silent = amtool("config", "routes", "test", f"--config.file={stack['config']}", '--verify.receivers=null',
                    "alertname=OpsctlNodeDrained", "node=gpu2", "severity=info")
    assert silent.returncode == 0, silent.stdout + silent.stderr


def test_alerts_are_grouped_by_node_and_rule(stack):
    post_alerts(stack["url"], gpu_alert("gpu2", "2"), gpu_alert("gpu2", "5"), gpu_alert("gpu3", "0"),
         gpu_alert("gpu2", "1", "xid-79", "OpsctlXid79"))
    groups = wait(lambda: (lambda g: g if len(g) >= 3 else None)(stack["webhook"].groups()), "three notifications")
    assert groups[(("node", "gpu2"), ("rule_id", "row-remap-failure"))] == {("OpsctlRowRemapFailure", "2"),
                                                                          ("OpsctlRowRemapFailure", "5")}
    assert groups[(("node", "gpu3"), ("rule_id", "row-remap-failure"))] == {("OpsctlRowRemapFailure", "0")}
    assert groups[(("node", "gpu2"), ("rule_id", "xid-79"))] == {("OpsctlXid79", "1")}


def test_a_drained_node_does_not_page_again_per_gpu_but_still_needs_a_person(stack):
    post_alerts(stack["url"], {"alertname": "OpsctlNodeDrained", "node": "gpu6", "slurm_node": "gpu6",
                        "rule_id": "opsctl-node-drained", "severity": "info"})
    time.sleep(1)
    post_alerts(stack["url"], gpu_alert("gpu6", "4"), {"alertname": "OpsctlNodeNeedsPerson", "node": "gpu6",
                                                "slurm_node": "gpu6", "rule_id": "row-remap-failure",
                                                "severity": "fail"})
    states = wait(lambda: (lambda s: s if len(s) == 3 else None)(alert_states(stack["url"], "gpu6")), "gpu6's alerts")
    assert states == {"OpsctlNodeDrained": "active", "OpsctlRowRemapFailure": "suppressed",
                      "OpsctlNodeNeedsPerson": "active"}
    page = wait(lambda: stack["webhook"].groups().get((("node", "gpu6"), ("rule_id", "row-remap-failure"))),
                "the needs-person page")
    assert page == {("OpsctlNodeNeedsPerson", "")}


def test_a_tripped_breaker_silences_the_per_node_alerts_it_explains(stack):
    post_alerts(stack["url"], {"alertname": "OpsctlCircuitBreakerTripped", "rule_id": "opsctl-circuit-breaker",
                        "severity": "fail"})
    time.sleep(1)
    post_alerts(stack["url"], gpu_alert("gpu7", "3", "ib-down", "OpsctlIbDown"),
         {"alertname": "OpsctlExporterDown", "node": "gpu8", "job": "node", "rule_id": "opsctl-exporter-down",
          "severity": "warn"})
    assert wait(lambda: stack["webhook"].groups().get((("rule_id", "opsctl-circuit-breaker"),)), "the breaker page")
    assert wait(lambda: alert_states(stack["url"], "gpu7").get("OpsctlIbDown") == "suppressed", "gpu7 inhibited")
    assert alert_states(stack["url"], "gpu8") == {"OpsctlExporterDown": "suppressed"}
    time.sleep(2.5)  # two group intervals: an inhibited alert would have been sent by now
    sent = {labels for labels in stack["webhook"].groups()}
    assert (("node", "gpu7"), ("rule_id", "ib-down")) not in sent
    assert (("node", "gpu8"), ("rule_id", "opsctl-exporter-down")) not in sent
