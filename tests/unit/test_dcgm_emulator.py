"""The dcgm-exporter emulator speaks dcgm-exporter's exact text format and label set."""

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from opsctl_lab.dcgm_emulator import render
from opsctl_lab.hardware import FB_RESERVED_MIB, FB_TOTAL_MIB, VBIOS_DRIFT_VERSION, VBIOS_VERSION, NodeHardware
from tests.conftest import FIXTURES

SAMPLE = (FIXTURES / "dcgm-exporter" / "dcgm-exporter-sample.txt").read_text()
# Labels that only Kubernetes pod mapping adds; a Slurm host has none of them.
K8S_LABELS = {"container", "namespace", "pod", "pod_uid"}


def _verbatim_block(text: str) -> str:
    return text.split("# ---- BEGIN VERBATIM ----", 1)[1].split("# ---- END VERBATIM ----", 1)[0]


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _sample_families() -> dict:
    body = "\n".join(line for line in _verbatim_block(SAMPLE).splitlines() if line.startswith(("#", "DCGM")))
    return _families(body)


def _label_names(family) -> set:
    return set(family.samples[0].labels)


@pytest.fixture
def healthy():
    return _families(render(NodeHardware(node="gpu001"), now=1_800_000_000.0))


def test_output_parses_and_has_eight_gpus(healthy):
    assert len(healthy["DCGM_FI_DEV_GPU_TEMP"].samples) == 8
    assert {s.labels["modelName"] for s in healthy["DCGM_FI_DEV_GPU_TEMP"].samples} == {"NVIDIA H200"}


FIRMWARE_LABELS = {"DCGM_FI_DEV_INFOROM_IMAGE_VER", "DCGM_FI_DEV_VBIOS_VERSION"}


def test_every_sample_metric_is_emitted_with_the_same_labels_and_type(healthy):
    for name, family in _sample_families().items():
        assert name in healthy, name
        assert healthy[name].type == family.type, name
        # the sample's exporter ran the default counters file, which leaves these label fields commented out
        assert _label_names(healthy[name]) - FIRMWARE_LABELS == _label_names(family) - K8S_LABELS, name


def test_help_lines_match_the_sample_verbatim():
    ours = dict(re.findall(r"^# HELP (\S+) (.*)$", render(NodeHardware(node="n")), re.M))
    theirs = dict(re.findall(r"^# HELP (\S+) (.*)$", _verbatim_block(SAMPLE), re.M))
    for name, text in theirs.items():
        assert ours[name].rstrip(".") == text.rstrip("."), name


def test_label_order_follows_dcgm_exporter():
    line = next(line for line in render(NodeHardware(node="gpu007")).splitlines()
                if line.startswith("DCGM_FI_DEV_XID_ERRORS{"))
    keys = re.findall(r'(\w+)="', line)
    assert keys == ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DEV_INFOROM_IMAGE_VER",
                    "DCGM_FI_DEV_VBIOS_VERSION", "DCGM_FI_DRIVER_VERSION", "err_code", "err_msg"]


def test_values_plausible_and_stable(healthy):
    for gpu in range(8):
        used, free, reserved = (next(s.value for s in healthy[f"DCGM_FI_DEV_FB_{k}"].samples
                                     if s.labels["gpu"] == str(gpu)) for k in ("USED", "FREE", "RESERVED"))
        assert used + free + reserved == FB_TOTAL_MIB and reserved == FB_RESERVED_MIB
    assert all(0 < s.value <= 700 for s in healthy["DCGM_FI_DEV_POWER_USAGE"].samples)
    again = _families(render(NodeHardware(node="gpu001"), now=1_800_000_000.0))
    assert [s.value for s in again["DCGM_FI_DEV_GPU_TEMP"].samples] == \
        [s.value for s in healthy["DCGM_FI_DEV_GPU_TEMP"].samples]


def test_counters_only_go_up_across_inject_and_clear():
    hw = NodeHardware(node="gpu001")
    hw.inject("pcie-replays", gpu=2, now=1000.0)

    def replays(now):
        fams = _families(render(hw, now=now))
        return next(s.value for s in fams["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"].samples if s.labels["gpu"] == "2")

    rising = [replays(t) for t in (1000.0, 1010.0, 1020.0)]
    assert rising[0] < rising[1] < rising[2]
    hw.clear(now=1020.0)
    assert replays(1020.0) == replays(1500.0) == rising[2]


