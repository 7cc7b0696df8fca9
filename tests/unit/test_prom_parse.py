"""The shape checks of a Prometheus query answer: anything but an instant vector of string-labelled,
numeric samples ends in one SourceUnavailable line, never in samples. NaN and infinities are kept (the
judge makes that one check unknown); `warnings` and `isPartial` mark an answer as possibly partial."""

import pytest

from opsctl.errors import ExitCode, SourceUnavailable
from opsctl.prom import answer_warnings, parse_vector, redact


def vector(*items):
    return {"status": "success", "data": {"resultType": "vector", "result": list(items)}}


@pytest.mark.parametrize("payload,message", [
    (vector({"metric": {"node": "gpu001"}, "value": [1.0, 79]}), "malformed value"),
    (vector({"metric": {"node": "gpu001"}, "value": ["1.0", "79"]}), "malformed value"),
    (vector({"metric": {"node": "gpu001"}, "value": [1.0]}), "malformed value"),
    (vector({"metric": {"node": "gpu001"}, "value": [1.0, "seventy"]}), "not a number"),
    (vector({"metric": {"node": 1}, "value": [1.0, "1"]}), "labels must be strings"),
    (vector({"value": [1.0, "1"]}), "no label set"),
    (vector("oops"), "no label set"),
    ({"status": "success", "data": {"resultType": "matrix", "result": []}}, "expected an instant vector"),
    ({"status": "success", "data": {"resultType": "vector", "result": {}}}, "expected an instant vector"),
    ({"status": "success"}, "expected an instant vector"),
    ({"status": "error", "errorType": "bad_data", "error": "parse error"}, "parse error"),
    ([1, 2, 3], "not a JSON object"),
])
def test_malformed_answers_are_refused(payload, message):
    with pytest.raises(SourceUnavailable, match=message) as err:
        parse_vector(payload, "DCGM_FI_DEV_XID_ERRORS")
    assert err.value.exit_code == ExitCode.SOURCE_DOWN
    assert "\n" not in str(err.value)
    assert "{'" not in str(err.value) and "['" not in str(err.value)  # no Python repr of labels or values


def test_good_and_empty_answers_parse():
    good = vector({"metric": {"node": "gpu001", "gpu": "3"}, "value": [1732880000.1, "79"]})
    assert [(s.labels, s.value) for s in parse_vector(good, "x")] == [({"node": "gpu001", "gpu": "3"}, 79.0)]
    assert parse_vector(vector(), "x") == []


@pytest.mark.parametrize("text", ["NaN", "+Inf", "-Inf"])
def test_nan_and_infinities_are_kept_for_the_judge(text):
    [sample] = parse_vector(vector({"metric": {"node": "gpu001"}, "value": [1.0, text]}), "x")
    assert str(sample.value) == {"NaN": "nan", "+Inf": "inf", "-Inf": "-inf"}[text]


def test_warnings_and_partial_answers_are_reported():
    assert answer_warnings(vector(), "x") == []
    thanos = {**vector(), "warnings": ["store gateway 3 unreachable"]}
    assert answer_warnings(thanos, "up") == ["'up': store gateway 3 unreachable"]
    assert answer_warnings({**vector(), "isPartial": True}, "up") == ["'up': partial response (isPartial)"]
    assert answer_warnings({**vector(), "isPartial": False}, "up") == []


@pytest.mark.parametrize("text,shown", [
    ("https://ops:hunter2@prom.example:9090", "https://***@prom.example:9090"),
    ("cannot connect to http://u:p@10.0.0.1:9090/api/v1/query?token=abc (refused)",
     "cannot connect to http://***@10.0.0.1:9090/api/v1/query?... (refused)"),
    ("http://prom:9090", "http://prom:9090"),
])
def test_credentials_in_urls_are_never_shown(text, shown):
    assert redact(text) == shown


def test_a_long_query_is_shortened_in_the_message():
    with pytest.raises(SourceUnavailable) as err:
        parse_vector([], "x" * 200)
    assert "x" * 57 + "..." in str(err.value) and "x" * 61 not in str(err.value)
