"""The emulated ib_write_bw: a real server and client process over loopback TCP, two emulated nodes,
bandwidth from the fabric model; layout checked against a real CX-7 NDR run."""

import os
import socket
import subprocess
import sys

import pytest

from opsctl.fabrictest.ib_write_bw import parse_ib_write_bw
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.hwtools.fabric_model import PortView, bandwidth_gbps
from tests.conftest import FIXTURES

# Real client output, CX-7 back to back, NDR: the ib_write_bw run of the capture, from its first
# dashed line to its last (the capture's ib_read_bw run and shell prompts left out).
_CAPTURE = (FIXTURES / "infiniband" / "ib_write_bw_ib_read_bw_cx7_ndr_b2b_client.txt").read_text()
_WRITE = _CAPTURE[_CAPTURE.index("ib_write_bw -d"):].splitlines()[1:]
REAL = "\n".join(_WRITE[:max(i for i, line in enumerate(_WRITE) if line.startswith("---")) + 1]) + "\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def nodes(tmp_path):
    envs = {}
    for name in ("gpu1", "gpu2"):
        NodeHardware(node=name).save(tmp_path / f"{name}.json")
        envs[name] = dict(os.environ, OPSCTL_HW_STATE=str(tmp_path / f"{name}.json"),
                          OPSCTL_HW_SYSFS_ROOT=str(tmp_path / name))
    return tmp_path, envs


def run_pair(envs, hca="mlx5_0"):
    port = _free_port()
    cmd = [sys.executable, "-m", "opsctl_lab.hwtools.ib_write_bw", "-d", hca, "--report_gbits", "-p", str(port)]
    server = subprocess.Popen(cmd, env=envs["gpu2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # The server takes exactly one client, as perftest does: wait for its banner, do not probe.
        banner = [server.stdout.readline() for _ in range(4)]
        assert "* Waiting for client to connect... *\n" in banner
        client = subprocess.run(cmd + ["127.0.0.1"], env=envs["gpu1"], capture_output=True, text=True, timeout=30)
        server_out = "".join(banner) + server.communicate(timeout=30)[0]
    finally:
        server.kill()
    return client, server_out


def test_healthy_ndr_pair_matches_the_real_run(nodes):
    _, envs = nodes
    client, server_out = run_pair(envs)
    assert client.returncode == 0, client.stderr
    got = parse_ib_write_bw(client.stdout)
    real = parse_ib_write_bw(REAL)
    assert (got.test, got.device, got.link_type, got.size, got.unit) == (
        real.test, real.device, real.link_type, real.size, real.unit)
    assert abs(got.bw_average - real.bw_average) < 1.0
    assert got.bw_peak > got.bw_average
    assert parse_ib_write_bw(server_out).bw_average == got.bw_average
    # Same lines as the real run, but for the addresses and the numbers.
    real_lines = [x for x in REAL.splitlines() if not x.startswith("Conflicting")]
    assert client.stdout.splitlines()[:16] == real_lines[:16]
    assert client.stdout.splitlines()[19] == real_lines[19]


def test_ib_slow_on_either_end_halves_the_rail(nodes):
    tmp, envs = nodes
    hw = NodeHardware.load(tmp / "gpu2.json", "gpu2")
    hw.inject("ib-slow", hca=4)
    hw.save(tmp / "gpu2.json")
    slow = parse_ib_write_bw(run_pair(envs, "mlx5_4")[0].stdout)
    fast = parse_ib_write_bw(run_pair(envs, "mlx5_5")[0].stdout)
    assert 190 < slow.bw_average < 200 and fast.bw_average > 390


def test_a_down_port_cannot_run(nodes):
    tmp, envs = nodes
    hw = NodeHardware.load(tmp / "gpu1.json", "gpu1")
    hw.inject("ib-down", hca=0)
    hw.save(tmp / "gpu1.json")
    out = subprocess.run([sys.executable, "-m", "opsctl_lab.hwtools.ib_write_bw", "-d", "mlx5_0", "--report_gbits",
                          "-p", str(_free_port()), "127.0.0.1"], env=envs["gpu1"], capture_output=True, text=True)
    assert out.returncode == 1 and "state is Down" in out.stderr


def test_fabric_model():
    a = PortView("gpu1", "mlx5_0", True, 400.0, False)
    b = PortView("gpu2", "mlx5_0", True, 400.0, False)
    peak, avg = bandwidth_gbps(a, b)
    assert 391.8 < avg <= 392.34 and peak == round(avg + 0.04, 2)
    assert bandwidth_gbps(a, b) == bandwidth_gbps(b, a)
    assert 195 < bandwidth_gbps(a, PortView("gpu2", "mlx5_0", True, 200.0, False))[1] < 197
    assert bandwidth_gbps(a, PortView("gpu2", "mlx5_0", False, 400.0, False)) == (0.0, 0.0)
