"""The Prometheus client against a real local HTTP(S) server that answers what each test sets:
HTTP errors, bad JSON, slow answers, TLS trouble, credentials. Every failure must end in one clear
SourceUnavailable line, never in samples. (The shape checks of an answer: tests/unit/test_prom_parse.py.)"""

import json
import shutil
import ssl
import subprocess
import time

import pytest

from opsctl.errors import SourceUnavailable
from opsctl.prom import PromClientImpl
from tests.component.promlab import GOOD, FakeProm


@pytest.fixture
def prom():
    server = FakeProm()
    yield server
    server.close()


def answer(prom, payload, status=200):
    prom.answer = (status, payload if isinstance(payload, bytes) else json.dumps(payload).encode())


def test_good_answer_parses(prom):
    samples = PromClientImpl(prom.url).query("up")
    assert [(s.labels, s.value) for s in samples] == [({"node": "gpu001", "gpu": "3"}, 79.0)]
    path, _, body = prom.requests[0]
    assert path == "/api/v1/query" and body == "query=up"


def test_truncated_json_is_refused(prom):
    answer(prom, json.dumps(GOOD).encode()[:40])
    with pytest.raises(SourceUnavailable, match="not valid JSON"):
        PromClientImpl(prom.url).query("up")


@pytest.mark.parametrize("status", [500, 502, 503, 422])
def test_http_errors_are_refused(prom, status):
    answer(prom, {"status": "error", "error": "query processing would load too many samples"}, status)
    with pytest.raises(SourceUnavailable, match=f"HTTP {status}"):
        PromClientImpl(prom.url).query("up")


def test_html_error_page_is_refused(prom):
    answer(prom, b"<html>bad gateway</html>", 502)
    with pytest.raises(SourceUnavailable, match="HTTP 502$"):
        PromClientImpl(prom.url).query("up")


def test_timeout_is_refused(prom):
    prom.delay = 2.0
    started = time.monotonic()
    with pytest.raises(SourceUnavailable, match="timed out after 0.5s"):
        PromClientImpl(prom.url, read_timeout=0.5).query("up")
    assert time.monotonic() - started < 2.0


def test_connection_refused():
    server = FakeProm()
    url = server.url
    server.close()
    server.server.server_close()
    with pytest.raises(SourceUnavailable) as err:
        PromClientImpl(url, connect_timeout=1).query("up")
    assert str(err.value) == f"cannot connect to {url}: connection refused"


@pytest.mark.parametrize("status", [501, 404, 405])
def test_a_url_that_is_not_prometheus_says_so(prom, status):
    answer(prom, b"<html>Unsupported method</html>", status)
    with pytest.raises(SourceUnavailable) as err:
        PromClientImpl(prom.url).query("up")
    assert str(err.value) == f"{prom.url} does not answer the Prometheus query API (HTTP {status} at /api/v1/query)"


def test_https_against_plain_http_says_so(prom):
    url = prom.url.replace("http://", "https://")
    with pytest.raises(SourceUnavailable) as err:
        PromClientImpl(url).query("up")
    assert str(err.value) == f"{url} is https but the server speaks plain HTTP"


def test_bearer_token_is_sent_and_never_shown(prom, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cr3t-token\n")
    answer(prom, {"status": "error", "error": "nope"}, 401)
    with pytest.raises(SourceUnavailable) as err:
        PromClientImpl(prom.url, bearer_token_file=str(token)).query("up")
    assert prom.requests[0][1]["Authorization"] == "Bearer s3cr3t-token"
    assert "s3cr3t" not in str(err.value) and "HTTP 401" in str(err.value)


def test_basic_auth_is_sent_and_never_shown(prom, tmp_path):
    pw = tmp_path / "pw"
    pw.write_text("hunter2")
    answer(prom, b"", 403)
    with pytest.raises(SourceUnavailable) as err:
        PromClientImpl(prom.url, username="ops", password_file=str(pw)).query("up")
    assert prom.requests[0][1]["Authorization"] == "Basic b3BzOmh1bnRlcjI="  # base64("ops:hunter2")
    assert "hunter2" not in str(err.value)


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(d / "key.pem"), "-out",
                    str(d / "cert.pem")], check=True, capture_output=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(d / "cert.pem", d / "key.pem")
    server = FakeProm(tls_context=ctx)
    yield server, d / "cert.pem"
    server.close()


def test_tls_with_the_right_ca_bundle_works(tls):
    server, cert = tls
    assert PromClientImpl(server.url, ca_bundle=str(cert)).query("up")[0].value == 79.0


def test_tls_with_an_unknown_certificate_is_refused(tls):
    server, _ = tls
    with pytest.raises(SourceUnavailable) as err:
        PromClientImpl(server.url).query("up")
    assert str(err.value) == (f"TLS: the certificate of {server.url} is not trusted: self-signed certificate "
                              "(set prometheus.ca_bundle to its CA)")


def test_plain_http_to_a_tls_port_is_refused(tls):
    server, _ = tls
    url = server.url.replace("https", "http")
    with pytest.raises(SourceUnavailable) as err:
        PromClientImpl(url, read_timeout=2).query("up")
    assert str(err.value) == f"{url} closed the connection without answering (if it speaks TLS, use https://)"


def test_query_many_keeps_order_and_fails_as_a_whole(prom):
    client = PromClientImpl(prom.url, parallel=3)
    answers = client.query_many(["a", "b", "c", "d"])
    assert len(answers) == 4 and client.queries == 4
    assert sorted(body for _, _, body in prom.requests) == ["query=a", "query=b", "query=c", "query=d"]
    answer(prom, b"oops", 500)
    with pytest.raises(SourceUnavailable, match="HTTP 500"):
        client.query_many(["a", "b", "c"])


def test_a_query_at_a_moment_sends_it_as_the_time_parameter(prom):
    client = PromClientImpl(prom.url, parallel=2)
    client.query_many(["a", "b"], at=1750000123.25)
    client.query("c")
    assert sorted(body for _, _, body in prom.requests) == ["query=a&time=1750000123.250",
                                                             "query=b&time=1750000123.250", "query=c"]


def test_warnings_of_a_partial_answer_are_collected(prom):
    answer(prom, {**GOOD, "warnings": ["store 10.0.0.7:10901 is down: partial data"]})
    client = PromClientImpl(prom.url)
    assert client.query("up") and client.warnings == ["'up': store 10.0.0.7:10901 is down: partial data"]


def test_credentials_in_the_url_never_reach_the_message():
    from tests.component.promlab import free_port

    with pytest.raises(SourceUnavailable) as err:
        PromClientImpl(f"http://ops:hunter2@127.0.0.1:{free_port()}/?token=s3cret").query("up")
    assert "hunter2" not in str(err.value) and "s3cret" not in str(err.value)
    assert "http://***@127.0.0.1" in str(err.value)
