"""The words for a request to Prometheus that failed: its innermost cause, as a person would say it.

requests wraps the cause several times (ConnectionError(MaxRetryError(NewConnectionError(...))), each
repr holding the one before), so the message is built from the innermost exceptions it names, never
from a repr:

  connection refused   cannot connect to URL: connection refused
  plain HTTP on https  URL is https but the server speaks plain HTTP
  untrusted cert       TLS: the certificate of URL is not trusted: <OpenSSL's words>
  not Prometheus       URL does not answer the Prometheus query API (HTTP 501 at /api/v1/query)
"""

import os
import socket
import ssl
from collections.abc import Iterator

QUERY_PATH = "/api/v1/query"
RANGE_PATH = "/api/v1/query_range"


def causes(err: BaseException) -> Iterator[BaseException]:
    """err and every exception it wraps, outermost first, each once."""
    seen: set[int] = set()
    pending = [err]
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        inner = [getattr(current, "reason", None), current.__cause__, current.__context__, *current.args]
        pending += [e for e in inner if isinstance(e, BaseException)]


def _errno_words(code: int) -> str:
    """ECONNREFUSED -> "connection refused": the C library's words, lower case."""
    return os.strerror(code).lower()


def connect_failure(url: str, err: BaseException) -> str:
    """One line for a connection that could not be made or was dropped."""
    found = list(causes(err))
    for cause in found:
        if isinstance(cause, ConnectionRefusedError):
            return f"cannot connect to {url}: connection refused"
        if isinstance(cause, socket.gaierror):
            return f"cannot connect to {url}: the host name does not resolve ({cause.strerror or 'unknown host'})"
        if isinstance(cause, ConnectionResetError | ConnectionAbortedError) or type(cause).__name__ in (
                "RemoteDisconnected", "ProtocolError") and "without response" in str(cause):
            hint = " (if it speaks TLS, use https://)" if url.startswith("http://") else ""
            return f"{url} closed the connection without answering{hint}"
    for cause in found:
        if isinstance(cause, OSError) and cause.errno is not None:
            return f"cannot connect to {url}: {_errno_words(cause.errno)}"
    return f"cannot connect to {url}: {type(found[-1]).__name__}"


def tls_failure(url: str, err: BaseException) -> str:
    """One line for a TLS handshake that failed: the certificate's problem, or plain HTTP on an https URL."""
    for cause in causes(err):
        if isinstance(cause, ssl.SSLCertVerificationError):
            words = cause.verify_message or "verification failed"
            return f"TLS: the certificate of {url} is not trusted: {words} (set prometheus.ca_bundle to its CA)"
        if isinstance(cause, ssl.SSLError) and cause.reason in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST",
                                                                "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"):
            return f"{url} is https but the server speaks plain HTTP"
    for cause in causes(err):
        if isinstance(cause, ssl.SSLError) and cause.reason:
            return f"TLS handshake with {url} failed: {cause.reason.replace('_', ' ').lower()}"
    return f"TLS handshake with {url} failed"


def is_server_trouble(status: int) -> bool:
    """A 5xx other than 501 (Not Implemented): the server, or a proxy in front of a real Prometheus, is
    in trouble. Any other status without Prometheus's JSON error body means the URL is not the query API."""
    return status >= 500 and status != 501


def not_the_query_api(url: str, status: int) -> str:
    return f"{url} does not answer the Prometheus query API (HTTP {status} at {QUERY_PATH})"
