"""Every way a site's Prometheus may name its targets, end to end against a real Prometheus and
VictoriaMetrics: the `node` target label, explicit node_mapping.names, what the exporters report
about themselves behind IP targets (dcgm-exporter's Hostname, node_exporter's node_uname_info in a
UTS namespace of its own), two targets claiming one name, and two hosts whose `node` labels are
swapped (each exporter reports its own host name under the other's label). Each mode has its own
scrape jobs on one pair of databases."""

import os
import shutil

import pytest

from opsctl.config import parse_config
from opsctl.errors import ConfigError
from opsctl.health.catalog import load_catalog
from opsctl.health.evaluate import evaluate
from opsctl.prom import PromClientImpl
from tests.component.promlab import (
    HAVE_NODE_EXPORTER,
    HAVE_PROMETHEUS,
    HAVE_VICTORIA,
    TSDBS,
    DcgmEndpoint,
    NodeExporter,
    Running,
    Tsdb,
    drain_decisions,
    evaluate_everywhere,
    loopback,
    wait,
)

pytestmark = pytest.mark.skipif(
    not (HAVE_PROMETHEUS and HAVE_NODE_EXPORTER and HAVE_VICTORIA) or os.geteuid() != 0
    or shutil.which("unshare") is None,
    reason="needs prometheus, prometheus-node-exporter, victoria-metrics, and root for a UTS namespace")


class Site(Running):
    """Scrape jobs per mode: labelled (node label), ip (IP targets; the exporters report FQDNs),
    conflict (two dcgm targets report the same Hostname) and swapped (node labels swapped; the
    exporters report their own host names, Hostname and nodename)."""

    def __init__(self, tmp):
        self.dcgm, self.nodeexp, jobs = {}, {}, []

        def add(job, name, host, reported, labelled=False, node_exporter=True, label=None):
            label = label or (name if labelled else None)
            dcgm = DcgmEndpoint(reported, host)
            self.dcgm[(job, name)] = dcgm
            jobs.append((f"dcgm_{job}", dcgm.address, label))
            if node_exporter:
                exp = NodeExporter(reported, tmp, dcgm.hw, host, uname=None if labelled else reported)
                self.nodeexp[(job, name)] = exp
                jobs.append((f"node_{job}", exp.address, label))

        add("labelled", "gpu071", "127.0.0.1", "gpu071", labelled=True)
        add("labelled", "gpu072", "127.0.0.1", "gpu072", labelled=True)
        add("ip", "gpu073", loopback(3), "gpu073.cluster.example")
        add("ip", "gpu074", loopback(4), "gpu074.cluster.example")
        add("conflict", "a", loopback(5), "gpu075", node_exporter=False)
        add("conflict", "b", loopback(6), "gpu075")
        add("swapped", "gpu076", loopback(7), "gpu076.cluster.example", label="gpu077")
        add("swapped", "gpu077", loopback(8), "GPU077", label="gpu076")
        scrape = {}
        for job, address, label in jobs:
            scrape.setdefault(job, []).append({"targets": [address], "labels": {"node": label} if label else {}})
        configs = [{"job_name": job, "static_configs": groups} for job, groups in scrape.items()]
        self.tsdbs = {kind: Tsdb(kind, tmp, configs) for kind in TSDBS}
        try:
            for tsdb in self.tsdbs.values():
                wait(lambda t=tsdb: len(t.query("up == 1")) == len(jobs) and t.query("node_uname_info"),
                     what=f"every target up in {tsdb.kind}")
        except BaseException:
            self.stop()
            raise

    def address(self, job, name):
        return self.dcgm[(job, name)].address


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    s = Site(tmp_path_factory.mktemp("identity"))
    yield s
    s.stop()


# The rules that opsctl holds for minutes (the recording rules read them directly until their recorded
# history spans the hold) hold seconds here: each test's jobs load new recording groups.
HOLDS = {"clock-slowdown": {"hold": "3s"}, "pcie-downtrained": {"hold": "3s"}, "firmware-drift": {"hold": "3s"}}


def config(site, job, **mapping):
    return parse_config({"prometheus": {"url": site.tsdbs["prometheus"].url, "scrape_interval": "1s",
                                        "jobs": {"dcgm": f"dcgm_{job}", "node": f"node_{job}"}},
                         "node_mapping": mapping, "catalog": {"overrides": HOLDS}}, "t", {})


def judged(site, cfg, slurm_nodes):
    report, _, _ = evaluate_everywhere(site.tsdbs, cfg, slurm_nodes)
    return {n: (v.status, v.in_slurm, sorted(c.id for c in v.checks)) for n, v in report.nodes.items()}


