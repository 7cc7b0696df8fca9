"""A small real monitoring stack for the component tier: a real Prometheus (and, where installed,
Debian's VictoriaMetrics beside it, scraping the same targets) scraping, every second,
dcgm-exporter-format endpoints (rendered by the lab's emulator from a NodeHardware model that a test
changes in memory) and the real node_exporter reading the lab's emulated InfiniBand sysfs tree.
"""

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import yaml

from opsctl_lab.dcgm_emulator import METRICS_CONTENT_TYPE, QuietHTTPServer, render, send_body
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.ib_sysfs import write_tree

HAVE_PROMETHEUS = shutil.which("prometheus") is not None
HAVE_NODE_EXPORTER = shutil.which("prometheus-node-exporter") is not None
HAVE_VICTORIA = shutil.which("victoria-metrics") is not None
TSDBS = ["prometheus", "victoria-metrics"]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def loopback(index: int) -> str:
    """A loopback address of its own for target `index` (all of 127/8 is loopback), apart per lab slot."""
    slot = int(os.environ.get("OPSCTL_LAB_SLOT") or 0)
    return f"127.{180 + slot}.77.{index + 1}"


def serve(handler_cls, host: str = "127.0.0.1") -> QuietHTTPServer:
    server = QuietHTTPServer((host, 0), handler_cls)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class DcgmEndpoint:
    """Serves render(hw) for one node; set .hw or .hw.inject(...) between scrapes. xid_count=False is a
    stock dcgm-exporter, whose default counters do not enable DCGM_EXP_XID_ERRORS_COUNT."""

    def __init__(self, node: str, host: str = "127.0.0.1", xid_count: bool = True):
        self.hw = NodeHardware(node=node)
        self.down = False
        self.xid_count = xid_count
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                if endpoint.down:
                    self.send_error(503)
                    return
                body = render(endpoint.hw, xid_count=endpoint.xid_count).encode()
                send_body(self, 200, body, METRICS_CONTENT_TYPE)

            def log_message(self, *args):
                pass

        self.server = serve(Handler, host)
        self.address = f"{host}:{self.server.server_port}"


