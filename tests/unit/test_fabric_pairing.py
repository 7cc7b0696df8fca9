"""The ib_write_bw pairing scheduler (opsctl.fabrictest.pairing) on simulated fabrics."""

from collections.abc import Callable

import pytest

from opsctl.fabrictest.pairing import Isolator, Measurement, RailVerdict, Test, Thresholds, isolate

HEALTHY_GBPS = 392.34  # CX-7 NDR back to back, ib_write_bw --report_gbits at 65536 B (tests/fixtures)
RAILS = 8


def nodes(count: int) -> list[str]:
    return [f"gpu{i:03d}" for i in range(count)]


def fabric(rates: dict[tuple[str, int], float], seen: list[list[Test]] | None = None,
           sequence: dict[tuple[str, int], list[float]] | None = None) -> Callable[[list[Test]], list[Measurement]]:
    """A measure(): a rail's value is the slower end's rate; unlisted HCAs are healthy. `sequence`
    gives an HCA one rate per test it takes part in (an intermittent fault), then healthy."""
    def rate(node: str, rail: int) -> float:
        if sequence and sequence.get((node, rail)):
            return sequence[node, rail].pop(0)
        return rates.get((node, rail), HEALTHY_GBPS)

    def measure(tests: list[Test]) -> list[Measurement]:
        if seen is not None:
            seen.append(tests)
        return [Measurement(t.a, t.b, rail, min(rate(t.a, rail), rate(t.b, rail)))
                for t in tests for rail in range(RAILS)]

    return measure


def named(verdicts: dict[str, dict[int, RailVerdict]]) -> dict[tuple[str, int], str]:
    """The node-rails whose verdict is not good."""
    return {(node, rail): v.verdict for node, rails in verdicts.items() for rail, v in rails.items()
            if v.verdict != "good"}


def first_round_partner(node: str, all_nodes: list[str], seed: int = 0) -> str:
    test = next(t for t in Isolator(all_nodes, seed=seed).next_round() if node in (t.a, t.b))
    return test.b if test.a == node else test.a


def test_healthy_fabric_is_all_good_in_one_round():
    isolator = Isolator(nodes(16))
    tests = isolator.next_round()
    assert sorted(n for t in tests for n in (t.a, t.b)) == nodes(16)  # a perfect matching
    isolator.record(fabric({})(tests))
    assert isolator.next_round() == [] and isolator.rounds == 1
    verdicts = isolator.verdicts()
    assert named(verdicts) == {}
    assert all(len(v.evidence) == 1 and v.evidence[0].gbps == HEALTHY_GBPS
               for rails in verdicts.values() for v in rails.values())


@pytest.mark.parametrize("seed", range(5))
def test_one_dead_hca_is_named_and_its_partner_is_not(seed):
    all_nodes = nodes(16)
    culprit = all_nodes[5]
    partner = first_round_partner(culprit, all_nodes, seed)
    verdicts, rounds = isolate(all_nodes, fabric({(culprit, 3): 0.0}), seed=seed)
    assert named(verdicts) == {(culprit, 3): "dead"}
    assert rounds <= 3
    assert verdicts[partner][3].verdict == "good"
    # the evidence: the failure shared with the first partner, and one against a proven partner
    assert [m.gbps for m in verdicts[culprit][3].evidence] == [0.0, 0.0]


def test_half_rate_hca_is_slow():
    all_nodes = nodes(10)
    verdicts, rounds = isolate(all_nodes, fabric({(all_nodes[7], 0): 196.2}))
    assert named(verdicts) == {(all_nodes[7], 0): "slow"} and rounds <= 3


def test_two_bad_nodes_paired_with_each_other_are_both_named():
    all_nodes = nodes(12)
    a = all_nodes[0]
    b = first_round_partner(a, all_nodes)
    verdicts, rounds = isolate(all_nodes, fabric({(a, 2): 0.0, (b, 2): 196.2}))
    assert named(verdicts) == {(a, 2): "dead", (b, 2): "slow"}
    assert rounds == 3  # round 2 shows each one failing once against a proven node; round 3 confirms


def test_two_bad_nodes_on_different_rails():
    all_nodes = nodes(12)
    a = all_nodes[0]
    b = first_round_partner(a, all_nodes)
    verdicts, rounds = isolate(all_nodes, fabric({(a, 1): 0.0, (b, 6): 0.0}))
    assert named(verdicts) == {(a, 1): "dead", (b, 6): "dead"} and rounds <= 3


@pytest.mark.parametrize("count", [3, 7, 15])
def test_odd_node_count_tests_every_node(count):
    all_nodes = nodes(count)
    verdicts, rounds = isolate(all_nodes, fabric({}))
    assert named(verdicts) == {} and rounds == 2  # the node left out of round 1 goes in round 2
    assert all(v.evidence for rails in verdicts.values() for v in rails.values())
    for culprit in (all_nodes[0], all_nodes[-1]):
        verdicts, rounds = isolate(all_nodes, fabric({(culprit, 4): 0.0}))
        assert named(verdicts) == {(culprit, 4): "dead"} and rounds <= 3


