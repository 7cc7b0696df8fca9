"""A small real monitoring stack for unit tests: a real Prometheus scraping, every second,
dcgm-exporter-format endpoints (rendered by the lab's emulator from a NodeHardware model that a test
changes in memory) and the real node_exporter reading the lab's emulated InfiniBand sysfs tree.
"""

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from opsctl_lab.dcgm_emulator import METRICS_CONTENT_TYPE, QuietHTTPServer, render, send_body
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.ib_sysfs import write_tree

HAVE_PROMETHEUS = shutil.which("prometheus") is not None
HAVE_NODE_EXPORTER = shutil.which("prometheus-node-exporter") is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(handler_cls) -> QuietHTTPServer:
    server = QuietHTTPServer(("127.0.0.1", 0), handler_cls)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class DcgmEndpoint:
    """Serves render(hw) for one node; set .hw or .hw.inject(...) between scrapes."""

    def __init__(self, node: str):
        self.hw = NodeHardware(node=node)
        self.down = False
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                if endpoint.down:
                    self.send_error(503)
                    return
                send_body(self, 200, render(endpoint.hw).encode(), METRICS_CONTENT_TYPE)

            def log_message(self, *args):
                pass

        self.server = serve(Handler)
        self.address = f"127.0.0.1:{self.server.server_port}"


class NodeExporter:
    """The real node_exporter with only the infiniband collector, over an emulated sysfs tree."""

    def __init__(self, node: str, root: Path, hw: NodeHardware):
        self.root = root / "sysfs" / node
        self.hw = hw
        write_tree(self.root, hw)
        self.address = f"127.0.0.1:{free_port()}"
        self.proc = subprocess.Popen(
            ["prometheus-node-exporter", f"--path.sysfs={self.root}", "--collector.disable-defaults",
             "--collector.infiniband", f"--web.listen-address={self.address}", "--log.level=error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def rewrite(self) -> None:
        write_tree(self.root, self.hw)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class Stack:
    """Prometheus + per node a dcgm endpoint and a node_exporter. `labelled=False` leaves out the
    target label `node`, so only the exporter's own Hostname names the node."""

    def __init__(self, tmp: Path, nodes: list[str], labelled: bool = True, node_exporter: bool = True):
        self.tmp = tmp
        self.dcgm = {n: DcgmEndpoint(n) for n in nodes}
        self.nodeexp = {n: NodeExporter(n, tmp, self.dcgm[n].hw) for n in nodes} if node_exporter else {}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = {"global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
               "scrape_configs": [
                   {"job_name": "dcgm", "static_configs": [
                       {"targets": [e.address], "labels": {"node": n} if labelled else {}}
                       for n, e in self.dcgm.items()]},
                   {"job_name": "node", "static_configs": [
                       {"targets": [e.address], "labels": {"node": n} if labelled else {}}
                       for n, e in self.nodeexp.items()]},
               ]}
        (tmp / "prometheus.yml").write_text(json.dumps(cfg))
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        expected = len(self.dcgm) + len(self.nodeexp)
        try:
            self.wait(lambda: len([s for s in self.query("up == 1")]) == expected, what="all targets up")
        except BaseException:
            self.stop()
            raise

    def query(self, expr: str) -> list:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return json.load(resp)["data"]["result"]
        except OSError:
            return []

    def wait(self, predicate, timeout: float = 30.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {what}")

    def wait_scrapes(self, n: int = 2) -> None:
        """Let Prometheus take n more scrapes of every target (1 s interval)."""
        time.sleep(n * 1.0 + 0.5)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        for exp in self.nodeexp.values():
            exp.stop()
        for end in self.dcgm.values():
            end.server.shutdown()


GOOD = {"status": "success", "data": {"resultType": "vector", "result": [
    {"metric": {"node": "gpu001", "gpu": "3"}, "value": [1732880000.1, "79"]}]}}


class FakeProm:
    """A real HTTP server; `answer` is (status, body bytes) or a callable; requests are recorded."""

    def __init__(self, tls_context=None):
        self.answer = (200, json.dumps(GOOD).encode())
        self.requests = []
        self.delay = 0.0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                owner.requests.append((self.path, dict(self.headers), self.rfile.read(length).decode()))
                time.sleep(owner.delay)
                status, body = owner.answer
                send_body(self, status, body, "application/json")

            def log_message(self, *args):
                pass

        self.server = serve(Handler)
        scheme = "http"
        if tls_context is not None:
            self.server.socket = tls_context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_port}"

    def close(self):
        self.server.shutdown()
