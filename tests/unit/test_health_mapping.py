"""Which Slurm node a series belongs to (opsctl/health/mapping.py)."""

import pytest

from opsctl.config.schema import MappingConfig
from opsctl.health.mapping import node_name

DEFAULT = MappingConfig()


@pytest.mark.parametrize("labels,expected", [
    ({"node": "gpu001", "Hostname": "other", "instance": "10.0.0.9:9400"}, "gpu001"),  # the target label wins
    ({"Hostname": "gpu002.cluster.example", "instance": "10.0.0.9:9400"}, "gpu002"),   # released dcgm-exporter
    ({"hostname": "gpu003.cluster.example"}, "gpu003"),                                # newer dcgm-exporter
    ({"node": "", "Hostname": "gpu004"}, "gpu004"),                                    # an empty label is no label
    ({"instance": "gpu005.cluster.example:9100"}, "gpu005"),                           # the host part of instance
    ({"instance": "10.20.1.5:9100"}, "10.20.1.5"),                                     # an address is never cut
    ({"instance": "[fd00::5]:9100"}, "fd00::5"),
    ({"instance": "gpu006"}, "gpu006"),
    ({"job": "dcgm"}, None),
    ({}, None),
])
def test_default_mapping(labels, expected):
    assert node_name(labels, DEFAULT) == expected


def test_names_map_what_the_labels_give():
    mapping = MappingConfig(names={"10.20.1.5": "gpu005", "gpu-a07": "gpu007"})
    assert node_name({"instance": "10.20.1.5:9400"}, mapping) == "gpu005"
    assert node_name({"Hostname": "gpu-a07.cluster.example"}, mapping) == "gpu007"  # after the domain goes
    assert node_name({"Hostname": "gpu-a08"}, mapping) == "gpu-a08"


def test_a_full_name_in_names_is_taken_before_the_domain_is_stripped():
    mapping = MappingConfig(names={"gpu009.other.example": "gpu109"})
    assert node_name({"Hostname": "gpu009.other.example"}, mapping) == "gpu109"
    assert node_name({"Hostname": "gpu009.cluster.example"}, mapping) == "gpu009"


def test_domains_are_kept_when_asked():
    mapping = MappingConfig(strip_domain=False)
    assert node_name({"Hostname": "gpu002.cluster.example"}, mapping) == "gpu002.cluster.example"


def test_the_labels_to_look_at_are_configurable():
    mapping = MappingConfig(labels=("slurm_node",))
    assert node_name({"slurm_node": "gpu010", "node": "x"}, mapping) == "gpu010"
    assert node_name({"node": "x", "instance": "gpu011:9400"}, mapping) == "gpu011"
