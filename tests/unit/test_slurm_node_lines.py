"""slurm_node_lines (playbooks/filter_plugins/slurm_nodes.py): every node is held against its group's
profile, and one node's facts never define the others."""

import pytest

from tests.unit.test_roles_static import PLAYBOOKS, load_module

NODES = load_module(PLAYBOOKS / "filter_plugins" / "slurm_nodes.py", "slurm_nodes")
H200 = {"gpu_model": "NVIDIA H200", "gpu_count": 8, "hcas": [f"mlx5_{i}" for i in range(8)],
        "memory_mb": 2_063_000, "sockets": 2, "cores_per_socket": 56, "threads_per_core": 2}


def hostvars(**changed):
    """gpu1..gpu4 reporting an HGX H200, with `changed` (host -> keys) on top."""
    return {f"gpu{i}": {"opsctl_hw": {**H200, **changed.get(f"gpu{i}", {})}} for i in range(1, 5)}


def lines(hv, declared=None, tolerance=5):
    return [(line["hosts"], line["hw"]["gpu_count"], line["hw"]["memory_mb"], line["mismatch"])
            for line in NODES.slurm_node_lines(sorted(hv), hv, declared, tolerance)]


def test_nodes_alike_share_one_line_with_the_smallest_memory():
    hv = hostvars(gpu2={"memory_mb": 2_050_000})  # within 5 %: a DIMM's worth of firmware reservation
    assert lines(hv) == [(["gpu1", "gpu2", "gpu3", "gpu4"], 8, 2_050_000, "")]


def test_a_node_that_lost_a_gpu_gets_its_own_line_and_never_shrinks_the_others():
    """The first host of the group lost a GPU: before, its facts were every node's."""
    hv = hostvars(gpu1={"gpu_count": 7})
    assert lines(hv) == [(["gpu2", "gpu3", "gpu4"], 8, 2_063_000, ""), (["gpu1"], 7, 2_063_000, "gpus 7 (profile 8)")]
    groups = [{"name": "h200", "group": "gpu_nodes"}]
    assert NODES.slurm_hw_mismatches(groups, {"gpu_nodes": sorted(hv)}, hv, ["gpu1", "gpu3", "head"]) == {
        "gpu1": "gpus 7 (profile 8)", "gpu3": ""}  # the hosts of this run only


@pytest.mark.parametrize(("changed", "why"), [
    ({"memory_mb": 1_031_000}, "memory 1006GiB (profile 2014GiB +-5%)"),
    ({"hcas": ["mlx5_0"] * 7}, "hcas 7 (profile 8)"),
    ({"gpu_model": "NVIDIA H100 80GB HBM3"}, "gpu model NVIDIA_H100_80GB_HBM3 (profile NVIDIA_H200)"),
    ({"threads_per_core": 1}, "cpus 2x56x1 (profile 2x56x2)"),
])
def test_each_kind_of_difference_is_named(changed, why):
    assert lines(hostvars(gpu3=changed))[1] == (["gpu3"], changed.get("gpu_count", 8),
                                                changed.get("memory_mb", 2_063_000), why)


def test_a_gpu_off_the_bus_is_named_by_its_bus_id():
    hv = hostvars(gpu2={"gpu_count": 7, "lost_gpus": ["0000:DB:00.0"]})
    assert lines(hv)[1] == (["gpu2"], 7, 2_063_000, "gpus 7 (profile 8), lost 0000:DB:00.0")


def test_only_the_compute_hcas_count():
    """hw_discovery lists every HCA with `compute` (its ib_devices); a storage port is no compute rail."""
    rails = [{"name": f"mlx5_{i}", "compute": True} for i in range(8)]
    hv = hostvars(gpu1={"hcas": [*rails, {"name": "mlx5_8", "compute": False}]}, gpu2={"hcas": rails},
                  gpu3={"hcas": rails}, gpu4={"hcas": rails[:7]})
    assert [(line[0], line[3]) for line in lines(hv)] == [
        (["gpu1", "gpu2", "gpu3"], ""), (["gpu4"], "hcas 7 (profile 8)")]


def test_a_declared_profile_wins_over_the_majority():
    """Half of the group lost a GPU (a tie goes to the larger count anyway); a declared profile settles it."""
    hv = hostvars(gpu1={"gpu_count": 7}, gpu2={"gpu_count": 7})
    assert [line[0] for line in lines(hv)] == [["gpu3", "gpu4"], ["gpu1"], ["gpu2"]]
    assert lines(hv, {"gpus": 7})[0][:2] == (["gpu1", "gpu2"], 7)
    assert lines(hostvars(), {"gpu_model": "H200", "memory_gb": 2014, "hcas": 8, "gpus": 8})[0][3] == ""


def test_a_node_without_facts_is_named():
    hv = {**hostvars(), "gpu9": {}}
    with pytest.raises(Exception, match="no opsctl_hw facts for gpu9"):
        NODES.slurm_node_lines(sorted(hv), hv)
