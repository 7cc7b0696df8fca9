"""Observability on the provisioned machines: a row-remap failure injected on gpu2 is drained by the opsctl
timer and paged through the real Alertmanager, grouped by node and rule; a tripped breaker inhibits the
per-node pages; the timer's textfile metrics reach Prometheus; an inventory override changes opsctl, the
installed alert rule and the dashboard; Grafana's files are rendered and checked and its password never
shown. The fault on gpu2 is cleared, and gpu2 resumed, at the end of the module.
"""

import json
import re
import sys
import time
import urllib.parse
import urllib.request

import pytest
import yaml

from tests.alerting import Webhook, alert_states, post_alerts
from tests.integration.provision.support import (
    INVENTORY,
    NEEDS_MACHINES,
    NEEDS_ROOT,
    lab_cli,
    playbook,
    wait_until,
)

pytestmark = [NEEDS_ROOT]


ALERT_WEBHOOK_PORT = 9199  # inventory/lab/group_vars/controller.yml, alertmanager_webhooks


@pytest.fixture(scope="module")
def alert_webhook(machines):
    """Where the lab inventory's Alertmanager sends notifications: the host side of the lab bridge."""
    hook = Webhook(machines.addr(machines.head).rsplit(".", 1)[0] + ".1", ALERT_WEBHOOK_PORT)
    yield hook
    hook.close()


@pytest.fixture(scope="module")
def row_remap_failure_on_gpu2(machines, alert_webhook):
    """A row-remap failure injected on gpu2, kept while the tests that need it run (the timer's drain,
    then the page through Alertmanager), cleared and resumed at the end of the module."""
    node = "gpu2"
    wait_until(lambda: machines.node_state(node)[0] in ("idle", "mixed"), 90, f"{node} idle")
    lab_cli("inject", node, "row-remap-failure")
    yield {"node": node, "since": time.monotonic()}
    lab_cli("clear", node)
    machines.resume(node)


@pytest.mark.provision
@NEEDS_MACHINES
def test_injected_row_remap_failure_is_drained_by_the_timer(machines, row_remap_failure_on_gpu2):
    node = row_remap_failure_on_gpu2["node"]
    state, reason = wait_until(lambda: machines.drained(node), 120, f"{node} drained by the opsctl timer", interval=3)
    sys.stderr.write(f"{node} drained after {time.monotonic() - row_remap_failure_on_gpu2['since']:.0f} s: {reason}\n")
    assert reason.startswith("opsctl:"), reason


@pytest.mark.provision
@NEEDS_MACHINES
def test_gpu_fault_pages_through_alertmanager_grouped_by_node_and_rule(row_remap_failure_on_gpu2, alert_webhook):
    """The row-remap failure on gpu2 (Prometheus' rule, then Alertmanager, then the webhook):
    one group per node and rule, whose alerts are the GPU's own alert or, once opsctl drained the node,
    the page that it needs a person (the drain inhibits the GPU's alert)."""
    group = (("node", "gpu2"), ("rule_id", "row-remap-failure"))
    page = wait_until(lambda: alert_webhook.groups().get(group), 60, "gpu2's page at the webhook")
    assert {name for name, _ in page} <= {"OpsctlRowRemapFailure", "OpsctlNodeNeedsPerson"}, page
    needs_person = wait_until(lambda: ("OpsctlNodeNeedsPerson", "") in alert_webhook.groups().get(group, set()),
                              60, "the needs-person page for the drained gpu2")
    assert needs_person
    for labels in alert_webhook.groups():
        assert dict(labels).get("rule_id") != "opsctl-node-drained", "inhibition sources notify no one"


@pytest.mark.provision
@NEEDS_MACHINES
def test_a_tripped_breaker_inhibits_the_per_node_pages(machines, alert_webhook):
    """The installed Alertmanager, sent what Prometheus sends when the breaker trips while nodes fail.
    The alerts resolve after 40 s, so that they silence nothing after this test."""
    url = f"http://{machines.addr(machines.head)}:9093"
    ends = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 40))
    post_alerts(url, {"alertname": "OpsctlCircuitBreakerTripped", "rule_id": "opsctl-circuit-breaker",
                      "severity": "fail"}, ends_at=ends)
    time.sleep(1)
    post_alerts(url, {"alertname": "OpsctlXid79", "node": "gpu3", "gpu": "1", "rule_id": "xid-79", "severity": "fail",
                      "action": "drain"}, ends_at=ends)
    try:
        wait_until(lambda: alert_webhook.groups().get((("rule_id", "opsctl-circuit-breaker"),)), 60,
                   "the breaker's page")
    except AssertionError as err:  # what each side saw, to tell a late notification from a lost one
        with urllib.request.urlopen(f"{url}/api/v2/alerts", timeout=10) as resp:
            held = [(a["labels"]["alertname"], a["status"]["state"]) for a in json.load(resp)]
        raise AssertionError(f"{err}; the webhook got {alert_webhook.groups()}; Alertmanager holds {held}") from None
    assert wait_until(lambda: alert_states(url, "gpu3").get("OpsctlXid79") == "suppressed", 20, "gpu3 inhibited")
    time.sleep(7)  # past the lab's group_wait (5 s) for a new group: an inhibited page would be out by now
    assert (("node", "gpu3"), ("rule_id", "xid-79")) not in alert_webhook.groups()


