"""Which Slurm node a scrape target is (opsctl/health/identity.py): decided once per run from the
target label, node_mapping.names, the exporter's own report, or the instance, in that order; a label
that disagrees with the target's own host name is an identity conflict, and `opsctl health --drain`
acts on neither node. A source without any `up` series is a source error (exit 3) that `--watch`
outlives."""

import json
import threading

import pytest
from click.testing import CliRunner

from opsctl.cli import main
from opsctl.clients import Clients
from opsctl.commands.watch import watch
from opsctl.config import parse_config
from opsctl.config.schema import MappingConfig
from opsctl.errors import ExitCode, SourceUnavailable
from opsctl.health.catalog import load_catalog
from opsctl.health.evaluate import evaluate
from opsctl.health.identity import Identities, identity_query, name_of
from opsctl.prom.client import Sample
from tests.unit.fakes import FakeProm, FakeSlurm, gpu_nodes

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


def test_a_target_label_that_disagrees_with_the_reported_host_name_is_a_conflict_naming_both():
    config = parse_config({}, "t", {})
    ids = Identities([up("dcgm", "10.0.0.1:9400", node="gpu060"), up("node", "10.0.0.1:9100", node="gpu060")],
                     [reported("dcgm", "10.0.0.1:9400", "gpu061.cluster.example"),
                      reported("node", "10.0.0.1:9100", "gpu061", "nodename", "node_uname_info")], config)
    [(_, dcgm)] = ids.by_node()["gpu060"]["dcgm"]
    [(_, node)] = ids.by_node()["gpu060"]["node"]
    assert (dcgm.name, dcgm.via, dcgm.conflict_names, node.conflict_names) == ("gpu060", "target-label",
                                                                              {"gpu061"}, {"gpu061"})
    assert dcgm.conflict == ("dcgm target 10.0.0.1:9400 is labelled node=gpu060 but reports "
                             "Hostname=gpu061.cluster.example")
    assert node.conflict == "node target 10.0.0.1:9100 is labelled node=gpu060 but reports nodename=gpu061"


@pytest.mark.parametrize("mapping,label,hostname", [
    ({}, "gpu060", "GPU060.cluster.example"),  # short names compared, case-insensitive
    ({"strip_domain": False}, "gpu060", "gpu060.cluster.example"),  # compared short even where names keep domains
    ({"names": {"host-a7": "gpu060"}}, "gpu060", "host-a7.cluster.example"),  # host names mapped to Slurm's
])
def test_the_same_host_by_another_spelling_or_a_mapped_name_is_no_conflict(mapping, label, hostname):
    config = parse_config({"node_mapping": mapping}, "t", {})
    ids = Identities([up("dcgm", "10.0.0.1:9400", node=label)], [reported("dcgm", "10.0.0.1:9400", hostname)],
                     config)
    [(_, info)] = ids.by_node()[label]["dcgm"]
    assert (info.conflict, info.conflict_names) == ("", set())


def test_one_host_reported_in_two_spellings_is_one_name():
    config = parse_config({}, "t", {})
    ids = Identities([up("dcgm", "10.0.0.1:9400")], [reported("dcgm", "10.0.0.1:9400", "gpu001"),
                                                     reported("dcgm", "10.0.0.1:9400", "gpu001.X", "hostname")], config)
    [(_, info)] = ids.by_node()["gpu001"]["dcgm"]
    assert info.conflict == ""


class Swapped(FakeProm):
    """The dcgm target labelled node=N reports Hostname=hostnames[N]: its node label is another host's."""

    def __init__(self, config, nodes, hostnames):
        super().__init__(config, nodes)
        self.reported = hostnames


def cli(config, prom, slurm, *args):
    res = CliRunner().invoke(main, ["health", *args], obj=Clients(config, prom, slurm))
    return res.exit_code, res.stdout, res.stderr


@pytest.fixture
def config(tmp_path):
    return parse_config({"metrics": {"listen_address": None}}, "t", {"OPSCTL_STATE_DIR": str(tmp_path / "state")})


def test_drain_acts_on_neither_of_two_targets_with_swapped_node_labels(config):
    slurm = FakeSlurm(gpu_nodes(64))
    prom = Swapped(config, list(slurm.state), {"gpu060": "gpu061", "gpu061": "gpu060.cluster.example"})
    prom.breach("xid-79", "gpu061", "3")  # the series of the target labelled gpu061: the host gpu060's GPU
    code, out, _ = cli(config, prom, slurm, "--drain", "--json")
    nodes = {n["node"]: n for n in json.loads(out)["nodes"]}
    assert slurm.calls == [] and code == 0
    assert (nodes["gpu060"]["action"], nodes["gpu061"]["action"]) == ("none", "skip:unknown")
    for name, other in (("gpu060", "gpu061"), ("gpu061", "gpu060")):
        assert nodes[name]["status"] == "unknown"
        [conflict] = [c for c in nodes[name]["checks"] if c["id"] == "identity-conflict"]
        assert conflict["status"] == "unknown" and name in conflict["evidence"] and other in conflict["evidence"]


class NoUp(FakeProm):
    """A Prometheus restarted without its data: no `up` series at all for `rounds_without` rounds."""

    def __init__(self, config, nodes, rounds_without=1):
        super().__init__(config, nodes)
        self.rounds_without = rounds_without
        self.everything = dict(self.up)

    def query(self, expr, at=None):
        if expr.startswith("up{") and at is None:  # a round's first read, not its pinned second
            self.up = {} if self.rounds_without > 0 else self.everything
            self.rounds_without -= 1
        if expr == "count by (job) (up)" and not self.up:
            return []
        return super().query(expr, at)


def test_a_source_without_any_up_series_is_a_source_error_exit_3_in_one_line(config):
    slurm = FakeSlurm(gpu_nodes(8))
    code, out, err = cli(config, NoUp(config, list(slurm.state)), slurm, "--drain")
    assert code == ExitCode.SOURCE_DOWN and out == "" and slurm.calls == []
    assert err.endswith("has no `up` series at all (restarted without its data, or a store is down): no target "
                        "can be judged\n") and err.count("\n") == 1


def test_missing_jobs_in_an_answer_the_source_calls_partial_are_a_source_error(config):
    prom = NoUp(config, gpu_nodes(2))
    original = prom.query
    prom.query = lambda expr, at=None: ([Sample({"job": "other"}, 1.0)] if expr == "count by (job) (up)"
                                        else original(expr, at))
    prom.partial = ["store 10.0.0.5:10901 unavailable"]
    with pytest.raises(SourceUnavailable, match="may be partial: .*store 10.0.0.5:10901 unavailable"):
        evaluate(prom, load_catalog(config), config, gpu_nodes(2))


def test_watch_goes_on_after_a_round_without_any_up_series(config):
    prom, stop, rounds, errors = NoUp(config, gpu_nodes(4)), threading.Event(), [], []
    rules = load_catalog(config)

    def run_once():
        report = evaluate(prom, rules, config, gpu_nodes(4))
        if len(rounds) == 1:
            stop.set()
        return report

    assert watch(run_once, 0.01, rounds.append, errors.append, stop) == ExitCode.OK
    assert [len(r.nodes) for r in rounds] == [4, 4] and len(errors) == 1
    assert "no `up` series at all" in errors[0] and "(exit 3); retrying in 0.01s" in errors[0]