class NodeExporter:
    """The real node_exporter with the infiniband collector over an emulated sysfs tree. With `uname`,
    it runs in a UTS namespace of its own whose hostname is `uname`, and reports it in
    node_uname_info{nodename} (as node_exporter on a real host does)."""

    def __init__(self, node: str, root: Path, hw: NodeHardware, host: str = "127.0.0.1", uname: str | None = None):
        self.root = root / "sysfs" / f"{node}-{host}"
        self.hw = hw
        write_tree(self.root, hw)
        self.address = f"{host}:{free_port(host)}"
        argv = ["prometheus-node-exporter", f"--path.sysfs={self.root}", "--collector.disable-defaults",
                "--collector.infiniband", f"--web.listen-address={self.address}", "--log.level=error"]
        if uname:
            argv = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', uname, *argv, "--collector.uname"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def rewrite(self) -> None:
        write_tree(self.root, self.hw)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class Tsdb:
    """Prometheus or VictoriaMetrics scraping `scrape_configs` every second."""

    def __init__(self, kind: str, tmp: Path, scrape_configs: list[dict]):
        self.kind = kind
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = {"global": {"scrape_interval": "1s", "scrape_timeout": "900ms"}, "scrape_configs": scrape_configs}
        self.rules_file = tmp / f"{kind}-opsctl-rules.yml"
        self.rules_file.write_text("groups: []\n")
        path = tmp / f"{kind}.yml"
        if kind == "prometheus":
            cfg["rule_files"] = [str(self.rules_file)]
            path.write_text(json.dumps(cfg))
            argv = ["prometheus", f"--config.file={path}", f"--storage.tsdb.path={tmp / 'prom-data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle", "--log.level=error"]
        else:
            # Answers see the newest samples at once (the default hides the last 30 s) and are not cached,
            # so both databases judge the same scrapes.
            path.write_text(json.dumps(cfg))
            argv = ["victoria-metrics", f"-promscrape.config={path}", f"-storageDataPath={tmp / 'vm-data'}",
                    f"-httpListenAddr=127.0.0.1:{self.port}", "-search.latencyOffset=0s", "-search.disableCache",
                    "-loggerLevel=ERROR"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def query(self, expr: str, at: float | None = None) -> list:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr, **({"time": at} if at else {})})
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return json.load(resp)["data"]["result"]
        except OSError:
            return []

    def record(self, rules, config, interval: str | None = None) -> None:
        """Prometheus evaluates the catalog's recording rules for `config` (as the Prometheus role installs
        them), until every rule's recorded results are fresh. `interval` replaces the groups' interval and
        returns at once: "1h" holds the groups still (a changed group keeps its series, as an evaluation
        that stopped would)."""
        from opsctl.health import precomputed
        from opsctl.prom import PromClientImpl

        groups = [{**g, "interval": interval or g["interval"]} for g in precomputed.recording_groups(rules, config)]
        text = yaml.safe_dump({"groups": groups}, sort_keys=False)
        if self.rules_file.read_text() != text:
            self.rules_file.write_text(text)
            # A reload parses and loads every group before it answers: seconds on a machine busy with the
            # other streams, once more than 10.
            urllib.request.urlopen(urllib.request.Request(f"{self.url}/-/reload", method="POST"), timeout=60).close()
        if interval is None:
            client = PromClientImpl(self.url)
            # A held rule's results are used once its recorded history spans its hold (young before), and
            # every heartbeat is fresh for `config` at one instant.
            last = {}

            def whole() -> bool:
                last["read"] = precomputed.read(client.query(precomputed.QUERY), rules, config)
                return not last["read"].direct
            wait(whole, 90, "every rule's recorded results", lambda: last["read"].note())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def wait(predicate, timeout: float = 30.0, what: str = "condition", why=lambda: "") -> None:
    """Polls `predicate` until it holds; on timeout the error names `what` and what `why()` says."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    detail = why()
    raise AssertionError(f"timed out waiting for {what}" + (f": {detail}" if detail else ""))


class Running:
    """Stops what a stack started: its databases, node_exporters and dcgm endpoints."""

    tsdbs: dict
    nodeexp: dict
    dcgm: dict

    def stop(self) -> None:
        for tsdb in self.tsdbs.values():
            tsdb.stop()
        for exp in self.nodeexp.values():
            exp.stop()
        for end in self.dcgm.values():
            end.server.shutdown()


class Stack(Running):
    """Prometheus (and VictoriaMetrics, with victoria=True) + per node a dcgm endpoint and a node_exporter.
    `labelled=False` leaves out the target label `node`, so only the exporter's own Hostname names the node."""

    def __init__(self, tmp: Path, nodes: list[str], labelled: bool = True, node_exporter: bool = True,
                 victoria: bool = False):
        self.tmp = tmp
        self.dcgm = {n: DcgmEndpoint(n) for n in nodes}
        self.nodeexp = {n: NodeExporter(n, tmp, self.dcgm[n].hw) for n in nodes} if node_exporter else {}
        scrape = [
            {"job_name": "dcgm", "static_configs": [
                {"targets": [e.address], "labels": {"node": n} if labelled else {}} for n, e in self.dcgm.items()]},
            {"job_name": "node", "static_configs": [
                {"targets": [e.address], "labels": {"node": n} if labelled else {}} for n, e in self.nodeexp.items()]},
        ]
        self.tsdbs = {kind: Tsdb(kind, tmp, scrape) for kind in (TSDBS if victoria else TSDBS[:1])}
        self.url = self.tsdbs["prometheus"].url
        expected = len(self.dcgm) + len(self.nodeexp)
        try:
            for tsdb in self.tsdbs.values():
                wait(lambda t=tsdb: len(t.query("up == 1")) == expected, what=f"all targets up in {tsdb.kind}")
        except BaseException:
            self.stop()
            raise

    def query(self, expr: str, at: float | None = None) -> list:
        return self.tsdbs["prometheus"].query(expr, at)

    def wait(self, predicate, timeout: float = 30.0, what: str = "condition") -> None:
        wait(predicate, timeout, what)

    def wait_scrapes(self, n: int = 2) -> None:
        """Let the databases take n more scrapes of every target (1 s interval)."""
        time.sleep(n * 1.0 + 0.5)


