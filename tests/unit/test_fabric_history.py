"""The fabric test's history (opsctl.fabrictest.history): the posterior of each node's HCA over the kept runs,
and `opsctl ib fabric-test` keeping, reading and acting on it (CliRunner on the fakes of test_fabric_test)."""

import json
from itertools import count

import pytest
from click.testing import CliRunner

import opsctl.fabrictest.run as fabric_run
from opsctl.cli import main
from opsctl.clients import Clients
from opsctl.config import parse_config
from opsctl.fabrictest.history import MODEL, HistoryRun, RailTest, assess, parse_runs
from opsctl.fabrictest.publish import past_runs
from tests.unit.fakes import FakeSlurm, gpu_nodes
from tests.unit.test_fabric_test import ADDRESSES, FakeRemote, inventory  # noqa: F401 (a fixture)

HCAS = ("mlx5_0",)
HEALTHY, HALF = 392.3, 196.0


def history_run(number: int, tests: list[tuple[str, str, float]], drained: tuple[str, ...] = ()) -> HistoryRun:
    """One run on rail 0: (node, partner, Gb/s) per test."""
    return HistoryRun(number, float(number), HCAS, 360.0,
                      tuple(RailTest(a, b, 0, gbps, gbps >= 360.0) for a, b, gbps in tests), drained)