def test_gpu_missing_removes_every_series_of_that_gpu():
    hw = NodeHardware(node="gpu001")
    hw.inject("gpu-missing", gpu=6)
    fams = _families(render(hw))
    for family in fams.values():
        assert all(s.labels.get("gpu") != "6" for s in family.samples), family.name
    assert len(fams["DCGM_FI_DEV_GPU_TEMP"].samples) == 7


def test_xid_sets_gauge_err_labels_and_windowed_count():
    hw = NodeHardware(node="gpu001")
    hw.inject("xid:79", gpu=3, now=1000.0)
    fams = _families(render(hw, now=1010.0))
    xid = next(s for s in fams["DCGM_FI_DEV_XID_ERRORS"].samples if s.labels["gpu"] == "3")
    assert xid.value == 79 and xid.labels["err_code"] == "79" and xid.labels["err_msg"] == "GPU has fallen off the bus"
    count = fams["DCGM_EXP_XID_ERRORS_COUNT"].samples
    assert [(s.labels["xid"], s.labels["window_size_in_ms"], s.value) for s in count if s.labels["gpu"] == "3"] \
        == [("79", "300000", 1)]
    # As dcgm-exporter's expCollector: a GPU without XIDs in the window has one series of value 0, no xid.
    assert sorted((s.labels["gpu"], s.value) for s in count if "xid" not in s.labels) == \
        [(str(g), 0) for g in range(8) if g != 3]
    hw.clear(now=1020.0)
    fams = _families(render(hw, now=1030.0))
    assert {(s.labels.get("xid"), s.value) for s in fams["DCGM_EXP_XID_ERRORS_COUNT"].samples} == {(None, 0)}
    assert next(s.value for s in fams["DCGM_FI_DEV_XID_ERRORS"].samples if s.labels["gpu"] == "3") == 79
    assert "DCGM_EXP_XID_ERRORS_COUNT" not in _families(render(hw, now=1030.0, xid_count=False))


def test_thermal_sets_temperature_and_clock_event_bits():
    hw = NodeHardware(node="gpu001")
    hw.inject("thermal", gpu=1)
    fams = _families(render(hw))
    temp = next(s.value for s in fams["DCGM_FI_DEV_GPU_TEMP"].samples if s.labels["gpu"] == "1")
    reasons = int(next(s.value for s in fams["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"].samples if s.labels["gpu"] == "1"))
    assert temp > 90 and reasons & 0x40 and reasons & 0x8