def test_a_node_is_in_at_most_one_test_per_round():
    all_nodes = nodes(21)
    bad = {(all_nodes[0], 0): 0.0, (all_nodes[1], 0): 0.0, (all_nodes[2], 5): 150.0, (all_nodes[3], 7): 0.0}
    seen: list[list[Test]] = []
    isolate(all_nodes, fabric(bad, seen), max_rounds=6)
    assert len(seen) >= 2
    for tests in seen:
        in_round = [n for t in tests for n in (t.a, t.b)]
        assert len(in_round) == len(set(in_round))
        assert all(t.a != t.b for t in tests)


def test_retests_are_against_a_new_partner():
    all_nodes = nodes(8)
    seen: list[list[Test]] = []
    isolate(all_nodes, fabric({(all_nodes[2], 1): 0.0}, seen))
    pairs = [frozenset((t.a, t.b)) for tests in seen for t in tests]
    assert len(seen) == 2 and len(pairs) == len(set(pairs))


def test_thresholds_are_configurable():
    all_nodes = nodes(8)
    rates = {(all_nodes[3], 2): 200.0}
    assert named(isolate(all_nodes, fabric(rates))[0]) == {(all_nodes[3], 2): "slow"}
    verdicts, rounds = isolate(all_nodes, fabric(rates), thresholds=Thresholds(slow_gbps=100.0))
    assert named(verdicts) == {} and rounds == 1
    # dead_gbps decides dead from slow
    verdicts, _ = isolate(all_nodes, fabric(rates), thresholds=Thresholds(slow_gbps=360.0, dead_gbps=250.0))
    assert named(verdicts) == {(all_nodes[3], 2): "dead"}


def test_every_node_gets_a_verdict_per_rail():
    for count in (1, 2, 5, 8):
        all_nodes = nodes(count)
        verdicts, _ = isolate(all_nodes, fabric({(all_nodes[0], 0): 0.0}), rails=RAILS)
        assert set(verdicts) == set(all_nodes)
        assert all(set(rails) == set(range(RAILS)) for rails in verdicts.values())


def test_unresolvable_is_unknown_not_a_guess():
    # two nodes: a failure cannot be pinned on either end
    verdicts, _ = isolate(nodes(2), fabric({("gpu000", 4): 0.0}))
    assert named(verdicts) == {("gpu000", 4): "unknown", ("gpu001", 4): "unknown"}
    # a node alone is never tested
    assert named(isolate(nodes(1), fabric({}))[0]) == {("gpu000", rail): "unknown" for rail in range(RAILS)}


def test_a_single_dip_names_no_one():
    # a healthy pair that once measures 355 Gb/s (a transient): both ends retested, both cleared
    all_nodes = nodes(8)
    a = all_nodes[4]
    verdicts, rounds = isolate(all_nodes, fabric({}, sequence={(a, 6): [355.0]}))
    assert named(verdicts) == {} and rounds == 3  # cleared after two passes (clear_passes)
    assert verdicts[a][6].evidence[0].gbps == 355.0


def test_intermittent_hca_that_fails_again_is_named():
    all_nodes = nodes(10)
    a = all_nodes[3]
    # slow, passes its first retest, slow again on its second: failed against two partners
    verdicts, rounds = isolate(all_nodes, fabric({}, sequence={(a, 5): [196.0, HEALTHY_GBPS, 196.0]}))
    assert named(verdicts) == {(a, 5): "slow"} and rounds == 3


def test_max_rounds_leaves_the_open_ones_unknown():
    all_nodes = nodes(8)
    a = all_nodes[0]
    b = first_round_partner(a, all_nodes)
    verdicts, rounds = isolate(all_nodes, fabric({(a, 0): 0.0}), max_rounds=1)
    assert rounds == 1 and named(verdicts) == {(a, 0): "unknown", (b, 0): "unknown"}


def test_next_round_before_record_repeats_the_round_and_record_checks_tests():
    isolator = Isolator(nodes(4))
    tests = isolator.next_round()
    assert isolator.next_round() == tests and isolator.rounds == 1
    with pytest.raises(ValueError):
        isolator.record([Measurement("gpu000", "gpu000", 0, 392.0)])


def test_screen_rounds_test_everyone_with_new_partners():
    all_nodes = nodes(8)
    isolator = Isolator(all_nodes, screen_rounds=3)
    measure = fabric({})
    pairs = []
    while tests := isolator.next_round():
        isolator.record(measure(tests))
        pairs += [frozenset((t.a, t.b)) for t in tests]
    assert isolator.rounds == 3 and len(pairs) == 12 and len(set(pairs)) == 12
