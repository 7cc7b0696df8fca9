"""Resume evidence is per device: `opsctl health --resume` lifts opsctl's drain only when every device the
drained rule covers on the node reads ok, the device named in the drain and the node's expected GPUs and
InfiniBand rails. End to end through the CLI with the fakes of tests/unit/fakes.py."""

import pytest

from opsctl.config import parse_config
from opsctl.health.catalog import load_catalog
from opsctl.health.evidence import named_devices
from tests.unit.fakes import World, node

IB_MLX5_3 = "opsctl:ib-down mlx5_3 DOWN (state_id=1)"
GPU_5 = "opsctl:row-remap-pending gpu5 row_remap_pending=1"
NOW_OK = {"safety": {"resume_after": "0s"}}


def drained(tmp_path, reason, raw=None):
    return World(tmp_path, raw={**NOW_OK, **(raw or {})}, gpu040=node("gpu040", flags=("DRAIN",), reason=reason))


def resume(world):
    code, nodes, summary = world.json("--resume")
    return nodes["gpu040"]["action"], summary["resumed"]


def test_a_node_drained_for_one_rail_stays_drained_while_that_rail_has_no_series(tmp_path):
    w = drained(tmp_path, IB_MLX5_3)
    w.prom.raw["ib-down"] = {"gpu040": [(f"mlx5_{i}", 4.0) for i in range(8) if i != 3]}  # seven rails ACTIVE
    assert resume(w) == ("skip:no-data", 0)
    assert w.slurm.state["gpu040"].drained and w.slurm.calls == []
    w.prom.raw["ib-down"]["gpu040"].append(("mlx5_3", 4.0))  # mlx5_3 is back, ACTIVE
    assert resume(w) == ("resume", 1)


def test_a_node_drained_for_one_gpu_stays_drained_while_that_gpu_has_no_series(tmp_path):
    w = drained(tmp_path, GPU_5)
    w.prom.raw["row-remap-pending"] = {"gpu040": [(str(gpu), 0.0) for gpu in range(8) if gpu != 5]}
    assert resume(w) == ("skip:no-data", 0)
    w.prom.raw["row-remap-pending"]["gpu040"].append(("5", 0.0))
    assert resume(w) == ("resume", 1)


def test_every_expected_gpu_counts_not_only_the_drained_one(tmp_path):
    w = drained(tmp_path, GPU_5)
    w.prom.raw["row-remap-pending"] = {"gpu040": [(str(gpu), 0.0) for gpu in range(8) if gpu != 2]}
    assert resume(w) == ("skip:no-data", 0)


def test_the_device_named_in_the_drain_counts_beyond_the_configured_rails(tmp_path):
    """A drain that names a rail outside ib.rails (the rails changed since): that rail must read ok too."""
    raw = {"ib": {"rails": [f"mlx5_{i}" for i in range(4)]}}
    w = drained(tmp_path, "opsctl:ib-down mlx5_9 DOWN (state_id=1)", raw)
    w.prom.raw["ib-down"] = {"gpu040": [(f"mlx5_{i}", 4.0) for i in range(4)]}
    assert resume(w) == ("skip:no-data", 0)
    w.prom.raw["ib-down"]["gpu040"].append(("mlx5_9", 4.0))
    assert resume(w) == ("resume", 1)


def test_a_device_that_still_fails_is_still_failing_not_missing(tmp_path):
    w = drained(tmp_path, IB_MLX5_3)
    w.prom.raw["ib-down"] = {"gpu040": [(f"mlx5_{i}", 1.0 if i == 3 else 4.0) for i in range(7)]}
    assert resume(w)[0] == "skip:still-failing"


RULES = load_catalog(parse_config({}, "t", {}))


@pytest.mark.parametrize("reason,expected", [
    (IB_MLX5_3, {"ib-down": {"mlx5_3"}}),
    ("opsctl:ib-down,ib-degraded mlx5_3 DOWN (state_id=1); mlx5_5 200 Gb/s, expected 400 (rate_bytes=25000000000)",
     {"ib-down": {"mlx5_3"}, "ib-degraded": {"mlx5_5"}}),
    ("opsctl:ib-down,xid-79 mlx5_0 DOWN (state_id=1); gpu3 xid=79 count=1",
     {"ib-down": {"mlx5_0"}, "xid-79": {"gpu3"}}),
    ("opsctl:row-remap-pending,gpu-count gpu5 row_remap_pending=1; gpus=7 expected=8", {"row-remap-pending": {"gpu5"}}),
    ("opsctl:pcie-downtrained gpu3 PCIe link at 50% of its maximum", {"pcie-downtrained": {"gpu3"}}),
    ("opsctl:ib-down mlx5_3 DOWN (sta...", {}),  # cut by safety.reason_max_length: names nothing
    ("opsctl:node-check ib-port-state mlx5_2 failed", {}),  # node check results: per check, not per device
    ("opsctl:manual mlx5_3 DOWN (state_id=1)", {}),
    ("someone else's reason", {}),
])
def test_the_devices_a_drain_names_are_read_from_its_reason(reason, expected):
    assert named_devices(reason, RULES) == expected


def test_the_catalog_knows_the_expected_gpus_and_rails():
    by_id = {r.id: r for r in RULES}
    assert by_id["row-remap-pending"].devices == tuple(str(g) for g in range(8))
    assert by_id["ib-down"].devices == tuple(f"mlx5_{i}" for i in range(8))
    assert by_id["gpu-count"].devices == by_id["node-check"].devices == ()
    # Only the rails that hardware.ib_devices selects: the rules never see the others.
    narrow = load_catalog(parse_config({"hardware": {"ib_devices": "mlx5_[0-3]", "gpus_per_node": 4}}, "t", {}))
    narrow_by_id = {r.id: r for r in narrow}
    assert narrow_by_id["ib-down"].devices == ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")
    assert narrow_by_id["sbe-storm"].devices == ("0", "1", "2", "3")
