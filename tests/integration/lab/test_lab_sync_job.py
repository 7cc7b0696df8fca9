"""A synchronous training job on the lab, as the real Prometheus sees it: 8 ranks of `<lab>/bin/train` in
lock-step busy their nodes' GPUs and move all-reduce traffic over NVLink and InfiniBand; a `slow-gpu` holds one
GPU's clock down and its peers wait (lower power); a `hang` stops every node's traffic and idles the hung
node's GPUs while its peers spin. Nodes gpu038..gpu045; the test clears what it injects and ends its job."""

import time

import pytest

from tests.integration.lab.health_support import HealthLab

pytestmark = pytest.mark.lab

NODES = [f"gpu{i:03d}" for i in range(38, 46)]
SLOW, HUNG = "gpu041", "gpu043"
MATCH = 'node=~"gpu0(3[89]|4[0-5])"'


@pytest.fixture
def h(lab, tmp_path):
    helper = HealthLab(lab, tmp_path)
    yield helper
    helper.cleanup()


def by_node(h, promql: str) -> dict[str, float]:
    return {s["metric"]["node"]: float(s["value"][1]) for s in h.lab.query(promql)}


def sacct_state(h, job: str) -> str:
    out = h.lab.run("sacct", "-n", "-X", "-P", "-j", job, "-o", "state").stdout.split()
    return out[0] if out else ""


def test_a_synchronous_job_busies_its_nodes_waits_for_a_slow_gpu_stops_on_a_hang_and_completes(h):
    window = f"[{4 * h.lab.scrape_interval}s]"  # a few samples at the lab's scrape interval
    train = h.lab.lab_dir / "bin" / "train"
    job = h.lab.run("sbatch", "--parsable", "-N", "8", "-w", "gpu[038-045]", "--exclusive", "-o", "/dev/null",
                    "-D", "/tmp", "--wrap", f"srun {train} --seconds 90").stdout.strip()
    try:
        # Healthy: every GPU of the job busy, NVLink and the rails carrying the all-reduce.
        h.lab.wait_until(lambda: by_node(h, f"min by (node) (DCGM_FI_DEV_GPU_UTIL{{{MATCH}}})") ==
                         dict.fromkeys(NODES, 100.0), 60, "every GPU of the job busy", interval=1)
        time.sleep(4 * h.lab.scrape_interval)
        nvlink = by_node(h, f"min by (node) (rate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{{{MATCH}}}{window}))")
        ib = by_node(h, f'min by (node) (rate(node_infiniband_port_data_transmitted_bytes_total{{{MATCH},'
                        f'device=~"mlx5_[0-7]"}}{window}))')
        assert set(nvlink) == set(ib) == set(NODES) and min(nvlink.values()) > 1e9 and min(ib.values()) > 1e8, \
            (nvlink, ib)
        power = f"avg by (node) (avg_over_time(DCGM_FI_DEV_POWER_USAGE{{{MATCH}}}[{3 * h.lab.scrape_interval}s]))"
        healthy = by_node(h, power)
        assert all(600 <= w <= 690 for w in healthy.values()), healthy

        # slow-gpu on one node's GPU 2: its clock held down, every other node waits for it at lower power.
        h.inject(SLOW, "slow-gpu", gpu=2)
        time.sleep(5 * h.lab.scrape_interval)
        clocks = by_node(h, f"min by (node) (DCGM_FI_DEV_SM_CLOCK{{{MATCH}}})")
        assert clocks[SLOW] == 1200 and {n: c for n, c in clocks.items() if n != SLOW} == \
            dict.fromkeys(set(NODES) - {SLOW}, 1980.0)
        slowed = by_node(h, power)
        peers = [n for n in NODES if n != SLOW]
        before, after = (sum(p[n] for n in peers) / len(peers) for p in (healthy, slowed))
        assert after < before - 80, (healthy, slowed)
        assert h.opsctl("lab", "clear", SLOW).returncode == 0

        # hang: no node of the job moves data, the hung node's GPUs idle, its peers spin.
        h.inject(HUNG, "hang")
        h.lab.wait_until(lambda: set(by_node(h, f"max by (node) (rate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{{{MATCH}}}"
                                                f"{window}))").values()) == {0.0}, 90, "NVLink traffic stops",
                         interval=2)
        # The rails too, once the window has passed the last step on every node (the node_exporters' scrapes
        # of the sysfs counters land apart from dcgm-exporter's).
        ib = (f'max by (node) (rate(node_infiniband_port_data_transmitted_bytes_total{{{MATCH}}}{window}) + '
              f'rate(node_infiniband_port_data_received_bytes_total{{{MATCH}}}{window}))')
        h.lab.wait_until(lambda: by_node(h, ib) == dict.fromkeys(NODES, 0.0), 4 * h.lab.scrape_interval + 30,
                         "InfiniBand traffic stops", interval=2)
        util = by_node(h, f"max by (node) (DCGM_FI_DEV_GPU_UTIL{{{MATCH}}})")
        assert util[HUNG] == 0 and all(util[n] == 100 for n in NODES if n != HUNG), util
        idle = by_node(h, f"min by (node) (DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{MATCH}}} % 2)")
        assert idle[HUNG] == 1 and all(idle[n] == 0 for n in NODES if n != HUNG), idle
        assert h.opsctl("lab", "clear", HUNG).returncode == 0

        # Cleared, the ranks step on and end together past their 90 s.
        assert h.lab.wait_until(lambda: (s := sacct_state(h, job)) not in ("", "PENDING", "RUNNING") and s, 120,
                                f"job {job} ended") == "COMPLETED"
        assert not (h.lab.lab_dir / "jobs" / f"job-{job}.0").exists()
    finally:
        h.lab.run("scancel", job, check=False)
