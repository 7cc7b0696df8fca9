"""What DCGM and the InfiniBand sysfs tree show of a training rank's load (opsctl_lab.training_load): busy GPUs
while it computes or waits, idle ones under a hang or without a rank, traffic counters that rise by completed
steps only, and the slow-gpu and hang faults."""

from prometheus_client.parser import text_string_to_metric_families

from opsctl_lab.dcgm_emulator import EmulatedNode, render, tick
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.ib_sysfs import write_tree
from opsctl_lab.training_load import COMPUTE, DONE, HUNG, WAIT, RankLoad, load_path

NOW = 1_800_000_000.0
GPUS = range(8)


def rank_load(phase: str, duty: float = 1.0, steps: int = 100, computing=GPUS, updated: float = NOW) -> RankLoad:
    return RankLoad(job="7", rank=0, pid=1, phase=phase, computing=list(computing), step=steps, total_steps=steps,
                    started=NOW - 60, updated=updated, duty={str(g): duty for g in GPUS})


def metrics(hw: NodeHardware, load: RankLoad | None, now: float = NOW) -> dict[str, dict[str, float]]:
    """metric -> gpu -> value."""
    return {f.name: {s.labels["gpu"]: s.value for s in f.samples}
            for f in text_string_to_metric_families(render(hw, now=now, load=load))}


