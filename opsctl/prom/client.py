"""Instant PromQL queries (and range queries) over HTTP, with every answer checked before anyone acts on it.

An answer looks like (Prometheus HTTP API, /api/v1/query):
  {"status": "success", "data": {"resultType": "vector",
   "result": [{"metric": {"node": "gpu001", "gpu": "3"}, "value": [1732880000.123, "79"]}]},
   "warnings": ["..."]}
Anything else (HTTP error, timeout, TLS failure, bad JSON, wrong types, a non-vector result) raises
SourceUnavailable with one line that names the query, so no decision is made on it. A value of NaN,
+Inf or -Inf is kept as it is: the judge makes that one check unknown.

`warnings` (Thanos, Mimir) and `isPartial: true` (VictoriaMetrics) say that the answer may lack data;
they are collected in the client's `warnings`, and a run that has any acts on nothing.
"""

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import requests

from opsctl.config.schema import PrometheusConfig
from opsctl.errors import SourceUnavailable, redact
from opsctl.fileio import read_secret
from opsctl.prom.failure import (
    QUERY_PATH,
    RANGE_PATH,
    connect_failure,
    is_server_trouble,
    not_the_query_api,
    tls_failure,
)


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float
    at: float = field(default=0.0, compare=False)  # the time the answer is for (Unix seconds)


@dataclass(frozen=True)
class Series:
    """One series of a range query: its (Unix time, value) points, oldest first."""

    labels: dict[str, str]
    points: tuple[tuple[float, float], ...]


class PromQuery(Protocol):
    """Runs instant queries, at the server's present or, with `at`, at that Unix time; raises
    SourceUnavailable on any failure. Answers that the server marks as possibly partial add a line to
    `warnings`."""

    queries: int
    warnings: list[str]

    def query(self, expr: str, at: float | None = None) -> list[Sample]: ...

    def query_many(self, exprs: list[str], at: float | None = None) -> list[list[Sample]]: ...


class PromRangeQuery(PromQuery, Protocol):
    """Range queries too: `opsctl why` reads what happened over a job's time."""

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]: ...


def _short(expr: str) -> str:
    return expr if len(expr) <= 60 else expr[:57] + "..."


def answer_warnings(payload: object, expr: str) -> list[str]:
    """The server's own words that an answer may be incomplete (an empty list when it is whole)."""
    if not isinstance(payload, dict):
        return []
    found = [str(w) for w in payload.get("warnings") or [] if w]
    if payload.get("isPartial") is True:
        found.append("partial response (isPartial)")
    return [f"{_short(expr)!r}: {w}" for w in found]


def _series(labels: dict[str, str]) -> str:
    """A label set as PromQL writes it: {node="gpu001", gpu="3"} (a message holds no Python repr)."""
    return "{" + ", ".join(f"{k}={json.dumps(v)}" for k, v in labels.items()) + "}"


def _results(payload: object, expr: str, kind: str) -> list[tuple[dict[str, str], dict[str, object]]]:
    """(labels, entry) of each result of an answer of result type `kind` (vector or matrix), checked."""
    where = f"Prometheus answer to {_short(expr)!r}"
    if not isinstance(payload, dict):
        raise SourceUnavailable(f"{where}: not a JSON object")
    if payload.get("status") != "success":
        error = payload.get("error") or payload.get("status")
        raise SourceUnavailable(f"{where}: status {error}")
    data = payload.get("data")
    if not isinstance(data, dict) or data.get("resultType") != kind or not isinstance(data.get("result"), list):
        got = data.get("resultType") if isinstance(data, dict) else type(data).__name__
        raise SourceUnavailable(f"{where}: expected {'an instant vector' if kind == 'vector' else 'a range'}, "
                                f"got {got}")
    found = []
    for item in data["result"]:
        labels = item.get("metric") if type(item) is dict else None
        if type(labels) is not dict:
            raise SourceUnavailable(f"{where}: a result entry has no label set")
        # The answer is the caller's own, freshly decoded: its label sets are kept, not copied. Tens of
        # thousands of series at a time, so the plain type() tests.
        for key, value in labels.items():
            if type(key) is not str or type(value) is not str:
                raise SourceUnavailable(f"{where}: labels must be strings in {json.dumps(labels)}")
        found.append((labels, item))
    return found


def _point(value: object, labels: dict[str, str], expr: str) -> tuple[float, float]:
    where = f"Prometheus answer to {_short(expr)!r}"
    # The API sends [unix_time, "value as string"]; a bare number is a broken or foreign server.
    if (not isinstance(value, list) or len(value) != 2 or not isinstance(value[1], str)
            or isinstance(value[0], bool) or not isinstance(value[0], int | float)):
        raise SourceUnavailable(f"{where}: malformed value {json.dumps(value)} for {_series(labels)}")
    try:
        return float(value[0]), float(value[1])  # "NaN", "+Inf" and "-Inf" too: judged unknown, never ok
    except ValueError:
        raise SourceUnavailable(f"{where}: value {json.dumps(value[1])} is not a number for {_series(labels)}") \
            from None