def test_a_clock_slowdown_is_a_busy_gpu_at_a_lower_clock_with_its_reasons_bits():
    """clock-slowdown:<reason> on GPU 2: DCGM's clock event reasons carry the reason's bits (dcgm_fields.h:
    0x8 HW_SLOWDOWN, 0x20 SW_THERMAL, 0x40 HW_THERMAL, 0x80 HW_POWER_BRAKE, a brake or HW thermal event with
    the HW slowdown bit as nvidia-smi nests them), the GPU is busy and its SM clock lower; the other GPUs
    stay idle (GPU_IDLE) at their full clock."""
    hw = NodeHardware(node="gpu001")
    for reason, mask in (("hw-slowdown", 0x8), ("sw-thermal", 0x20), ("hw-thermal", 0x48), ("power-brake", 0x88)):
        hw.clear()
        hw.inject(f"clock-slowdown:{reason}", gpu=2)
        assert _per_gpu(hw, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS") == {str(g): mask if g == 2 else 0x1 for g in range(8)}
    assert _per_gpu(hw, "DCGM_FI_DEV_GPU_UTIL") == {str(g): 100 if g == 2 else 0 for g in range(8)}
    clocks = _per_gpu(hw, "DCGM_FI_DEV_SM_CLOCK")
    assert clocks["2"] < clocks["1"] == clocks["7"]


def test_a_downtrained_link_is_x8_of_its_x16_on_its_gpu_alone():
    hw = NodeHardware(node="gpu001")
    hw.inject("pcie-downtrain", gpu=3)
    assert _per_gpu(hw, "DCGM_FI_DEV_PCIE_LINK_WIDTH") == {str(g): 8 if g == 3 else 16 for g in range(8)}
    assert set(_per_gpu(hw, "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH").values()) == {16}
    assert set(_per_gpu(hw, "DCGM_FI_DEV_PCIE_LINK_GEN").values()) == \
        set(_per_gpu(hw, "DCGM_FI_DEV_PCIE_MAX_LINK_GEN").values()) == {5}


def _fabric(hw) -> dict:
    fams = _families(render(hw))
    return {s.labels["gpu"]: int(s.value) for s in fams["DCGM_FI_DEV_FABRIC_MANAGER_STATUS"].samples}


def test_the_fabric_is_trained_stuck_on_one_gpu_or_untrained_without_fabric_manager():
    """DCGM's Fabric Manager status: 3 (Success) on a healthy node, 2 (In Progress) on the GPU of
    fabric-stuck, and on every GPU of fabricmanager-down."""
    hw = NodeHardware(node="gpu001")
    assert set(_fabric(hw).values()) == {3} and len(_fabric(hw)) == 8
    hw.inject("fabric-stuck", gpu=2)
    assert {g for g, status in _fabric(hw).items() if status != 3} == {"2"} and _fabric(hw)["2"] == 2
    hw.clear()
    hw.inject("fabricmanager-down")
    assert set(_fabric(hw).values()) == {2}


def test_the_counters_file_the_role_installs_exports_every_field_a_rule_reads_and_the_emulator_emits_it():
    """A DCGM field is exported only when dcgm-exporter's counters file lists it: a rule that reads one it
    does not list would never see a fault on a real cluster (and the emulator, which needs no file, would
    hide that)."""
    from opsctl.config import parse_config
    from opsctl.health.catalog import load_catalog

    counters = (Path(__file__).resolve().parents[2] / "playbooks" / "roles" / "dcgm_exporter" / "files"
                / "opsctl-counters.csv").read_text()
    rows = [[part.strip() for part in line.split(",")[:2]] for line in counters.splitlines()
            if line.strip() and line[0] != "#"]
    listed = {name for name, kind in rows if kind != "label"}
    labels = {name for name, kind in rows if kind == "label"}
    read = {name for rule in load_catalog(parse_config({}, "t", {}))
            for name in re.findall(r"\bDCGM_(?:FI|EXP)_[A-Z0-9_]+", rule.expr)}
    assert "DCGM_FI_DEV_FABRIC_MANAGER_STATUS" in read and read - listed - labels == set()
    families = _families(render(NodeHardware(node="gpu001"), now=1_800_000_000.0))
    assert read - labels - set(families) == set()
    # a field of type label is a label of every series of the GPU, as dcgm-exporter renders it
    assert "DCGM_FI_DEV_VBIOS_VERSION" in read & labels
    assert all(labels <= set(s.labels) for s in families["DCGM_FI_DEV_GPU_TEMP"].samples)


def _per_gpu(hw, metric: str) -> dict:
    return {s.labels["gpu"]: int(s.value) for s in _families(render(hw))[metric].samples}


def test_mig_ecc_and_persistence_modes_follow_their_faults_on_their_gpu_alone():
    hw = NodeHardware(node="gpu001")
    modes = ("DCGM_FI_DEV_ECC_CURRENT", "DCGM_FI_DEV_MIG_MODE", "DCGM_FI_DEV_PERSISTENCE_MODE")
    assert [set(_per_gpu(hw, m).values()) for m in modes] == [{1}, {0}, {1}]
    hw.inject("ecc-off", gpu=1)
    hw.inject("mig-on", gpu=4)
    hw.set_persistence_mode(6, False)
    changed = [{g for g, v in _per_gpu(hw, m).items() if v != healthy}
               for m, healthy in zip(modes, (1, 0, 1), strict=True)]
    assert changed == [{"1"}, {"4"}, {"6"}]


def test_vbios_drift_changes_the_vbios_label_of_its_gpu_alone():
    hw = NodeHardware(node="gpu001")
    hw.inject("vbios-drift", gpu=5)
    seen = {s.labels["gpu"]: s.labels["DCGM_FI_DEV_VBIOS_VERSION"]
            for s in _families(render(hw))["DCGM_FI_DEV_GPU_TEMP"].samples}
    assert seen == {str(g): VBIOS_DRIFT_VERSION if g == 5 else VBIOS_VERSION for g in range(8)}
