"""`opsctl ib fabric-test` on a fake of its Remote protocol that answers as a fabric would: a real
ib_write_bw report (tests/fixtures/infiniband) carrying the pair's bandwidth. The machines tier runs
the same command over real SSH against the lab machines' emulated ib_write_bw."""

import json
import re

import pytest
from click.testing import CliRunner

import opsctl.fabrictest.run as fabric_run
from opsctl.actor.audit import AuditLog
from opsctl.cli import main
from opsctl.clients import Clients
from opsctl.config import parse_config
from opsctl.errors import SourceUnavailable
from opsctl.fabrictest.inventory import Inventory, expand_host_pattern
from tests.conftest import FIXTURES
from tests.unit.fakes import FakeSlurm, gpu_nodes

REPORT = (FIXTURES / "infiniband" / "ib_write_bw_ib_read_bw_cx7_ndr_b2b_client.txt").read_text()
ADDRESSES = {f"gpu{i:03d}": f"10.20.1.{i}" for i in range(1, 9)}


def report(gbps: float) -> str:
    return REPORT.replace("392.38             392.34", f"{gbps + 0.04:.2f}             {gbps:.2f}")


class FakeRemote:
    """Servers wait on (host, port); a client's rate is the slower end's, as on a real fabric."""

    bad: dict[tuple[str, str], float] = {}  # (node, hca) -> what that HCA reaches
    unreachable: set[str] = set()
    wedged: set[str] = set()  # answer `true`, then no SSH request in time (ParamikoRemote's deadline error)
    commands: list[tuple[str, str]] = []

    def __init__(self, hosts):
        self.hosts = hosts
        self.by_address = {h.address: h.name for h in hosts.values()}

    def run(self, host, command, timeout):
        if host in self.unreachable:
            raise SourceUnavailable(f"{host}: host key of {self.hosts[host].address} is not in known_hosts; "
                                    "refused, never added")
        FakeRemote.commands.append((host, command))
        if command == "true":
            return 0, ""
        if host in self.wedged:
            raise SourceUnavailable(f"{host}: the exec request timed out ({timeout:g}s deadline of `{command}`)")
        hca, server = re.search(r"-d (\S+) .* (\S+)$", command).groups()
        rate = min(self.bad.get((host, hca), 392.3), self.bad.get((self.by_address[server], hca), 392.3))
        return (0, report(rate)) if rate > 0 else (1, " Completion with error at client\n")

    def start(self, host, command, ready, timeout):
        FakeRemote.commands.append((host, command))
        assert command.startswith("timeout -k 2 ") and ready == "Waiting for client"
        if host in self.wedged:
            raise SourceUnavailable(f"{host}: the exec request timed out ({timeout:g}s deadline of `{command}`)")
        return FakeRunning()

    def close(self):
        pass


class FakeRunning:
    def wait(self, timeout):
        return 0

    def close(self):
        pass


@pytest.fixture
def inventory(tmp_path):
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text(
        "ansible_user: opsadmin\nansible_ssh_common_args: -o StrictHostKeyChecking=yes "
        "-o UserKnownHostsFile=/etc/opsctl/known_hosts\n")
    hosts = "\n".join(f"            {name}: {{ansible_host: {address}}}" for name, address in ADDRESSES.items())
    (tmp_path / "hosts.yml").write_text(
        "all:\n  children:\n    cluster:\n      children:\n        controller:\n          hosts:\n"
        "            head01: {ansible_host: 10.20.0.10}\n        gpu_nodes:\n          hosts:\n" + hosts + "\n")
    return tmp_path


@pytest.fixture
def fabric(monkeypatch):
    FakeRemote.bad, FakeRemote.unreachable, FakeRemote.wedged, FakeRemote.commands = {}, set(), set(), []
    monkeypatch.setattr(fabric_run, "ParamikoRemote", FakeRemote)
    return FakeRemote


def run(tmp_path, inventory, *args, slurm=None):
    config = parse_config({}, "t", env={"OPSCTL_STATE_DIR": str(tmp_path / "state")})
    clients = Clients(config=config, slurm=slurm or FakeSlurm(gpu_nodes(8)))
    result = CliRunner().invoke(main, ["ib", "fabric-test", "--inventory", str(inventory), *args], obj=clients)
    return result, config


def test_inventory_hosts_ranges_and_connection_variables(tmp_path, inventory):
    assert expand_host_pattern("gpu[001:003]") == ["gpu001", "gpu002", "gpu003"]
    assert expand_host_pattern("rack[a:b]-n[1:2]") == ["racka-n1", "racka-n2", "rackb-n1", "rackb-n2"]
    hosts = Inventory(inventory).hosts("gpu_nodes", "gpu00[12]")
    assert [(h.name, h.address, h.user, h.known_hosts, h.port) for h in hosts] == [
        ("gpu001", "10.20.1.1", "opsadmin", "/etc/opsctl/known_hosts", 22),
        ("gpu002", "10.20.1.2", "opsadmin", "/etc/opsctl/known_hosts", 22)]


