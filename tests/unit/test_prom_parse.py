"""The shape checks of a Prometheus query answer: anything but an instant vector of string-labelled,
numeric, non-NaN samples ends in one SourceUnavailable line, never in samples."""

import pytest

from opsctl.errors import ExitCode, SourceUnavailable
from opsctl.prom import parse_vector


def vector(*items):
    return {"status": "success", "data": {"resultType": "vector", "result": list(items)}}


@pytest.mark.parametrize("payload,message", [
    (vector({"metric": {"node": "gpu001"}, "value": [1.0, "NaN"]}), "NaN"),
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


def test_good_and_empty_answers_parse():
    good = vector({"metric": {"node": "gpu001", "gpu": "3"}, "value": [1732880000.1, "79"]})
    assert [(s.labels, s.value) for s in parse_vector(good, "x")] == [({"node": "gpu001", "gpu": "3"}, 79.0)]
    assert parse_vector(vector(), "x") == []


def test_a_long_query_is_shortened_in_the_message():
    with pytest.raises(SourceUnavailable) as err:
        parse_vector([], "x" * 200)
    assert "x" * 57 + "..." in str(err.value) and "x" * 61 not in str(err.value)
