"""nccl-tests' all_reduce_perf: the parser and verdict (opsctl/gpu/nccl_tests.py) against real outputs, and
the lab's emulated tool (opsctl_lab/hwtools/all_reduce_perf.py) against the same format."""

import argparse
from pathlib import Path

import pytest

from opsctl.errors import SourceUnavailable
from opsctl.gpu.nccl_tests import all_reduce_verdict, human_size, parse_all_reduce
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.hwtools import all_reduce_perf as emulated

FIXTURES = Path(__file__).parents[1] / "fixtures" / "nccl"
SINGLE = (FIXTURES / "nccl-tests290_all_reduce_perf_8xH100_single_node.txt").read_text()
DEGRADED = (FIXTURES / "nccl-tests290_all_reduce_perf_2x8xH100_RING_degraded.txt").read_text()
AZURE_H200_FLOOR = 431.0  # Azure/azurehpc-health-checks conf/nd96isr_h200_v5.conf, check_nccl_allreduce


def test_a_real_single_node_run_of_8_h100_reads_and_passes_the_h200_floor():
    result = parse_all_reduce(SINGLE)
    assert [r.size for r in result.rows] == [128 << 20 << i for i in range(6)]
    assert (result.ranks, result.hosts, result.out_of_bounds, result.avg_busbw) == (8, ("node005",), 0, 439.369)
    assert result.rows[0] == type(result.rows[0])(134217728, 382.99, 382.34, 0)
    assert all_reduce_verdict(result, AZURE_H200_FLOOR, gpus=8) == ("pass", "nccl busbw=476.5GB/s at 4G")


def test_a_real_degraded_two_node_run_with_rank_prefixes_fails_the_floor_naming_its_bandwidth():
    result = parse_all_reduce(DEGRADED)
    assert len(result.rows) == 11 and {r.wrong for r in result.rows} == {None}  # "N/A": not checked per row
    assert (result.out_of_bounds, result.avg_busbw, result.last.size) == (0, 85.5294, 8 << 30)
    assert all_reduce_verdict(result, AZURE_H200_FLOOR, gpus=8) == (
        "fail", "nccl busbw=89.9GB/s at 8G floor=431GB/s")


def test_wrong_elements_fail_whatever_the_bandwidth():
    lines = SINGLE.splitlines()
    row = next(i for i, line in enumerate(lines) if line.lstrip().startswith("536870912"))
    lines[row] = lines[row][:-1] + "3"  # the in-place run's #wrong
    verdict, why = all_reduce_verdict(parse_all_reduce("\n".join(lines)), AZURE_H200_FLOOR, gpus=8)
    assert (verdict, why) == ("fail", "nccl wrong=3 out_of_bounds=0 (data corrupted on the way)")


@pytest.mark.parametrize("text,why", [
    ("", "nccl no result (the run ended before its totals)"),
    # Killed after two sizes: rows but no totals.
    ("\n".join(SINGLE.splitlines()[:17]), "nccl no result (the run ended before its totals)"),
    ("gpu001: Test CUDA failure common.cu:892 'unknown error'\n", "nccl no result (the run ended before its totals)"),
    ("\n".join(line for line in SINGLE.splitlines() if "Rank  7" not in line), "nccl ran on 7 of 8 GPUs"),
])
def test_a_run_that_did_not_finish_or_left_a_gpu_out_checked_nothing(text, why):
    assert all_reduce_verdict(parse_all_reduce(text), AZURE_H200_FLOOR, gpus=8) == ("not_checked", why)


def test_a_row_whose_numbers_do_not_read_is_a_source_error():
    bad = SINGLE.replace("382.99      0", "382.99      x", 1)
    with pytest.raises(SourceUnavailable, match=r"^all_reduce_perf: #wrong 'x' is neither a count nor N/A$"):
        parse_all_reduce(bad)


def test_sizes_read_as_nccl_tests_writes_them():
    assert [human_size(n) for n in (16 << 30, 128 << 20, 8 << 10, 100)] == ["16G", "128M", "8K", "100"]
    assert [emulated.parse_size(t) for t in ("16G", "128m", "8K", "100")] == [16 << 30, 128 << 20, 8 << 10, 100]


def test_the_emulators_row_is_the_real_tools_format():
    """The real row, numbers and all, rendered by the emulator: byte for byte."""
    real = next(line for line in SINGLE.splitlines() if line.lstrip().startswith("134217728"))
    assert emulated.row(134217728, (613.3, 218.85, 382.99), (614.3, 218.48, 382.34), "0") == real
    big = next(line for line in SINGLE.splitlines() if line.lstrip().startswith("4294967296"))
    assert emulated.row(4294967296, (15870, 270.63, 473.60), (15773, 272.30, 476.53), "0") == big


def _run(hw: NodeHardware) -> str:
    args = argparse.Namespace(stepfactor=2, warmup_iters=5, iters=20, check=1, ngpus=8)
    ranks = [emulated.Rank(hw, gpu) for gpu in range(8)]
    return emulated.report(ranks, hw.hca_layout().rails, [128 << 20 << i for i in range(8)], args)


def _one_rail(a: NodeHardware, b: NodeHardware, rail: int) -> str:
    """A preflight's step: one GPU per node, NCCL_IB_HCA on that GPU's rail alone, at 16 GiB."""
    args = argparse.Namespace(stepfactor=2, warmup_iters=5, iters=20, check=1, ngpus=1)
    return emulated.report([emulated.Rank(a, rail), emulated.Rank(b, rail)], [a.hca_layout().rails[rail]],
                           [16 << 30], args)


def test_the_emulated_run_of_a_healthy_node_passes_and_nvlink_slow_halves_it():
    healthy = NodeHardware(node="gpu001")
    result = parse_all_reduce(_run(healthy))
    assert result.ranks == 8 and result.out_of_bounds == 0 and len(result.rows) == 8
    columns = [line for line in _run(healthy).splitlines() if line.startswith("#    ")]
    assert len(columns) == 3 and columns == [line for line in SINGLE.splitlines() if line.startswith("#    ")]
    verdict, why = all_reduce_verdict(result, AZURE_H200_FLOOR, gpus=8)
    assert verdict == "pass" and 470 < result.last.busbw < 482, why
    slow = NodeHardware(node="gpu001")
    slow.inject("nvlink-slow", gpu=5)
    degraded = parse_all_reduce(_run(slow))
    assert degraded.last.busbw == pytest.approx(result.last.busbw / 2, rel=0.02)
    verdict, why = all_reduce_verdict(degraded, AZURE_H200_FLOOR, gpus=8)
    assert verdict == "fail" and why.endswith("at 16G floor=431GB/s"), why


def test_one_rail_between_two_nodes_reaches_an_ndr_nics_share_and_ib_slow_halves_that_rail_only():
    a, b = NodeHardware(node="gpu001"), NodeHardware(node="gpu002")
    b.inject("ib-slow", hca="mlx5_3")
    healthy, slow = parse_all_reduce(_one_rail(a, b, 2)), parse_all_reduce(_one_rail(a, b, 3))
    assert (healthy.ranks, healthy.hosts) == (2, ("gpu001", "gpu002"))
    assert 46 <= healthy.last.busbw <= 48  # nccl-tests' maintainers: 46-48 GB/s per NDR NIC
    assert slow.last.busbw == pytest.approx(healthy.last.busbw / 2, rel=0.03)


def test_a_hostlist_expands_as_slurm_writes_it():
    assert emulated.expand_hostlist("gpu[038,040-041],head") == ["gpu038", "gpu040", "gpu041", "head"]
    assert emulated.expand_hostlist("gpu007") == ["gpu007"]