def test_a_healthy_fabric_passes_in_one_round_rail_aligned(tmp_path, inventory, fabric):
    result, _ = run(tmp_path, inventory, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert (data["verdict"], data["rounds"], data["pair_tests"], data["culprits"]) == ("pass", 1, 4, [])
    clients = [cmd for _, cmd in fabric.commands if re.search(r" 10\.20\.1\.\d+$", cmd)]
    # HCA i against HCA i, each rail on its own port (perftest's 18515 + rail), every command under timeout.
    rails = [re.search(r"^timeout -k 2 \d+ ib_write_bw -d mlx5_(\d) -p (\d+) ", cmd).groups() for cmd in clients]
    assert len(rails) == 32 and all(int(port) == 18515 + int(rail) for rail, port in rails)
    assert sorted(int(rail) for rail, _ in rails) == [rail for rail in range(8) for _ in range(4)]
    assert "head01" not in {host for host, _ in fabric.commands}


@pytest.mark.parametrize("rate,verdict", [(196.0, "slow"), (0.0, "dead")])
def test_one_bad_hca_is_named_with_its_bandwidths_and_its_partners_are_not(tmp_path, inventory, fabric, rate,
                                                                           verdict):
    fabric.bad = {("gpu003", "mlx5_2"): rate}
    result, _ = run(tmp_path, inventory, "--json")
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    assert data["culprits"] == [{"node": "gpu003", "hca": "mlx5_2", "verdict": verdict}]
    assert data["rounds"] <= 3
    node = next(n for n in data["nodes"] if n["node"] == "gpu003")
    slow = [m for m in node["hcas"][2]["measurements"] if m["gbps"] < 360]
    assert len({m["peer"] for m in slow}) >= 2 and {m["gbps"] for m in slow} == {round(rate, 2)}
    assert all(n["verdict"] == "good" for n in data["nodes"] if n["node"] != "gpu003")


def test_drain_drains_the_culprit_with_an_opsctl_reason_and_audits_it(tmp_path, inventory, fabric):
    fabric.bad = {("gpu006", "mlx5_7"): 190.0}
    slurm = FakeSlurm(gpu_nodes(8))
    result, config = run(tmp_path, inventory, "--drain", slurm=slurm)
    assert result.exit_code == 1, result.output
    reason = slurm.nodes()["gpu006"].reason
    assert reason.startswith("opsctl:ib-fabric mlx5_7 slow 190 Gb/s") and slurm.nodes()["gpu006"].drained
    assert [c[0] for c in slurm.calls] == ["drain"]
    assert f"drained gpu006: {reason}" in result.output
    records = AuditLog(config.audit_log).read()[0]
    again, _ = run(tmp_path, inventory, "--drain", "--json", slurm=FakeSlurm(gpu_nodes(8)))
    data = json.loads(again.output)
    assert (data["would"], data["refused"], data["skipped"]) == ([], {}, {})
    assert data["done"] == [f"drain gpu006: {reason}"]
    assert [(r["event"], r["node"], r["checks"]) for r in records] == [("drain", "gpu006", ["ib-fabric"])]


def test_dry_run_changes_nothing(tmp_path, inventory, fabric):
    fabric.bad = {("gpu006", "mlx5_7"): 190.0}
    slurm = FakeSlurm(gpu_nodes(8))
    result, _ = run(tmp_path, inventory, "--dry-run", slurm=slurm)
    assert result.exit_code == 1 and "would drain gpu006: opsctl:ib-fabric" in result.output
    assert slurm.calls == []


def test_a_fabric_wide_fault_drains_none_and_says_so(tmp_path, inventory, fabric):
    fabric.bad = {(f"gpu00{i}", "mlx5_0"): 0.0 for i in range(1, 9)}  # rail 0 dead everywhere: the switch
    slurm = FakeSlurm(gpu_nodes(8))
    result, _ = run(tmp_path, inventory, "--drain", slurm=slurm)
    assert result.exit_code == 4, result.output
    assert "the fault is in the fabric, not in the nodes; draining none" in result.output
    assert slurm.calls == []


def test_an_unknown_host_key_stops_the_test_before_anything_runs(tmp_path, inventory, fabric):
    fabric.unreachable = {"gpu004"}
    result, _ = run(tmp_path, inventory)
    assert result.exit_code == 3
    assert "gpu004: host key of 10.20.1.4 is not in known_hosts; refused, never added" in result.output
    assert not [c for _, c in fabric.commands if "ib_write_bw" in c]


def test_thresholds_come_from_the_config(tmp_path, inventory, fabric):
    fabric.bad = {("gpu003", "mlx5_2"): 196.0}
    config = tmp_path / "config.yaml"
    config.write_text("ib:\n  slow_gbps: 150\n")
    result = CliRunner().invoke(main, ["ib", "fabric-test", "--inventory", str(inventory), "--config", str(config)],
                                obj=Clients(slurm=FakeSlurm(gpu_nodes(8))))
    assert result.exit_code == 0, result.output
    assert "slow below 150 Gb/s" in result.output


def test_a_node_that_stops_answering_ssh_is_dead_the_run_ends_and_each_rail_is_named(tmp_path, inventory, fabric):
    fabric.wedged = {"gpu005"}
    result, _ = run(tmp_path, inventory, "--json")
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert {(c["node"], c["verdict"]) for c in data["culprits"]} == {("gpu005", "dead")}
    assert len(data["culprits"]) == 8
    warnings = result.stderr.splitlines()
    assert warnings and all(re.fullmatch(r"opsctl: warning: mlx5_\d gpu\d{3} <- gpu\d{3} not tested, counted as 0 "
                                         r"Gb/s: gpu005: the exec request timed out \(\d+s deadline of `timeout .*`\)",
                                         line) for line in warnings), warnings
    assert {line.split()[2] for line in warnings} == {f"mlx5_{rail}" for rail in range(8)}
