"""The LNet readers on real captures (tests/fixtures/lustre; SOURCES.md names each): `lnetctl net show`
with and without -v, `lnetctl stats show` and `lctl ping`. Input a reader does not know is an error."""

from pathlib import Path

import pytest

from opsctl.errors import SourceUnavailable
from opsctl.storage.lnet import parse_net_show, parse_ping, parse_stats_show

FIXTURES = Path(__file__).parent.parent / "fixtures" / "lustre"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_net_show_names_the_o2ib_ni_that_is_down_and_skips_the_loopback():
    nis = parse_net_show(fixture("lnetctl_net_show_o2ib_ni_down.txt"))
    assert [(ni.net_type, ni.nid, ni.status, ni.interfaces) for ni in nis] == [
        ("tcp", "10.73.20.21@tcp", "up", ("eth1", "eth2")),
        ("o2ib", "172.16.0.24@o2ib", "down", ("ib0", "ib3")),
        ("o2ib", "172.16.0.28@o2ib", "up", ("ib1", "ib4", "ib5"))]
    assert [ni.nid for ni in nis if not ni.up] == ["172.16.0.24@o2ib"]


def test_net_show_verbose_reads_the_same_nis_past_statistics_and_tunables():
    nis = parse_net_show(fixture("lnetctl_net_show_-v_tcp.txt"))
    assert [(ni.nid, ni.up, ni.interfaces) for ni in nis] == [
        ("172.16.0.24@tcp", True, ("mlxen0",)), ("172.16.0.25@tcp", True, ("mlxen1",))]


def test_net_show_orders_interfaces_by_their_index():
    text = "net:\n    - net type: o2ib\n      local NI(s):\n        - nid: 10.0.0.1@o2ib\n          status: up\n" \
           "          interfaces:\n              1: ib1\n              0: ib0\n"
    assert parse_net_show(text)[0].interfaces == ("ib0", "ib1")


@pytest.mark.parametrize("text, message", [
    ("show:\n    - net:\n          errno: -100\n", r"^lnetctl net show: expected a `net:` list"),
    ("net:\n    - local NI(s): []\n", r"^lnetctl net show: a network without a `net type`"),
    ("net:\n    - net type: tcp\n      local NI(s):\n        - nid: 10.0.0.1@tcp\n",
     r"^lnetctl net show: an NI of tcp without a nid or status"),
    ("net:\n  - net type: [tcp\n", r"^lnetctl net show line \d+: not YAML"),
])
def test_net_show_that_is_not_a_net_list_is_an_error(text, message):
    with pytest.raises(SourceUnavailable, match=message):
        parse_net_show(text)


def test_stats_show_is_a_dict_of_counters():
    stats = parse_stats_show(fixture("lnetctl_stats_show.txt"))
    assert len(stats) == 24 and all(isinstance(v, int) for v in stats.values())
    assert (stats["send_count"], stats["recv_count"], stats["drop_count"], stats["drop_length"]) == (
        1110532, 1110512, 11, 4832)
    with pytest.raises(SourceUnavailable, match=r"^lnetctl stats show: errors is not a counter: 'many'"):
        parse_stats_show("statistics:\n    errors: many\n")
    with pytest.raises(SourceUnavailable, match=r"^lnetctl stats show: expected a `statistics:` mapping"):
        parse_stats_show("net:\n    - net type: lo\n")


def pings() -> tuple[str, str, str, str]:
    """The outputs of the ping capture: three snippets apart by blank lines; the first and the last hold a
    console (`# lctl ping <nid>`, then its output), the second a success and then a failure."""
    first, second, third = fixture("lctl_ping_success_and_failure.txt").split("\n\n")
    lines = second.splitlines()
    return _after_ping(first), "\n".join(lines[:2]), lines[2], _after_ping(third)


def _after_ping(console: str) -> str:
    return console.split("# lctl ping ", 1)[1].split("\n", 1)[1]


def test_lctl_ping_of_real_answers():
    first, success, failure, joined = pings()
    result = parse_ping("192.168.3.105@tcp", first)
    assert result.reachable and result.detail == "12345-0@lo 12345-192.168.3.105@tcp 12345-192.168.3.109@tcp"
    assert parse_ping("192.168.14.121@tcp", success).reachable
    result = parse_ping("192.168.14.121@tcp", failure)
    assert (result.reachable, result.detail) == (False, "Input/output error")
    # A paste that joined the ids on one line is the same answer.
    assert parse_ping("11.11.11.34@o2ib", joined).detail == "12345-0@lo 12345-11.11.11.34@o2ib"


def test_lctl_ping_that_says_nothing_or_something_else_is_an_error():
    with pytest.raises(SourceUnavailable, match=r"^lctl ping 10.0.0.1@o2ib: no answer and no error$"):
        parse_ping("10.0.0.1@o2ib", "")
    with pytest.raises(SourceUnavailable, match=r"^lctl ping 10.0.0.1@o2ib line 1: not a process id: 'Invalid PID"):
        parse_ping("10.0.0.1@o2ib", "Invalid PID argument \"10.0.0.1@o2ib\"\n")