@pytest.mark.provision
@NEEDS_MACHINES
def test_timer_metrics_reach_prometheus_through_node_exporters_textfile(machines):
    url = f"http://{machines.addr(machines.head)}:9090/api/v1/query?" + urllib.parse.urlencode(
        {"query": 'time() - opsctl_last_success_timestamp_seconds{job="node", node="head"}'})

    def age():
        with urllib.request.urlopen(url, timeout=10) as resp:
            result = json.load(resp)["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    assert wait_until(age, 90, "opsctl's textfile metrics in Prometheus") < 120
    textfile = machines.on_head("cat /var/lib/prometheus/node-exporter/opsctl.prom")
    assert 'opsctl_runs_total{result="ok"}' in textfile and "opsctl_slurm_nodes{" in textfile


def _loaded_recording(machines, group: str) -> str:
    """The expression of a recording group's first rule as the head node's Prometheus has loaded it."""
    url = f"http://{machines.addr(machines.head)}:9090/api/v1/rules?type=record"
    with urllib.request.urlopen(url, timeout=10) as resp:
        groups = json.load(resp)["data"]["groups"]
    return next(g["rules"][0]["query"] for g in groups if g["name"] == group)


def _threshold_everywhere(machines) -> dict:
    rules = yaml.safe_load(machines.on_head("cat /etc/prometheus/rules/opsctl.yml"))
    # The alert reads the rule's recorded results (opsctl/health/precomputed.py): its threshold is in the
    # expression of the rule's recording group, which Prometheus evaluates.
    alert = next(g["rules"][0] for g in rules["groups"] if g["name"] == "opsctl-precomputed-gpu-temp-high")
    dashboard = json.loads(machines.on_head("cat /var/lib/grafana/dashboards/opsctl/opsctl-gpu.json"))
    panel = next(p for p in dashboard["panels"] if p.get("title", "").startswith("gpu-temp-high"))
    listed = next(line for line in machines.on_head("/opt/opsctl/bin/opsctl rules list").splitlines()
                  if line.startswith("gpu-temp-high"))
    # `opsctl rules list` prints the NaN-safe alert expression, `X unless (X <= <threshold> > -Inf < +Inf)`; the
    # recording group filters by the number alone, `clamp_min(X, <threshold>) != <threshold> or ...`.
    def threshold(expr: str) -> str:
        found = re.search(r" <= (\S+) > -Inf", expr) or re.search(r"clamp_min\(.*, (\S+)\) != ", expr)
        assert found, expr
        return found.group(1)

    return {"opsctl": threshold(listed), "alert rule": threshold(alert["expr"]),
            "dashboard": panel["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"]}


@pytest.mark.provision
@NEEDS_MACHINES
def test_an_inventory_override_changes_opsctl_the_installed_alert_rule_and_the_dashboard(machines):
    """A threshold set in the site's opsctl_config reaches /etc/opsctl/config.yaml, the alert rule
    Prometheus loads and the dashboard Grafana provisions; then the plain inventory puts 87 back."""
    # The site's value as extra vars: the lab's group_vars set opsctl_config too, and an inventory's
    # group_vars directory outranks another inventory source's group vars.
    lab_config = yaml.safe_load((INVENTORY / "group_vars" / "controller.yml").read_text()).get("opsctl_config", {})
    override = {"opsctl_config": {**lab_config, "catalog": {"overrides": {"gpu-temp-high": {"threshold": 83}}}}}
    tags = ["--tags", "opsctl_configure,prometheus_configure,grafana_configure", "--limit", "controller"]
    try:
        proc = playbook("-e", json.dumps(override), *tags)
        assert proc.returncode == 0, proc.stdout[-6000:]
        assert _threshold_everywhere(machines) == {"opsctl": "83", "alert rule": "83", "dashboard": 83}
        wait_until(lambda: ", 83) != 83" in _loaded_recording(machines, "opsctl-precomputed-gpu-temp-high"), 30,
                   "Prometheus to load the changed rule")
    finally:
        restore = playbook(*tags)
        assert restore.returncode == 0, restore.stdout[-6000:]
    assert _threshold_everywhere(machines) == {"opsctl": "87", "alert rule": "87", "dashboard": 87}


@pytest.mark.provision
@NEEDS_MACHINES
def test_grafana_provisioning_is_rendered_and_checked_and_its_password_never_shown(provisioned):
    machines = provisioned["machines"]
    first = provisioned["runs"][0]
    assert first.count("Grafana is not installed (grafana_install_packages: false)") == 1
    files = machines.on_head("ls /var/lib/grafana/dashboards/opsctl /etc/grafana/provisioning/*/").split()
    assert {"opsctl-overview.json", "opsctl-gpu.json", "opsctl-infiniband.json", "opsctl-storage.json",
            "opsctl-runs.json", "opsctl.yaml"} <= set(files)
    machines.on_head("for f in /var/lib/grafana/dashboards/opsctl/*.json; do opsctl-grafana-check dashboard $f; done"
                     " && opsctl-grafana-check ini /etc/grafana/grafana.ini")
    datasource = json.loads(machines.on_head("cat /etc/grafana/provisioning/datasources/opsctl.yaml"))["datasources"][0]
    assert (datasource["url"], datasource["jsonData"]["timeInterval"]) == (f"http://{machines.addr(machines.head)}:9090",
                                                                           "5s")
    assert machines.on_head("stat -c %a /etc/grafana/admin-password").strip() == "600"
    password = (INVENTORY / ".secrets" / "grafana-admin-password").read_text().strip()
    assert len(password) == 24 and all(password not in run for run in provisioned["runs"])
