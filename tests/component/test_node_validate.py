"""`opsctl node validate` as a real process, running the lab's emulated `dcgmi` and `all_reduce_perf` as
real processes against a node's hardware state: exit codes, the textfile, and a fault of each kind."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from opsctl.gpu.nccl_tests import parse_all_reduce
from opsctl_lab.hardware import NodeHardware

LAB = Path(__file__).parents[2] / "lab"


@pytest.fixture
def node(tmp_path):
    """A node's state, wrappers for its two tools (as the lab's per-node bin directory has) and a config."""
    state = tmp_path / "hardware.json"
    NodeHardware(node="gpu9").save(state)
    env = {**os.environ, "OPSCTL_HW_STATE": str(state),
           "PYTHONPATH": os.pathsep.join([str(LAB.parent), str(LAB)])}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dcgmi", "all_reduce_perf"):
        (bin_dir / tool).write_text(f"#!/bin/sh\nexec {sys.executable} -m opsctl_lab.hwtools.{tool} \"$@\"\n")
        (bin_dir / tool).chmod(0o755)
    config = tmp_path / "opsctl.yaml"
    config.write_text(yaml.safe_dump({"gpu": {"dcgmi": str(bin_dir / "dcgmi")},
                                      "validate": {"all_reduce_perf": str(bin_dir / "all_reduce_perf")}}))
    return state, env, config, tmp_path / "textfile" / "opsctl-validate.prom"


def validate(env, config, textfile):
    textfile.parent.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "opsctl", "node", "validate", "--config", str(config),
                           "--textfile", str(textfile)], env=env, capture_output=True, text=True, timeout=120)


def inject(state, fault, gpu):
    hw = NodeHardware.load(state, "gpu9")
    hw.inject(fault, gpu=gpu)
    hw.save(state)


def test_the_emulated_all_reduce_perf_prints_what_the_parser_reads(node):
    _, env, _, _ = node
    out = subprocess.run([sys.executable, "-m", "opsctl_lab.hwtools.all_reduce_perf", "-b", "128M", "-e", "16G",
                          "-f", "2", "-g", "8"], env=env, capture_output=True, text=True, timeout=60)
    result = parse_all_reduce(out.stdout)
    assert out.returncode == 0 and result.ranks == 8 and result.hosts == ("gpu9",)
    assert [r.size for r in result.rows] == [128 << 20 << i for i in range(8)] and result.out_of_bounds == 0


def test_a_healthy_node_passes_and_writes_zeros(node):
    _, env, config, textfile = node
    proc = validate(env, config, textfile)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = textfile.read_text()
    assert 'opsctl_node_validate{test="dcgm-diag",device="node"} 0\n' in text
    assert 'opsctl_node_validate{test="nccl",device="node"} 0\n' in text


def test_nvlink_slow_fails_nccl_and_a_dbe_fails_the_diag_on_its_gpu(node):
    state, env, config, textfile = node
    inject(state, "nvlink-slow", 6)
    inject(state, "dbe", 2)
    proc = validate(env, config, textfile)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "nccl       node       fail         nccl busbw=" in proc.stdout and "floor=431GB/s" in proc.stdout
    text = textfile.read_text()
    assert 'opsctl_node_validate{test="nccl",device="node"} 0\n' not in text
    assert 'opsctl_node_validate{test="dcgm-diag",device="gpu2"} ' in text


def test_a_lost_gpu_leaves_nccl_not_checked_and_exits_3(node):
    state, env, config, textfile = node
    inject(state, "gpu-missing", 5)
    proc = validate(env, config, textfile)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert 'test="nccl"' not in textfile.read_text()
    assert "nccl exit 1: gpu9: Test CUDA failure common.cu:892 'unknown error'" in proc.stdout


def test_a_preflights_rail_verdict_is_written_beside_the_nodes_own_results_and_keeps_them(node):
    _, env, config, textfile = node
    assert validate(env, config, textfile).returncode == 0
    own = textfile.read_text()

    def record(result):
        return subprocess.run([sys.executable, "-m", "opsctl", "node", "validate", "--config", str(config),
                               "--textfile", str(textfile), "--record-pairs", result], env=env,
                              capture_output=True, text=True, timeout=60)
    failed = record("mlx5_3")
    assert failed.returncode == 0, failed.stderr
    pairs = textfile.with_name("opsctl-validate-pairs.prom").read_text()
    assert 'opsctl_node_validate{test="nccl-pair",device="mlx5_3"} ' in pairs and textfile.read_text() == own
    assert record("pass").returncode == 0  # a later preflight that passes replaces the failure
    assert textfile.with_name("opsctl-validate-pairs.prom").read_text().endswith(
        'opsctl_node_validate{test="nccl-pair",device="node"} 0\n')
    bad = record("mlx5_3;reboot")
    assert bad.returncode == 2 and "--record-pairs 'mlx5_3;reboot'" in bad.stderr
