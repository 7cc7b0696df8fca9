"""A webhook receiver for Alertmanager's notifications, and Alertmanager's API as the tests use it
(tests/component/test_alertmanager.py, tests/integration/provision/test_provision_5_observability.py)."""

import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler


class Webhook:
    """Records every notification Alertmanager posts to http://<address>:<port>/..."""

    def __init__(self, address: str = "127.0.0.1", port: int = 0):
        from opsctl_lab.dcgm_emulator import QuietHTTPServer  # the lab's fast-binding server

        self.received: list[dict] = []
        self.lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with hook.lock:
                    hook.received.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = QuietHTTPServer((address, port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://{address}:{self.server.server_port}/alerts"

    def groups(self) -> dict:
        """groupLabels (a sorted tuple) -> the (alertname, gpu) of every alert notified in that group."""
        found: dict = {}
        with self.lock:
            for note in self.received:
                key = tuple(sorted(note["groupLabels"].items()))
                found.setdefault(key, set()).update((a["labels"]["alertname"], a["labels"].get("gpu", ""))
                                                    for a in note["alerts"])
        return found

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def post_alerts(url: str, *alerts: dict, ends_at: str | None = None) -> None:
    """Send alerts to Alertmanager's API as Prometheus does; `ends_at` (RFC 3339) resolves them then."""
    body = json.dumps([{"labels": labels, **({"endsAt": ends_at} if ends_at else {})} for labels in alerts]).encode()
    request = urllib.request.Request(f"{url}/api/v2/alerts", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200


def alert_states(url: str, node: str) -> dict:
    """alertname -> active or suppressed, for Alertmanager's alerts of one node."""
    try:
        with urllib.request.urlopen(f"{url}/api/v2/alerts?filter=node%3D%22{node}%22", timeout=10) as resp:
            alerts = json.load(resp)
    except OSError:
        return {}
    return {a["labels"]["alertname"]: a["status"]["state"] for a in alerts}