def matching(run: int, nodes: list[str]) -> list[tuple[str, str]]:
    """Round robin by the circle method: a matching with new partners each run (for fewer runs than nodes)."""
    others = nodes[1:]
    turned = others[run % len(others):] + others[:run % len(others)]
    players = [nodes[0], *turned]
    return [(players[i], players[-1 - i]) for i in range(len(players) // 2)]


NODES = [f"n{i:02d}" for i in range(16)]


def runs_with(slow: dict[int, set[str]], runs: int) -> list[HistoryRun]:
    """`runs` runs of a matching each; in run r, a test of a node in slow[r] is half rate."""
    return [history_run(r, [(a, b, HALF if {a, b} & slow.get(r, set()) else HEALTHY) for a, b in matching(r, NODES)])
            for r in range(1, runs + 1)]


def test_an_intermittent_end_is_named_once_its_evidence_suffices_with_the_runs_it_rests_on():
    slow = {2: {"n00"}, 4: {"n00"}, 6: {"n00"}}  # slow in 3 of 7 runs, with a new partner each time
    runs = runs_with(slow, 7)
    after_one = assess(runs[:2])["n00", "mlx5_0"]
    assert not after_one.culprit and after_one.posterior < 0.5
    after_two = assess(runs[:4])["n00", "mlx5_0"]
    assert after_one.posterior < after_two.posterior < MODEL.culprit_posterior
    named = assess(runs[:6])["n00", "mlx5_0"]
    assert named.culprit and named.posterior >= MODEL.culprit_posterior
    assert (named.tests, named.slow_tests, named.slow_runs, named.runs) == (6, 3, [2, 4, 6], [1, 2, 3, 4, 5, 6])
    assert [k for k, e in assess(runs).items() if e.culprit] == [("n00", "mlx5_0")]


def test_a_healthy_end_that_shared_slow_tests_with_a_bad_partner_is_not_named():
    """n01 met the bad n00 in two slow tests; n00 was slow with two others as well. A vote per test would
    blame n01 as much as n00 for the shared ones; the partner's posterior explains them."""
    runs = [history_run(1, [("n00", "n01", HALF), ("n02", "n03", HEALTHY), ("n04", "n05", HEALTHY)]),
            history_run(2, [("n00", "n01", HALF), ("n02", "n04", HEALTHY), ("n03", "n05", HEALTHY)]),
            history_run(3, [("n00", "n02", HALF), ("n01", "n03", HEALTHY), ("n04", "n05", HEALTHY)]),
            history_run(4, [("n00", "n03", HALF), ("n01", "n04", HEALTHY), ("n02", "n05", HEALTHY)]),
            history_run(5, [("n00", "n04", HEALTHY), ("n01", "n05", HEALTHY), ("n02", "n03", HEALTHY)])]
    judged = assess(runs)
    assert judged["n00", "mlx5_0"].culprit
    assert judged["n01", "mlx5_0"].slow_tests == 2
    assert judged["n01", "mlx5_0"].posterior < MODEL.suspect_posterior
    assert all(not e.culprit for key, e in judged.items() if key != ("n00", "mlx5_0"))


def test_a_transient_dip_names_no_one():
    runs = runs_with({3: set()}, 6)
    dipped = runs[2].tests[0]
    runs[2] = history_run(3, [(dipped.node, dipped.partner, 355.0)] + [(t.node, t.partner, t.gbps)
                                                                       for t in runs[2].tests[1:]])
    judged = assess(runs)
    assert judged[dipped.node, "mlx5_0"].slow_tests == 1
    assert not any(e.culprit for e in judged.values())
    assert max(e.posterior for e in judged.values()) < 0.5


def test_a_dead_hca_is_named_by_the_history_of_one_run():
    runs = [history_run(1, [("n00", "n01", 0.0), ("n00", "n02", 0.0), ("n00", "n03", 0.0), ("n01", "n02", HEALTHY),
                            ("n03", "n04", HEALTHY), ("n01", "n04", HEALTHY), ("n02", "n03", HEALTHY)])]
    judged = assess(runs)
    assert [k for k, e in judged.items() if e.culprit] == [("n00", "mlx5_0")]
    assert judged["n00", "mlx5_0"].worst_gbps == 0.0


def test_a_drained_node_starts_afresh_and_its_old_tests_still_explain_its_partners():
    slow = {1: {"n00"}, 2: {"n00"}, 3: {"n00"}, 4: {"n00"}}
    runs = runs_with(slow, 4)
    assert assess(runs)["n00", "mlx5_0"].culprit
    runs[3] = HistoryRun(4, 4.0, HCAS, 360.0, runs[3].tests, drained=("n00",))
    runs += runs_with({}, 5)[4:]  # run 5: all pass
    judged = assess(runs)
    fresh = judged["n00", "mlx5_0"]
    assert (fresh.tests, fresh.slow_tests, fresh.runs) == (1, 0, [5])
    assert not any(e.culprit for e in judged.values())
    assert max(e.posterior for key, e in judged.items() if key[0] != "n00") < MODEL.suspect_posterior


@pytest.mark.parametrize("record", [{"run": 1}, {"run": 1, "time": 0, "hcas": ["mlx5_0"], "slow_gbps": 360,
                                                 "tests": ["a b 0 392.1 maybe"]},
                                    {"run": 1, "time": 0, "hcas": ["mlx5_0"], "slow_gbps": 360,
                                     "tests": ["a b 3 392.1 pass"]}])
def test_a_record_that_is_not_a_run_is_named(record):
    with pytest.raises(ValueError, match="record 1 is not a fabric-test run"):
        parse_runs([record])


def test_a_run_round_trips_through_json():
    run = history_run(3, [("n00", "n01", 196.04), ("n02", "n03", HEALTHY)], drained=("n00",))
    assert parse_runs([json.loads(json.dumps(run.to_json()))]) == [run]


# --- the command


class Flaky(dict):
    """FakeRemote.bad for intermittent HCAs: (node, hca) -> the rates of its successive tests, cycled."""

    def __init__(self, cycles: dict[tuple[str, str], list[float]]):
        super().__init__()
        self.cycles = {key: (rates, count()) for key, rates in cycles.items()}

    def get(self, key, default=None):
        if key not in self.cycles:
            return default
        rates, taken = self.cycles[key]
        return rates[next(taken) % len(rates)]


@pytest.fixture
def fabric(monkeypatch):
    FakeRemote.bad, FakeRemote.unreachable, FakeRemote.wedged, FakeRemote.commands = {}, set(), set(), []
    monkeypatch.setattr(fabric_run, "ParamikoRemote", FakeRemote)
    return FakeRemote


def fabric_test(tmp_path, inventory, *args, slurm=None):  # noqa: F811 (the fixture's value)
    config = parse_config({}, "t", env={"OPSCTL_STATE_DIR": str(tmp_path / "state")})
    clients = Clients(config=config, slurm=slurm if slurm is not None else FakeSlurm(gpu_nodes(8)))
    args = list(args) if "--history" in args else ["--inventory", str(inventory), *args]
    return CliRunner().invoke(main, ["ib", "fabric-test", *args], obj=clients)


def client_commands(fabric) -> int:
    return sum(1 for _, cmd in fabric.commands if cmd.split()[-1] in ADDRESSES.values())


def test_the_history_survives_runs_and_reads_back(tmp_path, inventory, fabric):  # noqa: F811
    first = fabric_test(tmp_path, inventory, "--json")
    assert first.exit_code == 0, first.output
    assert json.loads(first.output)["history"] == {"run": 1, "runs": 1, "rounds": 0, "pair_tests": 0, "culprits": []}
    assert client_commands(fabric) == 32  # the first run is the run alone
    second = json.loads(fabric_test(tmp_path, inventory, "--json").output)
    # From the second run on, a screening round with new partners follows the run's own.
    assert (second["rounds"], second["pair_tests"], second["history"]["rounds"]) == (1, 4, 1)
    assert second["history"]["pair_tests"] == 4 and client_commands(fabric) == 32 + 64
    shown = fabric_test(tmp_path, inventory, "--history", "--json")
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.output)
    assert [r["run"] for r in data["runs"]] == [1, 2] and [r["rail_tests"] for r in data["runs"]] == [32, 64]
    assert data["culprits"] == [] and len(data["evidence"]) == 8 * 8
    gpu001 = next(e for e in data["evidence"] if (e["node"], e["hca"]) == ("gpu001", "mlx5_0"))
    assert (gpu001["tests"], gpu001["slow_tests"], gpu001["runs"], gpu001["culprit"]) == (3, 0, [1, 2], False)
    assert gpu001["posterior"] < MODEL.prior


def test_an_intermittent_hca_is_named_by_the_history_and_drained_only_with_drain(tmp_path, inventory, fabric):  # noqa: F811
    # gpu003's mlx5_2 is slow in one test of three: one run never names it (one failure, then passes).
    fabric.bad = Flaky({("gpu003", "mlx5_2"): [HALF, HEALTHY, HEALTHY]})
    slurm = FakeSlurm(gpu_nodes(8))
    outputs = []
    for _ in range(6):
        result = fabric_test(tmp_path, inventory, "--json", slurm=slurm)
        outputs.append(json.loads(result.output))
        if outputs[-1]["history"]["culprits"]:
            break
    last = outputs[-1]
    assert [(c["node"], c["hca"]) for c in last["history"]["culprits"]] == [("gpu003", "mlx5_2")], outputs
    assert all(o["culprits"] == [] for o in outputs)  # each run's own verdict is as before
    assert result.exit_code == 1 and last["verdict"] == "pass"
    named = last["history"]["culprits"][0]
    assert named["slow_tests"] >= 2 and len(named["slow_runs"]) >= 2 and named["posterior"] >= 0.99
    assert slurm.calls == []  # nothing is drained without --drain

    table = fabric_test(tmp_path, inventory, "--history")
    assert table.exit_code == 1, table.output
    lines = table.output.splitlines()
    assert lines[2].split()[:3] == ["gpu003", "mlx5_2", "culprit"]
    assert "other node HCAs passed every test" in lines[-1]

    drained = fabric_test(tmp_path, inventory, "--drain", slurm=slurm)
    reason = slurm.nodes()["gpu003"].reason
    assert reason.startswith("opsctl:ib-fabric mlx5_2 from history: slow in "), drained.output
    assert [c[0] for c in slurm.calls] == ["drain"] and f"drained gpu003: {reason}" in drained.output
    after = json.loads(fabric_test(tmp_path, inventory, "--history", "--json").output)
    assert after["runs"][-1]["drained"] == ["gpu003"]
    assert after["culprits"] == []  # drained: its evidence starts afresh


@pytest.mark.parametrize("content,why", [("{not json", "is unreadable"),
                                         ('{"runs": []}', "not a fabric-test history"),
                                         ('{"format": "opsctl-fabric-test-history/1", "runs": [{"run": "x"}]}',
                                          "record 1 is not a fabric-test run")])
def test_a_corrupt_or_foreign_history_is_a_one_line_error(tmp_path, inventory, fabric, content, why):  # noqa: F811
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "fabric-test-history.json").write_text(content)
    shown = fabric_test(tmp_path, inventory, "--history")
    assert shown.exit_code == 2 and len(shown.output.strip().splitlines()) == 1 and why in shown.output, shown.output
    assert "fabric-test-history.json" in shown.output
    acting = fabric_test(tmp_path, inventory, "--drain")
    assert acting.exit_code == 2 and why in acting.output and client_commands(fabric) == 0
    # A read-only run goes on without the history, says so, and leaves the file as it was.
    plain = fabric_test(tmp_path, inventory)
    assert plain.exit_code == 0 and "history is neither used nor kept in this run" in plain.stderr
    assert (state / "fabric-test-history.json").read_text() == content