def with_xid(site, job, name):
    site.dcgm[(job, name)].hw.inject("xid:79", gpu=2)
    rule = next(r for r in load_catalog(config(site, job)) if r.id == "xid-79")
    instance = site.address(job, name)
    # Both databases return the rule's own alert series before anything is judged: VictoriaMetrics makes
    # new samples searchable a few seconds after Prometheus does, and a rule holds for a while.
    wait(lambda: all(any(s["metric"].get("instance") == instance for s in tsdb.query(rule.alert_expr()))
                     for tsdb in site.tsdbs.values()), what="the XID held in both databases")


@pytest.fixture(autouse=True)
def healthy(site):
    yield
    for endpoint in site.dcgm.values():
        endpoint.hw.clear()


def test_the_node_target_label_names_the_node(site):
    with_xid(site, "labelled", "gpu071")
    assert judged(site, config(site, "labelled"), ["gpu071", "gpu072"]) == {
        "gpu071": ("fail", True, ["xid-79"]), "gpu072": ("ok", True, [])}


def test_explicit_names_map_ip_targets(site):
    names = {site.address("ip", "gpu073"): "gpu173", loopback(4): "gpu174",  # an instance, or its host
             site.nodeexp[("ip", "gpu073")].address: "gpu173"}
    with_xid(site, "ip", "gpu074")
    assert judged(site, config(site, "ip", names=names), ["gpu173", "gpu174"]) == {
        "gpu173": ("ok", True, []), "gpu174": ("fail", True, ["xid-79"])}


def test_ip_targets_take_the_names_their_exporters_report(site):
    with_xid(site, "ip", "gpu073")
    # dcgm-exporter's Hostname and node_exporter's nodename, domain stripped: never "unknown" or the IPs.
    assert judged(site, config(site, "ip"), ["gpu073", "gpu074"]) == {
        "gpu073": ("fail", True, ["xid-79"]), "gpu074": ("ok", True, [])}


def test_a_name_claimed_by_two_targets_is_unknown_and_never_drained(site):
    with_xid(site, "conflict", "a")
    verdicts = judged(site, config(site, "conflict"), ["gpu075"])
    assert verdicts == {"gpu075": ("unknown", True, ["identity-conflict", "xid-79"])}


def test_swapped_node_labels_make_both_nodes_unknown_and_drain_neither(site):
    with_xid(site, "swapped", "gpu076")  # filed under gpu077 by its label
    cfg = config(site, "swapped")
    report, _, rules = evaluate_everywhere(site.tsdbs, cfg, ["gpu076", "gpu077"])
    conflicts = ["identity-conflict", "identity-conflict"]  # dcgm's Hostname and node_exporter's nodename
    assert judged(site, cfg, ["gpu076", "gpu077"]) == {
        "gpu076": ("unknown", True, conflicts), "gpu077": ("unknown", True, [*conflicts, "xid-79"])}
    evidence = sorted(c.evidence.replace(site.address("swapped", "gpu076"), "A") for c in report.nodes["gpu077"].checks
                      if c.id == "identity-conflict")
    assert evidence[0] == "dcgm target A is labelled node=gpu077 but reports Hostname=gpu076.cluster.example"
    assert drain_decisions(report, rules, ["gpu076", "gpu077"]) == {"gpu077": "skip:unknown"}


def test_a_job_without_targets_is_a_config_error_naming_it(site):
    cfg = parse_config({"prometheus": {"url": site.tsdbs["prometheus"].url, "scrape_interval": "1s",
                                       "jobs": {"dcgm": "dcgm_labelled", "node": "node"}}}, "t", {})
    with pytest.raises(ConfigError, match="config key prometheus.jobs.node: Prometheus has no target of job 'node'") \
            as err:
        evaluate(PromClientImpl(cfg.prometheus.url), load_catalog(cfg), cfg, ["gpu071"])
    assert "dcgm_ip, dcgm_labelled" in str(err.value) and err.value.exit_code == 2


def test_a_site_without_node_exporter_sets_its_job_to_null(site):
    cfg = parse_config({"prometheus": {"url": site.tsdbs["prometheus"].url, "scrape_interval": "1s",
                                       "jobs": {"dcgm": "dcgm_labelled", "node": None}},
                       "catalog": {"overrides": HOLDS}}, "t", {})
    assert judged(site, cfg, ["gpu071", "gpu072"]) == {"gpu071": ("ok", True, []), "gpu072": ("ok", True, [])}