def test_computing_gpus_are_busy_at_full_clock_and_near_tdp_alike_but_never_equal():
    got = metrics(NodeHardware(node="gpu040"), rank_load(COMPUTE))
    assert set(got["DCGM_FI_DEV_GPU_UTIL"].values()) == {100}
    assert set(got["DCGM_FI_DEV_SM_CLOCK"].values()) == {1980}
    power = list(got["DCGM_FI_DEV_POWER_USAGE"].values())
    assert all(600 <= w <= 690 for w in power) and len(set(power)) == 8 and max(power) / min(power) < 1.07
    assert all(0.85 <= v <= 0.95 for v in got["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].values())
    assert all(0.45 <= v <= 0.55 for v in got["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].values())
    assert not any(int(v) & 0x1 for v in got["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"].values())  # not GPU_IDLE
    # Another node of the job looks alike within a few percent.
    other = metrics(NodeHardware(node="gpu041"), rank_load(COMPUTE))["DCGM_FI_DEV_POWER_USAGE"]
    assert abs(sum(other.values()) / sum(power) - 1) < 0.05 and other != got["DCGM_FI_DEV_POWER_USAGE"]


def test_gpus_waiting_for_a_peer_spin_busy_at_low_power_and_low_engine_activity():
    waiting = metrics(NodeHardware(node="gpu040"), rank_load(WAIT, duty=0.0, computing=[]))
    assert set(waiting["DCGM_FI_DEV_GPU_UTIL"].values()) == {100}  # NCCL's kernels spin
    assert all(150 <= w <= 250 for w in waiting["DCGM_FI_DEV_POWER_USAGE"].values())
    assert all(v < 0.15 for v in waiting["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].values())
    assert not any(int(v) & 0x1 for v in waiting["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"].values())
    # Waiting 0.6 of every 1.6 s step (a slow peer): between the two, below a node that computes throughout.
    partly = metrics(NodeHardware(node="gpu040"), rank_load(COMPUTE, duty=0.625))["DCGM_FI_DEV_POWER_USAGE"]
    full = metrics(NodeHardware(node="gpu040"), rank_load(COMPUTE))["DCGM_FI_DEV_POWER_USAGE"]
    assert all(waiting["DCGM_FI_DEV_POWER_USAGE"][g] < partly[g] < full[g] - 100 for g in full)


def test_a_hung_rank_a_done_one_a_killed_one_and_none_leave_the_gpus_idle():
    idle = metrics(NodeHardware(node="gpu040"), None)
    killed = rank_load(COMPUTE, updated=NOW - 30)  # its heartbeat stopped
    for load in (rank_load(HUNG), rank_load(DONE), killed):
        got = metrics(NodeHardware(node="gpu040"), load)
        assert set(got["DCGM_FI_DEV_GPU_UTIL"].values()) == {0}
        assert all(w < 115 for w in got["DCGM_FI_DEV_POWER_USAGE"].values())
        assert set(got["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"].values()) == {0x1}
        assert set(got["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].values()) == {0.0}
        assert got["DCGM_FI_DEV_POWER_USAGE"] == idle["DCGM_FI_DEV_POWER_USAGE"]


def test_nvlink_counters_count_completed_steps_so_a_hang_or_a_job_end_keeps_them():
    hw = NodeHardware(node="gpu040")
    seen = [metrics(hw, load, now)["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] for load, now in (
        (None, NOW), (rank_load(COMPUTE, steps=10), NOW), (rank_load(WAIT, steps=11), NOW + 1),
        (rank_load(HUNG, steps=11), NOW + 30), (rank_load(DONE, steps=11), NOW + 60),
        (rank_load(COMPUTE, steps=12, updated=NOW + 90), NOW + 90))]
    assert set(seen[0].values()) == {0}
    for gpu in map(str, GPUS):
        values = [s[gpu] for s in seen]
        assert values == sorted(values) and values[1] < values[2] == values[3] == values[4] < values[5]
    # ~24 GB a step per GPU, a little different on each
    assert len(set(seen[2].values())) == 8 and all(21e9 < v / 11 < 27e9 for v in seen[2].values())


def test_the_rails_carry_the_all_reduce_by_completed_steps_and_the_storage_port_not(tmp_path):
    hw = NodeHardware(node="gpu040")

    def port(hca: str, counter: str, load: RankLoad | None) -> int:
        write_tree(tmp_path, hw, NOW, load)
        return int((tmp_path / "class" / "infiniband" / hca / "ports" / "1" / "counters" / counter).read_text())

    for counter in ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets"):
        before, one, two = (port("mlx5_3", counter, rank_load(WAIT, steps=s) if s else None) for s in (0, 1, 2))
        assert before < one < two and abs((two - one) - (one - before)) <= 1  # the same for each step
    gained = port("mlx5_3", "port_xmit_data", rank_load(WAIT, steps=1)) - port("mlx5_3", "port_xmit_data", None)
    assert 2.9e9 < gained * 4 < 3.1e9  # 4-byte words, ~3 GB a step
    assert port("mlx5_bond_0", "port_xmit_data", rank_load(WAIT, steps=5)) == \
        port("mlx5_bond_0", "port_xmit_data", None)


def test_the_emulator_follows_the_ranks_load_file_and_rewrites_the_rails_as_steps_complete(tmp_path):
    state = tmp_path / "gpu040" / "hardware.json"
    NodeHardware(node="gpu040").save(state)
    node = EmulatedNode("gpu040", "127.0.0.1:0", state, sysfs_root=tmp_path / "sys")
    node.server = object()  # type: ignore[assignment]  # as if listening: tick starts no listener here
    xmit = tmp_path / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters" / "port_xmit_data"
    tick(node, NOW)
    before = int(xmit.read_text())
    rank_load(COMPUTE, steps=3).save(load_path(state))
    tick(node, NOW)
    assert node.load is not None and node.load.total_steps == 3 and int(xmit.read_text()) > before


def test_slow_gpu_holds_its_clock_under_a_power_cap_the_health_rules_leave_alone():
    hw = NodeHardware(node="gpu040")
    hw.inject("slow-gpu", gpu=2)
    busy = metrics(hw, rank_load(COMPUTE))
    assert busy["DCGM_FI_DEV_SM_CLOCK"] == {str(g): 1200 if g == 2 else 1980 for g in GPUS}
    # SW_POWER_CAP (0x4): none of the slowdown bits (0x8, 0x20, 0x40, 0x80) the clock rules fail on.
    assert busy["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == {str(g): 0x4 if g == 2 else 0 for g in GPUS}
    assert busy["DCGM_FI_DEV_POWER_USAGE"]["2"] < 451 < min(busy["DCGM_FI_DEV_POWER_USAGE"][str(g)] for g in (0, 1, 3))
    idle = metrics(hw, None)
    assert idle["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"]["2"] == 0x5 and idle["DCGM_FI_DEV_SM_CLOCK"]["2"] == 1200
    hw.clear()
    assert metrics(hw, rank_load(COMPUTE))["DCGM_FI_DEV_SM_CLOCK"]["2"] == 1980