@pytest.mark.parametrize("args,words", [(["--history", "--drain"], "drop --drain"),
                                        (["--history", "--inventory", "."], "drop --inventory"),
                                        ([], "Missing option '--inventory'")])
def test_history_takes_no_test_options_and_a_test_needs_an_inventory(tmp_path, args, words):
    config = parse_config({}, "t", env={"OPSCTL_STATE_DIR": str(tmp_path / "state")})
    result = CliRunner().invoke(main, ["ib", "fabric-test", *args], obj=Clients(config=config, slurm=FakeSlurm([])))
    assert result.exit_code == 2 and words in result.output, result.output


def test_an_empty_history_shows_no_run(tmp_path):
    config = parse_config({}, "t", env={"OPSCTL_STATE_DIR": str(tmp_path / "state")})
    result = CliRunner().invoke(main, ["ib", "fabric-test", "--history"],
                                obj=Clients(config=config, slurm=FakeSlurm([])))
    assert result.exit_code == 0 and result.output.strip() == "fabric-test history: no run kept yet"


def test_the_pictures_history_strip_shows_each_kept_run_with_the_historys_culprit_marked():
    runs = runs_with({run: {"n03"} for run in (1, 3, 4, 6)}, 7)
    strip = past_runs(runs)
    assert [band.label.split(",")[0] for band in strip] == [f"run {n}" for n in range(1, 8)]
    # n03 is the history's culprit: marked in every run that tested it; its partners are not.
    assert all(band.culprits == {("n03", 0)} for band in strip)
    slow = sorted(node for (node, _), gbps in strip[0].gbps.items() if gbps < 360.0)  # run 1: n03 and its partner
    assert "n03" in slow and len(slow) == 2 and all(gbps >= 360.0 for gbps in strip[1].gbps.values())
