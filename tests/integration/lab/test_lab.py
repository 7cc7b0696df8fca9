"""The simulated cluster (`opsctl lab up`): real Slurm, real Prometheus, emulated H200 hardware.

All faults are injected at once, each on its own node, so the whole table costs two scrape
intervals instead of two per fault; each fault is still its own test."""

import functools
import os
import subprocess
import time

import pytest

from opsctl.slurm import SlurmCliImpl
from opsctl_lab import processes
from opsctl_lab.hardware import FAULTS as FAULT_SPECS
from opsctl_lab.hardware import NodeHardware, fault_label, write_kernel_log
from opsctl_lab.paths import LabPaths
from opsctl_lab.slurm_reboot import reboot_hardware
from tests import reboot_cycle
from tests.conftest import opsctl

pytestmark = pytest.mark.lab

W = "[20s]"  # a rate window that always holds a few samples at the lab's 5 s scrape interval
# fault, node, options, PromQL that must match exactly that node while the fault is on,
# PromQL that must match no node once it is cleared.
FAULTS = [
    ("xid:79", "gpu001", ["--gpu", "3"], 'DCGM_EXP_XID_ERRORS_COUNT{xid="79",gpu="3"} == 1',
     'DCGM_EXP_XID_ERRORS_COUNT{xid!=""}'),  # a GPU without XIDs keeps dcgm-exporter's zero series
    ("dbe", "gpu002", ["--gpu", "1"], f"increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{W}) > 0",
     f"increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{W}) > 0"),
    ("sbe-storm", "gpu003", ["--gpu", "2"], f"rate(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{W}) > 10",
     f"rate(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{W}) > 0"),
    ("row-remap-failure", "gpu004", ["--gpu", "0"], "DCGM_FI_DEV_ROW_REMAP_FAILURE == 1",
     "DCGM_FI_DEV_ROW_REMAP_FAILURE == 1"),
    ("row-remap-pending", "gpu005", ["--gpu", "4"], "DCGM_FI_DEV_ROW_REMAP_PENDING == 1",
     "DCGM_FI_DEV_ROW_REMAP_PENDING == 1"),
    ("gpu-missing", "gpu006", ["--gpu", "7"], "count by (node) (DCGM_FI_DEV_GPU_TEMP) < 8",
     "count by (node) (DCGM_FI_DEV_GPU_TEMP) < 8"),
    ("thermal", "gpu007", ["--gpu", "5"],
     "(DCGM_FI_DEV_GPU_TEMP > 90) and on (node, gpu) (DCGM_FI_DEV_CLOCKS_EVENT_REASONS >= 64)",
     "DCGM_FI_DEV_GPU_TEMP > 90"),
    ("nvlink-errors", "gpu008", ["--gpu", "6"], f"rate(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{W}) > 0",
     f"rate(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{W}) > 0"),
    ("pcie-replays", "gpu009", ["--gpu", "2"], f"rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER{W}) > 0",
     f"rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER{W}) > 0"),
    ("ib-down", "gpu010", ["--hca", "3"], 'node_infiniband_state_id{device="mlx5_3"} != 4',
     "node_infiniband_state_id != 4"),
    ("ib-degraded", "gpu011", ["--hca", "5"], 'node_infiniband_rate_bytes_per_second{device="mlx5_5"} == 2.5e10',
     'node_infiniband_rate_bytes_per_second{device=~"mlx5_[0-7]"} < 5e10'),
    ("ib-counters", "gpu012", ["--hca", "1"], f'rate(node_infiniband_symbol_error_total{{device="mlx5_1"}}{W}) > 0',
     f"rate(node_infiniband_symbol_error_total{W}) > 0"),
    ("exporter-down", "gpu013", [], "up == 0", "up == 0"),
]
IDS = [f[0] for f in FAULTS]


@pytest.fixture(scope="module")
def injected(lab):
    """Inject every fault, yield the injection time, clear them all at the end."""
    for fault, node, options, _, _ in FAULTS:
        opsctl("lab", "inject", node, fault, *options, env=lab.env)
    yield time.monotonic()
    for _, node, _, _, _ in FAULTS:
        opsctl("lab", "clear", node, env=lab.env, check=False)


@pytest.fixture(scope="module")
def cleared(lab, injected):
    for _, node, _, _, _ in FAULTS:
        opsctl("lab", "clear", node, env=lab.env)
    return time.monotonic()


def test_all_nodes_idle_with_eight_h200(lab):
    states = lab.sinfo_states()
    assert len(states) == lab.nodes == 64
    # A node resumed by an earlier test reads idle* until slurmctld's next ping reaches its slurmd.
    lab.wait_until(lambda: set(lab.sinfo_states().values()) == {"idle"}, 120, "every node idle", interval=2)
    gres = lab.run("sinfo", "-h", "-N", "-o", "%N %G").stdout.split("\n")[0]
    assert gres.endswith("gpu:h200:8"), gres


