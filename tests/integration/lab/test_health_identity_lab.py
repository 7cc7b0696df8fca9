"""Swapped `node` labels on the lab: a Prometheus of the test's own scrapes two lab nodes' real
exporters (the dcgm-exporter emulator, whose Hostname is the node's own name, and node_exporter) with
their `node` labels swapped, and one of them has an XID 79. `opsctl health --drain` must drain
neither node: both are `unknown` with `identity-conflict`, naming both names.

Nodes: gpu062 and gpu063. No node of gpu033..gpu064 is left unused by the other lab tests; these two
are touched elsewhere only by test_health_safety (a person's drain and `opsctl drain`, and the breaker
over gpu[055-064]), each of which clears and resumes them, and the lab tier runs one test at a time.
"""

import json
import subprocess

import pytest

from tests.component.promlab import free_port
from tests.integration.lab.health_support import HealthLab

pytestmark = pytest.mark.lab

SICK, HEALTHY = "gpu062", "gpu063"  # the XID is gpu062's; its exporters are labelled gpu063, and back


def swapped_prometheus(lab, tmp_path, port: int) -> subprocess.Popen:
    swap = {SICK: HEALTHY, HEALTHY: SICK}
    jobs = [{"job_name": job, "static_configs": [
        {"targets": [f"{lab.address(host)}:{port_}"], "labels": {"node": label}} for host, label in swap.items()]}
        for job, port_ in (("dcgm", 9400), ("node", 9100))]
    (tmp_path / "p.yml").write_text(json.dumps({"global": {"scrape_interval": "1s"}, "scrape_configs": jobs}))
    return subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'p.yml'}", f"--storage.tsdb.path={tmp_path}/d",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=error"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_swapped_node_labels_drain_neither_node(lab, tmp_path):
    port = free_port()
    prom = swapped_prometheus(lab, tmp_path, port)
    scope = f"{SICK},{HEALTHY}"
    for sub in ("truth", "swapped"):
        (tmp_path / sub).mkdir()
    # The lab's own Prometheus (labels right) shows where the XID is.
    truth = HealthLab(lab, tmp_path / "truth")
    # This Prometheus scrapes two nodes only: the 62 others have no data in it, a share that the
    # unknown breaker would rightly stop at.
    h = HealthLab(lab, tmp_path / "swapped", safety={"unknown_max_fraction": 1.0},
                  prometheus=f"http://127.0.0.1:{port}")
    try:
        h.inject(SICK, "xid:79", gpu=3)
        truth.wait_statuses(scope, {SICK: "fail", HEALTHY: "ok"}, rules={SICK: "xid-79"})
        # Under the swapped labels the XID is filed under the healthy node's name.
        h.wait_statuses(scope, {SICK: "unknown", HEALTHY: "unknown"}, rules={HEALTHY: "xid-79"})
        proc = h.opsctl("health", "--drain", "--json", "--nodes", scope)
        assert proc.returncode in (0, 1), proc.stderr
        nodes = {n["node"]: n for n in json.loads(proc.stdout)["nodes"]}
        for name, other in ((SICK, HEALTHY), (HEALTHY, SICK)):
            assert nodes[name]["status"] == "unknown" and nodes[name]["action"] in ("none", "skip:unknown")
            [dcgm] = [c for c in nodes[name]["checks"] if c["id"] == "identity-conflict"]
            assert dcgm["status"] == "unknown" and name in dcgm["evidence"] and other in dcgm["evidence"]
            assert "Hostname=" in dcgm["evidence"]
        assert nodes[HEALTHY]["action"] == "skip:unknown"  # it carries the XID, and is not drained for it
        slurm = h.slurm()
        assert not slurm[SICK].drained and not slurm[HEALTHY].drained
        assert not [r for r in h.audit() if r["event"] == "drain"]
    finally:
        prom.terminate()
        prom.wait(20)
        h.cleanup()
