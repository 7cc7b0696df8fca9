"""Which Slurm node a scrape target is (opsctl/health/identity.py): decided once per run from the
target label, node_mapping.names, the exporter's own report, or the instance, in that order."""

import pytest

from opsctl.config import parse_config
from opsctl.config.schema import MappingConfig
from opsctl.health.identity import Identities, identity_query, name_of
from opsctl.prom.client import Sample

DEFAULT = MappingConfig()


@pytest.mark.parametrize("labels,expected", [
    ({"node": "gpu001", "Hostname": "other", "instance": "10.0.0.9:9400"}, ("gpu001", "target-label")),
    ({"Hostname": "gpu002.cluster.example", "instance": "10.0.0.9:9400"}, ("gpu002", "exporter")),
    ({"hostname": "gpu003.cluster.example"}, ("gpu003", "exporter")),  # newer dcgm-exporter
    ({"node": "", "Hostname": "gpu004"}, ("gpu004", "exporter")),  # an empty label is no label
    ({"instance": "gpu005.cluster.example:9100"}, ("gpu005", "instance")),
    ({"instance": "10.20.1.5:9100"}, ("10.20.1.5", "instance")),  # an address is never cut
    ({"instance": "[fd00::5]:9100"}, ("fd00::5", "instance")),
    ({"job": "dcgm"}, ("", "")),
])
def test_default_mapping(labels, expected):
    assert name_of(labels, DEFAULT) == expected


def test_names_map_an_instance_or_its_host_before_what_the_exporter_says():
    mapping = MappingConfig(names={"10.20.1.5:9400": "gpu005", "10.20.1.6": "gpu006"})
    assert name_of({"instance": "10.20.1.5:9400", "Hostname": "x"}, mapping) == ("gpu005", "names")
    assert name_of({"instance": "10.20.1.6:9100"}, mapping) == ("gpu006", "names")
    assert name_of({"instance": "10.20.1.7:9100", "Hostname": "gpu-a07.x"}, mapping) == ("gpu-a07", "exporter")


def test_domains_are_kept_when_asked():
    mapping = MappingConfig(strip_domain=False)
    assert name_of({"Hostname": "gpu002.cluster.example"}, mapping)[0] == "gpu002.cluster.example"


def up(job, instance, **labels):
    return Sample({"job": job, "instance": instance, **labels}, 1.0)


def reported(job, instance, name, label="Hostname", metric="DCGM_FI_DEV_GPU_TEMP"):
    return Sample({"job": job, "instance": instance, label: name, "__name__": metric}, 1.0)


def test_ip_targets_take_the_name_each_exporter_reports_for_presence_and_rules_alike():
    config = parse_config({}, "t", {})
    ids = Identities([up("dcgm", "10.0.0.1:9400"), up("node", "10.0.0.1:9100")],
                     [reported("dcgm", "10.0.0.1:9400", "gpu001.cluster"),
                      reported("node", "10.0.0.1:9100", "gpu001", "nodename", "node_uname_info")], config)
    assert {n: sorted(by) for n, by in ids.by_node().items()} == {"gpu001": ["dcgm", "node"]}
    rule_series = {"job": "dcgm", "instance": "10.0.0.1:9400", "gpu": "3"}  # no Hostname kept by the rule
    assert ids.node_of(rule_series) == "gpu001"


def test_a_target_reporting_several_names_is_a_conflict():
    config = parse_config({}, "t", {})
    ids = Identities([up("dcgm", "10.0.0.1:9400")],
                     [reported("dcgm", "10.0.0.1:9400", "gpu001"), reported("dcgm", "10.0.0.1:9400", "gpu002")],
                     config)
    [(_, info)] = ids.by_node()["gpu001"]["dcgm"]
    assert "reports several names: gpu001, gpu002" in info.conflict


def test_the_identity_query_is_one_query_and_follows_the_config():
    config = parse_config({"node_mapping": {"exporter_labels": ["host"]}, "prometheus": {"jobs": {"node": None}}},
                          "t", {})
    query = identity_query(config)
    assert query.startswith("group by (job, instance, host, nodename, __name__)") and "node_uname_info" not in query
    assert "node_uname_info" in identity_query(parse_config({}, "t", {}))
