"""The provisioned cluster's monitoring: Prometheus on the head scrapes every exporter with node labels, and
the opsctl health timer has fired and exited 0 or 1. Alerts, Alertmanager and Grafana:
test_provision_5_observability.py.
"""

import json
import urllib.request

import pytest
import yaml

from tests.integration.provision.support import NEEDS_MACHINES, NEEDS_ROOT, wait_until

pytestmark = [NEEDS_ROOT]


@pytest.mark.provision
@NEEDS_MACHINES
def test_prometheus_scrapes_every_exporter_with_node_labels(machines):
    url = f"http://{machines.addr(machines.head)}:9090/api/v1/targets"

    def targets():
        with urllib.request.urlopen(url, timeout=10) as resp:
            active = json.load(resp)["data"]["activeTargets"]
        got = {(t["labels"]["job"], t["labels"].get("node")): t["health"] for t in active}
        return got if all(h == "up" for h in got.values()) and len(got) >= len(machines.hosts) else None

    got = wait_until(targets, 90, "every target up")
    expected = {("node", h) for h in machines.hosts} | {("dcgm", h) for h in machines.gpu_nodes}
    assert expected <= set(got)


@pytest.mark.provision
@NEEDS_MACHINES
def test_opsctl_timer_has_fired_and_exited_0_or_1(machines):
    def last_run():
        props = dict(line.split("=", 1) for line in machines.on_head(
            "systemctl show opsctl-health.service -p ExecMainExitTimestampMonotonic -p ExecMainStatus "
            "-p Result").splitlines() if "=" in line)
        return props if props.get("ExecMainExitTimestampMonotonic", "0") != "0" else None

    props = wait_until(last_run, 75, "opsctl-health.service to have run")
    assert props["ExecMainStatus"] in ("0", "1"), props
    assert props["Result"] == "success", props
    assert "opsctl-health.timer" in machines.on_head("systemctl list-timers --no-pager opsctl-health.timer")


@pytest.mark.provision
@NEEDS_MACHINES
def test_the_heads_prometheus_records_the_catalog_and_opsctl_reads_the_recorded_results(machines):
    """The Prometheus role installs `opsctl rules export`'s recording groups (one per rule, one for the XID
    rules); Prometheus evaluates every one, and `opsctl health` on the head reads their results instead of
    querying each rule."""
    url = f"http://{machines.addr(machines.head)}:9090/api/v1/rules?type=record"

    def recorded():
        with urllib.request.urlopen(url, timeout=10) as resp:
            groups = [g for g in json.load(resp)["data"]["groups"] if g["name"].startswith("opsctl-precomputed-")]
        return groups if groups and all(r["health"] == "ok" for g in groups for r in g["rules"]) else None

    groups = wait_until(recorded, 60, "every opsctl recording rule evaluated")
    exported = yaml.safe_load(machines.on_head("/opt/opsctl/bin/opsctl rules export --format prometheus"))
    wanted = {g["name"] for g in exported["groups"] if g["name"].startswith("opsctl-precomputed-")}
    assert {g["name"] for g in groups} == wanted and "opsctl-precomputed-xid" in wanted
    last = {}

    def precomputed():
        last["run"] = json.loads(machines.on_head("/opt/opsctl/bin/opsctl health --json || true"))
        return last["run"] if last["run"]["summary"]["rule_results"] == "precomputed" else None

    # A rule that opsctl holds is read directly until its recorded history spans its hold (clock-slowdown's
    # 2 minutes after the rules were installed): then every rule's recorded results are used.
    run = wait_until(precomputed, 180, "every rule's recorded results used", interval=10,
                     explain=lambda: last["run"]["summary"]["rule_results_note"])
    assert run["summary"]["queries"] <= 6  # presence, age, identity, recorded, presence again (and resume evidence)