@pytest.mark.parametrize("metric", ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED",
                                    "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                                    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
                                    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"])
def test_512_gpu_series_per_dcgm_metric(lab, metric):
    series = lab.query(metric)
    assert len(series) == 8 * lab.nodes == 512
    assert {s["metric"]["modelName"] for s in series} == {"NVIDIA H200"}


def test_fb_adds_up_and_power_within_limit(lab):
    total = lab.query("DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE + DCGM_FI_DEV_FB_RESERVED")
    assert {float(s["value"][1]) for s in total} == {143771.0}
    assert lab.query("DCGM_FI_DEV_POWER_USAGE > 700") == []


def test_every_target_carries_its_slurm_node_name(lab):
    series = lab.query('up{job=~"dcgm|node"}')
    assert len(series) == 2 * lab.nodes
    names = set(lab.sinfo_states())
    for job in ("dcgm", "node"):
        assert {s["metric"]["node"] for s in series if s["metric"]["job"] == job} == names
    hostnames = lab.query('DCGM_FI_DEV_GPU_TEMP{gpu="0"}')
    assert all(s["metric"]["Hostname"] == s["metric"]["node"] for s in hostnames)


def test_nine_hcas_per_node_incl_ethernet_storage_port(lab):
    info = lab.query('node_infiniband_info{node="gpu020"}')
    assert sorted(s["metric"]["device"] for s in info) == [f"mlx5_{i}" for i in range(8)] + ["mlx5_bond_0"]
    rates = {s["metric"]["device"]: float(s["value"][1])
             for s in lab.query('node_infiniband_rate_bytes_per_second{node="gpu020"}')}
    assert rates["mlx5_0"] == 5e10  # 400 Gb/s NDR, in bytes per second


@pytest.mark.parametrize("fault,node,options,present,_cleared", FAULTS, ids=IDS)
def test_fault_appears_on_that_node_only(lab, injected, fault, node, options, present, _cleared):
    deadline = 2 * lab.scrape_interval + 2  # two scrape intervals, plus Prometheus' own step
    remaining = max(0.5, deadline - (time.monotonic() - injected))
    matched = lab.wait_until(lambda: lab.nodes_matching(present), remaining, f"{fault} in Prometheus")
    assert matched == {node}


@pytest.mark.parametrize("fault,node,options,_present,gone", FAULTS, ids=IDS)
def test_fault_clears(lab, cleared, fault, node, options, _present, gone):
    # A counter's rate needs its window to pass; a gauge needs one scrape.
    lab.wait_until(lambda: node not in lab.nodes_matching(gone), 30, f"{fault} to clear", interval=1)
    assert node not in lab.nodes_matching(gone)


def test_xid_gauge_keeps_last_xid_after_clear(lab, cleared):
    # DCGM's XID field holds the last XID after recovery; only the windowed count goes away.
    # What clears is the series of each XID; dcgm-exporter's zero series without `xid` stays.
    lab.wait_until(lambda: not lab.query('DCGM_EXP_XID_ERRORS_COUNT{node="gpu001",xid!=""}'), 20,
                   "XID count to clear")
    gauge = lab.query('DCGM_FI_DEV_XID_ERRORS{node="gpu001",gpu="3"}')
    assert [s["value"][1] for s in gauge] == ["79"]
    assert gauge[0]["metric"]["err_code"] == "79"


def test_storage_port_fault_shows_on_ethernet_port(lab):
    opsctl("lab", "inject", "gpu016", "ib-down", "--hca", "mlx5_bond_0", env=lab.env)
    try:
        lab.wait_until(lambda: lab.nodes_matching('node_infiniband_state_id{device="mlx5_bond_0"} == 1'),
                       2 * lab.scrape_interval + 2, "storage port down")
        assert lab.query('node_infiniband_state_id{node="gpu016",device=~"mlx5_[0-7]"} != 4') == []
    finally:
        opsctl("lab", "clear", "gpu016", env=lab.env)


@pytest.mark.parametrize("args,message", [
    (["gpu001", "meltdown"], "unknown fault"),
    (["gpu999", "dbe"], "no lab node"),
    (["gpu001", "xid:abc"], "bad XID code"),
    (["gpu001", "ib-down", "--hca", "12"], "unknown HCA"),
    (["gpu001", "dbe", "--hca", "1"], "takes --gpu"),
    (["gpu001", "gpu-hang", "--gpu", "1"], "lab machines"),
])
def test_inject_rejects_bad_input_with_one_line(lab, args, message):
    proc = opsctl("lab", "inject", *args, env=lab.env, check=False)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_env_points_tools_at_the_lab(lab):
    assert lab.env["SLURM_CONF"].endswith("/slurm/slurm.conf")
    assert lab.env["OPSCTL_CONFIG"].endswith("/opsctl.yaml")
    assert lab.env["OPSCTL_STATE_DIR"].endswith("/state")
    assert "ClusterName=opsctl-lab" in open(lab.env["SLURM_CONF"]).read()


def _scrape(address: str) -> dict:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        return {f.name: f for f in text_string_to_metric_families(resp.read().decode())}


def test_live_dcgm_endpoint_parses(lab):
    families = _scrape(f"{lab.address('gpu020')}:9400")
    assert len(families["DCGM_FI_DEV_GPU_TEMP"].samples) == 8
    assert {s.labels["Hostname"] for s in families["DCGM_FI_DEV_GPU_TEMP"].samples} == {"gpu020"}


def test_live_node_exporter_matches_the_real_sample(lab):
    from prometheus_client.parser import text_string_to_metric_families

    from tests.conftest import FIXTURES

    def label_sets(families) -> dict:
        return {s.name: set(s.labels) for f in families for s in f.samples if s.name.startswith("node_infiniband")}

    sample = label_sets(text_string_to_metric_families(
        (FIXTURES / "node-exporter" / "node_exporter_e2e_infiniband_metrics.txt").read_text()))
    live = label_sets(_scrape(f"{lab.address('gpu020')}:9100").values())
    for must in ("node_infiniband_info", "node_infiniband_state_id", "node_infiniband_physical_state_id",
                 "node_infiniband_rate_bytes_per_second", "node_infiniband_link_downed_total",
                 "node_infiniband_port_errors_received_total"):
        assert must in live, must
    common = set(sample) & set(live)
    assert len(common) >= 15
    for name in common:
        assert live[name] == sample[name], name


def test_a_reboot_through_slurm_restarts_the_nodes_slurmd_and_reboots_its_hardware(lab):
    """The remediation ladder's reboot on Debian 12's Slurm 22.05 (the lab's own slurmctld and slurmds), through
    opsctl's client: drained with an opsctl: reason, `SlurmCliImpl.reboot`, down_for_reboot while requested and
    issued, then back: DOWN, no flags, the reboot's reason with Slurm's " : reboot issued : reboot complete",
    back_from_reboot; opsctl's resume makes it idle (22.05 clears the reason). 22.05's sinfo --json shows the
    same steps as 24.11 and 26.05 (tests/reboot_cycle.py):

        REBOOT_REQUESTED  idle  DRAIN,REBOOT_REQUESTED  <reason>
        REBOOT_ISSUED     down  DRAIN,REBOOT_ISSUED     <reason> : reboot issued
        back              down  -                       <reason> : reboot issued : reboot complete

    The lab's RebootProgram stopped the node's slurmd, rebooted its emulated hardware (an XID in the kernel log
    and a hung GPU are gone, a persistence mode set off stays; the kernel log starts again) and started slurmd
    again with -b; the lab's PID file names the new slurmd, so `opsctl lab down` stops it (test_lab_lifecycle.py,
    which runs later)."""
    node, run = "gpu014", lab.lab_dir / "run"  # a node no other lab test uses
    env = {**os.environ, **lab.env}
    slurm = SlurmCliImpl(run=functools.partial(subprocess.run, env=env), environ=env)
    paths = LabPaths(lab.lab_dir)
    assert not FAULT_SPECS["gpu-hang"].survives_reboot and FAULT_SPECS["persistence-off"].survives_reboot
    # Faults that neither Prometheus nor opsctl health sees: no other test's view of the lab changes.
    hw = NodeHardware.load(paths.hardware(node), node)
    hw.inject("xid-kernel:79", gpu=3)
    hw.inject("gpu-hang", gpu=2)
    hw.inject("persistence-off", gpu=5)
    hw.save(paths.hardware(node))
    write_kernel_log(paths.kernel_log(node), hw)
    before, started = processes.running(run)[f"slurmd.{node}"], time.time()
    try:
        reboot_cycle.check_cycle(reboot_cycle.reboot_cycle(slurm, node))
        hw = NodeHardware.load(paths.hardware(node), node)
        assert [fault_label(f) for f in hw.active] == ["persistence-off gpu5"] and hw.booted >= started
        assert paths.kernel_log(node).read_text() == ""
        now = processes.running(run)
        assert now[f"slurmd.{node}"] != before and f"reboot.{node}" not in now
        assert processes.cmdline(now[f"slurmd.{node}"]).startswith(f"slurmd -D -b -N {node} ")
        assert reboot_cycle.resume(slurm, node).reason == ""
    finally:
        reboot_hardware(paths, node)  # what the reboot did, should it not have run
        opsctl("lab", "clear", node, env=lab.env)
        # Only after a failure is there a reboot to cancel or a node to resume; both are no-ops otherwise.
        lab.run("scontrol", "cancel_reboot", node, check=False)
        lab.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