def parse_vector(payload: object, expr: str) -> list[Sample]:
    """Check the shape of a query answer strictly and return its samples."""
    samples = []
    for labels, item in _results(payload, expr, "vector"):
        value = item.get("value")
        # The usual [1732880000.123, "79"] without a call; anything else gets _point's checks and message.
        if (type(value) is list and len(value) == 2 and type(value[1]) is str
                and (type(value[0]) is float or type(value[0]) is int)):
            try:
                samples.append(Sample(labels, float(value[1]), float(value[0])))
                continue
            except ValueError:
                pass
        at, number = _point(value, labels, expr)
        samples.append(Sample(labels=labels, value=number, at=at))
    return samples


def parse_matrix(payload: object, expr: str) -> list[Series]:
    """Check the shape of a range query's answer (/api/v1/query_range) strictly and return its series."""
    series = []
    for labels, item in _results(payload, expr, "matrix"):
        values = item.get("values")
        if not isinstance(values, list):
            raise SourceUnavailable(f"Prometheus answer to {_short(expr)!r}: no values for {_series(labels)}")
        series.append(Series(labels=labels, points=tuple(_point(v, labels, expr) for v in values)))
    return series


class PromClientImpl:
    """Talks to one Prometheus. Secrets are read from files and never appear in messages."""

    def __init__(self, url: str, bearer_token_file: str | None = None, username: str | None = None,
                 password_file: str | None = None, ca_bundle: str | None = None,
                 connect_timeout: float = 3.0, read_timeout: float = 15.0, parallel: int = 4):
        self.url = url.rstrip("/")
        self.shown_url = redact(self.url)
        self.timeout = (connect_timeout, read_timeout)
        self.parallel = max(1, parallel)
        self.queries = 0
        self.warnings: list[str] = []
        self._count = threading.Lock()
        self._local = threading.local()
        self._verify: str | bool = ca_bundle if ca_bundle else True
        self._headers: dict[str, str] = {}
        self._auth: tuple[str, str] | None = None
        if bearer_token_file:
            token = read_secret(bearer_token_file, "prometheus.bearer_token_file")
            self._headers["Authorization"] = f"Bearer {token}"
        if username:
            self._auth = (username, read_secret(password_file, "prometheus.basic_auth.password_file"))

    @property
    def session(self) -> requests.Session:
        """One session per thread: requests does not promise that a Session is thread-safe."""
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            # Only settings passed here apply: no netrc or proxy variables sneak credentials in.
            session.trust_env = False
            session.verify = self._verify
            session.headers.update(self._headers)
            session.auth = self._auth
            self._local.session = session
        return session

    @classmethod
    def from_config(cls, prom: PrometheusConfig, url_override: str | None = None) -> "PromClientImpl":
        return cls(url_override or prom.url, prom.bearer_token_file, prom.basic_auth.username,
                   prom.basic_auth.password_file, prom.ca_bundle, prom.connect_timeout_seconds, prom.timeout_seconds,
                   prom.parallel_queries)

    def query_many(self, exprs: list[str], at: float | None = None) -> list[list[Sample]]:
        """All answers in order, a few at a time; the first failure is raised and nothing is returned."""
        if self.parallel == 1 or len(exprs) < 2:
            return [self.query(expr, at) for expr in exprs]
        with ThreadPoolExecutor(max_workers=self.parallel) as pool:
            return list(pool.map(lambda expr: self.query(expr, at), exprs))

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        form = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        return parse_vector(self._post(QUERY_PATH, form, expr), expr)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        form = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return parse_matrix(self._post(RANGE_PATH, form, expr), expr)

    def _post(self, path: str, form: dict[str, str], expr: str) -> object:
        """The answer's JSON, whatever its result type; each failure raised as one line. An answer that the
        server marks as possibly partial adds to `warnings`."""
        with self._count:
            self.queries += 1
        where = f"Prometheus at {self.shown_url}"
        try:
            resp = self.session.post(f"{self.url}{path}", data=form, timeout=self.timeout)
        except requests.exceptions.SSLError as err:
            raise SourceUnavailable(redact(tls_failure(self.shown_url, err))) from None
        except requests.exceptions.Timeout:
            raise SourceUnavailable(f"{where}: timed out after {self.timeout[1]:g}s") from None
        except requests.exceptions.ConnectionError as err:
            raise SourceUnavailable(redact(connect_failure(self.shown_url, err))) from None
        except requests.exceptions.RequestException as err:
            raise SourceUnavailable(f"{where}: request failed ({type(err).__name__})") from None
        if resp.status_code in (401, 403):
            raise SourceUnavailable(f"{where}: HTTP {resp.status_code} (check the token or basic auth)")
        try:
            payload = resp.json()
        except ValueError:
            payload = None
        # Prometheus answers 400/422/503 with a JSON error body ({"status": "error", "error": ...}); pass its
        # message on. Without that body, only a server error (5xx but 501) may come from a Prometheus
        # behind the URL.
        if resp.status_code != 200:
            prometheus_error = isinstance(payload, dict) and payload.get("status") == "error"
            if not prometheus_error and not is_server_trouble(resp.status_code):
                raise SourceUnavailable(not_the_query_api(self.shown_url, resp.status_code))
            detail = payload.get("error") if isinstance(payload, dict) else None
            raise SourceUnavailable(f"{where}: HTTP {resp.status_code}" + (f" ({detail})" if detail else ""))
        if payload is None:
            raise SourceUnavailable(f"{where}: answer to {_short(expr)!r} is not valid JSON")
        partial = answer_warnings(payload, expr)
        if partial:
            with self._count:
                self.warnings.extend(partial)
        return payload