def verdicts(report) -> dict:
    return {n: (v.status, v.in_slurm, sorted((c.id, c.device, c.status) for c in v.checks))
            for n, v in report.nodes.items()}


def drain_decisions(report, rules, slurm_nodes) -> dict:
    from opsctl.config import parse_config
    from opsctl.health.plan import plan_drains
    from opsctl.slurm import SlurmNode

    cluster = {n: SlurmNode(n, "idle", partitions=("gpu",), gres="gpu:8") for n in slurm_nodes}
    safety = parse_config({"safety": {"breaker_min_nodes": 4, "max_out_of_service_fraction": 1.0}}, "t", {}).safety
    return {n: d.action for n, d in plan_drains(report, cluster, rules, safety, 0, True).decisions.items()}


def _differ(one, other) -> dict:
    """node -> (its verdict in one, in other), for the nodes where they differ."""
    mine, theirs = verdicts(one), verdicts(other)
    return {n: (mine.get(n), theirs.get(n)) for n in set(mine) | set(theirs) if mine.get(n) != theirs.get(n)}


def _until_agreed(first, second, seconds: float = 30.0, settled=lambda report: True):
    """Both reports, read again together until their verdicts agree and `settled(first's report)` holds (or
    `seconds` have passed)."""
    deadline = time.monotonic() + seconds
    while True:
        one, other = first(), second()
        if (verdicts(one) == verdicts(other) and settled(one)) or time.monotonic() > deadline:
            return one, other
        time.sleep(0.5)


def evaluate_everywhere(tsdbs: dict, config, slurm_nodes, memory=None, now=None):
    """Evaluate against Prometheus, both from the rule results it recorded and by querying every rule,
    and against every other database (queried), until they have the same scrapes (at most a few seconds):
    verdicts and drain decisions must be identical. Every side is read again each time, so that an answer
    caught mid-change (a series that has just vanished, a hold half over, a recording one evaluation
    behind) is not held against one that has moved on. Returns Prometheus' report from its recorded
    results (checked identical to the queried ones), its client and the rules."""
    from dataclasses import replace

    from opsctl.config.schema import Duration
    from opsctl.health.catalog import load_catalog
    from opsctl.health.evaluate import evaluate
    from opsctl.prom import PromClientImpl

    rules = load_catalog(config)
    prometheus = tsdbs["prometheus"]
    # Recorded every 2 s (the scrapes are every second): fresh for 4 s, which a test machine busy with
    # other streams keeps; every 1 s, fresh for 2 s, it did not always.
    recorded_config = replace(config, prometheus=replace(config.prometheus, recording_interval=Duration(2)))
    prometheus.record(rules, recorded_config)
    direct_config = replace(config, prometheus=replace(config.prometheus, recording_rules="off"))
    client = PromClientImpl(prometheus.url)

    def queried(url: str):
        return lambda: evaluate(PromClientImpl(url), rules, direct_config, slurm_nodes, memory, now)

    # A group that ran late on a busy machine is read directly for that run: read again until none is.
    recorded, report = _until_agreed(lambda: evaluate(client, rules, recorded_config, slurm_nodes, memory, now),
                                     queried(prometheus.url), settled=lambda one: one.rule_results == "precomputed")
    assert recorded.rule_results == "precomputed", recorded.rule_results_note
    # Recorded results are up to two recording intervals old: a target that failed a scrape since then is
    # unknown on that path for as long (opsctl.health.evaluate.up_since), so on a machine where scrapes time
    # out now and then, the two agree only once a few seconds pass without one (hence 30 s).
    differ = _differ(recorded, report)
    assert not differ, f"Prometheus' recorded and queried rule results differ (node: recorded, queried): {differ}"
    assert drain_decisions(recorded, rules, slurm_nodes) == drain_decisions(report, rules, slurm_nodes)
    for kind, tsdb in tsdbs.items():
        if kind == "prometheus":
            continue
        report, other = _until_agreed(queried(prometheus.url), queried(tsdb.url))
        differ = _differ(report, other)
        assert not differ, f"{kind} and Prometheus differ (node: Prometheus, {kind}): {differ}"
        assert drain_decisions(other, rules, slurm_nodes) == drain_decisions(report, rules, slurm_nodes)
        assert other.queries == report.queries
    return recorded, client, rules


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
