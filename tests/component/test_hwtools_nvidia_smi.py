"""The emulated nvidia-smi, run as a real process against a state file, checked against a real H200
capture (layout and csv) and against the dcgm-exporter emulator (values)."""

import json
import os
import re
import subprocess
import sys
from importlib import resources

import pytest

from opsctl.gpu.nvidia_smi import parse_nvidia_smi_csv
from opsctl.gpu.nvlink import parse_nvlink_status
from opsctl_lab.dcgm_emulator import render
from opsctl_lab.hardware import VBIOS_DRIFT_VERSION, VBIOS_VERSION, NodeHardware
from tests.conftest import FIXTURES

# Real H200 capture (nvidia_gpu_exporter, driver 590.48.01; tests/fixtures/SOURCES.md).
CAPTURE = (FIXTURES / "gpu" / "nvidia-smi_q_and_query-gpu_csv_H200_1gpu.txt").read_text().splitlines()


def _block(first: str, count: int) -> str:
    """`count` lines of the capture, starting at the line that is exactly `first`."""
    start = CAPTURE.index(first)
    return "\n".join(CAPTURE[start:start + count]) + "\n"


# `nvidia-smi`: the table header and the one GPU row.
REAL_TABLE = "\n".join(CAPTURE[CAPTURE.index("+" + "-" * 89 + "+"):][:11]) + "\n"
# `nvidia-smi -q`: the memory and remapped-rows blocks.
REAL_Q = _block("    FB Memory Usage", 9)
REAL_REMAP = _block("    Remapped Rows", 5)


@pytest.fixture
def node(tmp_path):
    """A state file and the environment that points the tools at it."""
    state = tmp_path / "hardware.json"
    NodeHardware(node="gpu7").save(state)
    env = dict(os.environ, OPSCTL_HW_STATE=str(state), OPSCTL_HW_SYSFS_ROOT=str(tmp_path / "sys"))
    return state, env


def smi(env, *args):
    return subprocess.run([sys.executable, "-m", "opsctl_lab.hwtools.nvidia_smi", *args], env=env,
                          capture_output=True, text=True, timeout=30)


def inject(state, fault, **where):
    hw = NodeHardware.load(state, "gpu7")
    hw.inject(fault, **where)
    hw.save(state)


def _skeleton(line: str) -> str:
    """Where a table line has its column bars, and which words it has: what must match the real
    layout whatever the values."""
    words = re.sub(r"[0-9A-F]{8}:[0-9A-F]{2}:00\.0", "", line)
    return "".join(c if c in "|+=-" else " " for c in line) + "".join(re.findall(r"[A-Za-z]+[.:]?", words))


def test_table_has_the_real_layout(node):
    _, env = node
    out = smi(env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    real = REAL_TABLE.splitlines()
    assert lines[1] == real[0]
    assert _skeleton(lines[2]) == _skeleton(real[1].replace("590.48.01 ", "570.133.20").replace("13.1", "12.8"))
    # Header rows are identical to the real ones; each GPU block has the real row skeletons.
    assert lines[3:8] == real[2:7]
    blocks = [lines[i:i + 4] for i in range(8, 8 + 8 * 4, 4)]
    assert len(blocks) == 8
    for gpu, block in enumerate(blocks):
        assert [_skeleton(x) for x in block] == [_skeleton(x) for x in real[7:11]], gpu
        assert "NVIDIA H200" in block[0] and "143771MiB" in block[1]
    assert all(len(x) == 91 for x in lines[1:] if x)
    assert "No running processes found" in out.stdout


def test_query_gpu_name_memory_total_shows_8_h200(node):
    _, env = node
    out = smi(env, "--query-gpu=name,memory.total", "--format=csv")
    assert out.returncode == 0
    assert out.stdout.splitlines()[0] == "name, memory.total [MiB]"
    rows = parse_nvidia_smi_csv(out.stdout)
    assert rows == [{"name": "NVIDIA H200", "memory.total": 143771}] * 8


def test_every_real_csv_field_has_the_real_header_and_unit(node):
    _, env = node
    real = json.loads(resources.files("opsctl_lab.hwtools").joinpath("nvidia_smi_fields.json").read_text())
    out = smi(env, "--query-gpu=" + ",".join(real), "--format=csv", "-i", "0")
    assert out.returncode == 0, out.stdout
    header, row = out.stdout.splitlines()
    assert header.split(", ") == [h for h, _ in real.values()]
    for (field, (_, real_value)), value in zip(real.items(), row.split(", "), strict=True):
        last = real_value.rsplit(" ", 1)[-1]
        unit = last if last in ("MiB", "W", "%", "MHz", "us") else None
        if unit:
            assert value.endswith(" " + unit), (field, value, real_value)
        assert (value == "[N/A]") == (real_value == "[N/A]"), field


def test_nounits_and_noheader(node):
    _, env = node
    out = smi(env, "--query-gpu=index,memory.used,power.draw", "--format=csv,noheader,nounits")
    rows = parse_nvidia_smi_csv(out.stdout, fields=["index", "memory.used", "power.draw"])
    assert [r["index"] for r in rows] == list(range(8))
    assert all(isinstance(r["power.draw"], float) for r in rows)


def test_leftover_memory_shows_as_a_process_on_that_gpu_only(node):
    state, env = node
    inject(state, "gpu-leftover-memory", gpu=5)
    apps = smi(env, "--query-compute-apps=pid,process_name,used_memory,gpu_bus_id", "--format=csv")
    rows = parse_nvidia_smi_csv(apps.stdout)
    assert len(rows) == 1 and rows[0]["process_name"] == "python3" and rows[0]["used_gpu_memory"] > 80000
    used = parse_nvidia_smi_csv(smi(env, "--query-gpu=index,memory.used", "--format=csv").stdout)
    assert [r["memory.used"] > 80000 for r in used] == [g == 5 for g in range(8)]
    assert rows[0]["gpu_bus_id"] == "00000000:AB:00.0"
    table = smi(env).stdout
    assert re.search(r"\|\s+5\s+N/A\s+N/A\s+\d+\s+C\s+python3\s+\d+MiB \|", table)


def test_compute_apps_header_only_when_idle(node):
    _, env = node
    out = smi(env, "--query-compute-apps=pid,used_memory", "--format=csv")
    assert out.stdout == "pid, used_gpu_memory [MiB]\n"


def test_ecc_and_row_remap_faults_show_in_q_and_csv(node):
    state, env = node
    inject(state, "dbe", gpu=2)
    inject(state, "row-remap-failure", gpu=3)
    rows = parse_nvidia_smi_csv(smi(env, "--query-gpu=index,ecc.errors.uncorrected.volatile.total,"
                                                  "remapped_rows.failure", "--format=csv").stdout)
    assert [r["ecc.errors.uncorrected.volatile.total"] >= 1 for r in rows] == [g == 2 for g in range(8)]
    assert [r["remapped_rows.failure"] for r in rows] == ["Yes" if g == 3 else "No" for g in range(8)]
    q3 = smi(env, "-q", "-i", "3").stdout
    assert "Remapping Failure Occurred                     : Yes" in q3


def test_a_stuck_fabric_shows_in_q_csv_and_dcgm_alike(node):
    """fabric-stuck on GPU 4: nvidia-smi's Fabric section and fabric.state say In Progress (the real
    capture's words for a trained GPU are Completed / Success), and DCGM's Fabric Manager status is 2."""
    state, env = node
    inject(state, "fabric-stuck", gpu=4)
    rows = parse_nvidia_smi_csv(smi(env, "--query-gpu=index,fabric.state,fabric.status", "--format=csv").stdout)
    assert [(r["fabric.state"], r["fabric.status"]) for r in rows] == [
        ("In Progress", None) if g == 4 else ("Completed", "Success") for g in range(8)]  # N/A reads as None
    fabric = smi(env, "-q", "-i", "4").stdout.split("    Fabric\n", 1)[1].splitlines()[:2]
    assert [line.split(":")[1].strip() for line in fabric] == ["In Progress", "N/A"]
    metrics = render(NodeHardware.load(state, "gpu7"))
    assert re.search(r'DCGM_FI_DEV_FABRIC_MANAGER_STATUS{gpu="4",[^}]*} 2$', metrics, re.M)
    assert len(re.findall(r"^DCGM_FI_DEV_FABRIC_MANAGER_STATUS{.*} 3$", metrics, re.M)) == 7


def test_mig_on_and_ecc_off_show_in_q_and_csv_on_their_gpu(node):
    state, env = node
    inject(state, "mig-on", gpu=4)
    inject(state, "ecc-off", gpu=1)
    rows = parse_nvidia_smi_csv(smi(env, "--query-gpu=index,mig.mode.current,ecc.mode.current", "--format=csv").stdout)
    assert [(r["mig.mode.current"], r["ecc.mode.current"]) for r in rows] == [
        ("Enabled" if g == 4 else "Disabled", "Disabled" if g == 1 else "Enabled") for g in range(8)]
    q4, q1 = smi(env, "-q", "-i", "4").stdout, smi(env, "-q", "-i", "1").stdout
    assert "    MIG Mode\n        Current                                        : Enabled\n" in q4
    assert "    ECC Mode\n        Current                                        : Disabled\n" in q1


def test_a_power_brake_shows_in_q_csv_and_dcgm_alike(node):
    """clock-slowdown:power-brake on GPU 3: -q's Clocks Event Reasons say HW Slowdown and HW Power Brake
    Slowdown Active, not Idle; the csv's active mask is DCGM's (0x88) and the GPU is busy in both."""
    state, env = node
    inject(state, "clock-slowdown:power-brake", gpu=3)
    fields = "index,clocks_event_reasons.active,clocks_event_reasons.hw_power_brake_slowdown,utilization.gpu"
    rows = parse_nvidia_smi_csv(smi(env, f"--query-gpu={fields}", "--format=csv").stdout)
    assert [(r["clocks_event_reasons.active"], r["clocks_event_reasons.hw_power_brake_slowdown"]) for r in rows] == [
        ("0x0000000000000088", "Active") if g == 3 else ("0x0000000000000001", "Not Active") for g in range(8)]
    q3 = smi(env, "-q", "-i", "3").stdout
    for line in ("        Idle                                           : Not Active",
                 "        HW Slowdown                                    : Active",
                 "            HW Power Brake Slowdown                    : Active",
                 "        GPU                                            : 100 %"):
        assert line + "\n" in q3, line
    metrics = render(NodeHardware.load(state, "gpu7"))
    assert re.search(r'^DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu="3",[^}]*} 136$', metrics, re.M)
    assert re.search(r'^DCGM_FI_DEV_GPU_UTIL{gpu="3",[^}]*} 100$', metrics, re.M)


def test_a_downtrained_link_shows_in_q_csv_and_dcgm_alike(node):
    state, env = node
    inject(state, "pcie-downtrain", gpu=5)
    rows = parse_nvidia_smi_csv(smi(env, "--query-gpu=index,pcie.link.width.current,pcie.link.width.max",
                                    "--format=csv").stdout)
    assert [(r["pcie.link.width.current"], r["pcie.link.width.max"]) for r in rows] == [
        (8 if g == 5 else 16, 16) for g in range(8)]
    width = smi(env, "-q", "-i", "5").stdout.split("            Link Width\n", 1)[1].splitlines()[:2]
    assert [line.split(":")[1].strip() for line in width] == ["16x", "8x"]
    assert re.search(r'^DCGM_FI_DEV_PCIE_LINK_WIDTH{gpu="5",[^}]*} 8$', render(NodeHardware.load(state, "gpu7")), re.M)


def test_a_drifted_vbios_shows_in_q_csv_and_dcgm_alike(node):
    state, env = node
    inject(state, "vbios-drift", gpu=2)
    rows = parse_nvidia_smi_csv(smi(env, "--query-gpu=index,vbios_version", "--format=csv").stdout)
    assert [r["vbios_version"] for r in rows] == [VBIOS_DRIFT_VERSION if g == 2 else VBIOS_VERSION for g in range(8)]
    assert f"    VBIOS Version                                      : {VBIOS_DRIFT_VERSION}\n" in \
        smi(env, "-q", "-i", "2").stdout
    assert re.search(rf'^DCGM_FI_DEV_GPU_TEMP{{gpu="2",[^}}]*DCGM_FI_DEV_VBIOS_VERSION="{VBIOS_DRIFT_VERSION}"',
                     render(NodeHardware.load(state, "gpu7")), re.M)


def test_nvlink_status_has_the_real_layout_and_shows_a_down_and_a_slow_link(node):
    """`nvidia-smi nvlink -s`, line for line in the real capture's form, read by opsctl's own parser."""
    state, env = node
    inject(state, "nvlink-down:3", gpu=1)
    inject(state, "nvlink-degraded:7", gpu=5)
    proc = smi(env, "nvlink", "-s")
    real = (FIXTURES / "gpu" / "nvidia-smi_nvlink_-s_2xH100_PCIe.txt").read_text().splitlines()
    shape = re.compile(r"^(GPU \d+: .+ \(UUID: GPU-[0-9a-f-]+\)|\t Link \d+: (\d+\.\d{3} GB/s|<inactive>))$")
    assert all(shape.match(line) for line in real) and all(shape.match(line) for line in proc.stdout.splitlines())
    speeds = parse_nvlink_status(proc.stdout)
    assert sorted(speeds) == list(range(8)) and all(sorted(links) == list(range(18)) for links in speeds.values())
    assert {(g, link, s) for g, links in speeds.items() for link, s in links.items() if s != 26.562e9} == {
        (1, 3, 0.0), (5, 7, 13.281e9)}
    one = smi(env, "nvlink", "--status", "-i", "1").stdout
    assert one.splitlines()[0].startswith("GPU 1: NVIDIA H200 (UUID: ") and "\t Link 3: <inactive>\n" in one
    assert smi(env, "nvlink").returncode == 2


def test_q_blocks_have_the_real_layout(node):
    _, env = node
    q = smi(env, "-q").stdout
    assert q.count("    Product Name                                       : NVIDIA H200") == 8
    assert "Attached GPUs                                          : 8" in q
    first = q.split("\nGPU ")[1]
    for block in (REAL_Q, REAL_REMAP):
        keys = [line.split(":")[0] for line in block.splitlines()]
        start = first.splitlines().index(block.splitlines()[0])
        got = first.splitlines()[start:start + len(keys)]
        assert [line.split(":")[0] for line in got] == keys
    assert REAL_Q.splitlines()[1] in first  # Total 143771 MiB, as on the real H200


def test_values_agree_with_the_dcgm_exporter_emulator(node):
    state, env = node
    inject(state, "thermal", gpu=1)
    rows = parse_nvidia_smi_csv(smi(env, "--query-gpu=index,temperature.gpu,memory.used",
                                             "--format=csv").stdout)
    metrics = render(NodeHardware.load(state, "gpu7"))
    for row in rows:
        temp = re.search(rf'DCGM_FI_DEV_GPU_TEMP{{gpu="{row["index"]}",[^}}]*}} (\d+)', metrics)
        used = re.search(rf'DCGM_FI_DEV_FB_USED{{gpu="{row["index"]}",[^}}]*}} (\d+)', metrics)
        assert int(temp[1]) == row["temperature.gpu"] and int(used[1]) == row["memory.used"]
    assert rows[1]["temperature.gpu"] > 90


def test_a_driver_installed_with_opsctl_hw_is_the_one_every_tool_reports(node):
    """`opsctl-hw driver VERSION` stands in for a driver install and load on an emulated node (the nvidia
    role's rollout): nvidia-smi's csv, -q and table, and dcgm-exporter's label all report it."""
    state, env = node
    installed = subprocess.run([sys.executable, "-m", "opsctl_lab.hwtools.admin", "driver", "570.172.08"], env=env,
                               capture_output=True, text=True, timeout=30)
    assert installed.returncode == 0 and "driver 570.172.08 loaded" in installed.stdout, installed.stderr
    csv = smi(env, "--query-gpu=index,driver_version", "--format=csv,noheader").stdout.splitlines()
    assert csv == [f"{gpu}, 570.172.08" for gpu in range(8)]
    assert re.search(r"^Driver Version\s+: 570\.172\.08$", smi(env, "-q").stdout, re.M)
    assert "Driver Version: 570.172.08" in smi(env).stdout
    assert 'DCGM_FI_DRIVER_VERSION="570.172.08"' in render(NodeHardware.load(state, "gpu7"))


def test_gpu_fallen_off_the_bus(node):
    state, env = node
    inject(state, "gpu-missing", gpu=4)
    out = smi(env, "--query-gpu=index", "--format=csv,noheader")
    assert out.returncode == 15  # nvidia-smi(1): "The GPU has fallen off the bus"
    assert "Unable to determine the device handle for GPU0000:9A:00.0: Unknown Error" in out.stdout
    assert parse_nvidia_smi_csv(out.stdout, fields=["index"]) == [{"index": g} for g in range(8) if g != 4]


def test_bad_field_is_rc_2(node):
    _, env = node
    out = smi(env, "--query-gpu=bogus", "--format=csv")
    assert out.returncode == 2
    assert out.stdout.startswith('Field "bogus" is not a valid field to query.')


# Real `nvidia-smi topo -m` of an 8-GPU HGX board (that host has 6 NICs): the header and GPU0's row.
REAL_TOPO = "\n".join((FIXTURES / "gpu" / "nvidia-smi_topo_-m_8xH100_HGX_NV18.txt").read_text().splitlines()[1:3])


def test_topo_matrix_layout_and_rails(node):
    _, env = node
    out = smi(env, "topo", "-m")
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    real_header = REAL_TOPO.splitlines()[0].split("\t")
    header = lines[0].split("\t")
    assert header[:9] == real_header[:9] and header[-3:] == real_header[-3:]
    assert header[9:-3] == [f"NIC{i}" for i in range(9)]
    cpus = sorted(os.sched_getaffinity(0))
    for gpu in range(8):
        cells = lines[1 + gpu].split("\t")
        assert cells[0] == f"GPU{gpu}" and cells[1 + gpu] == " X "
        assert [c for c in cells[1:9] if c != " X "] == ["NV18"] * 7
        assert cells[9 + gpu] == "PIX" and cells[9:18].count("PIX") == 1  # rail-aligned NIC mlx5_<gpu>
        affinity = [int(x) for part in cells[18].split(",") for x in range(
            int(part.split("-")[0]), int(part.split("-")[-1]) + 1)]
        assert set(affinity) <= set(cpus) and cells[19] == str(0 if gpu < 4 else 1) and cells[-1] == "N/A"
    assert "  NIC8: mlx5_bond_0" in out.stdout
    assert "  NV#  = Connection traversing a bonded set of # NVLinks" in out.stdout


def _persistence(env) -> list[str]:
    rows = parse_nvidia_smi_csv(smi(env, "--query-gpu=index,persistence_mode", "--format=csv").stdout)
    return [r["persistence_mode"] for r in rows]


def test_persistence_mode(node):
    _, env = node
    out = smi(env, "-pm", "1")
    assert out.returncode == 0 and out.stdout.splitlines()[-1] == "All done."
    assert out.stdout.count("Persistence mode is already Enabled for GPU") == 8
    assert _persistence(env) == ["Enabled"] * 8


def test_pm_toggles_persistence_mode_and_every_output_reports_it(node):
    """nvidia-smi's own lines (-pm 0 on a GPU that has it: "Disabled persistence mode for GPU <bus id>.",
    then "All done."); the state file keeps the mode for the next call."""
    _, env = node
    off = smi(env, "-pm", "0", "-i", "3")
    assert off.returncode == 0
    assert off.stdout == "Disabled persistence mode for GPU 00000000:5D:00.0.\nAll done.\n"
    assert _persistence(env) == ["Disabled" if g == 3 else "Enabled" for g in range(8)]
    assert "    Persistence Mode                                   : Disabled" in smi(env, "-q", "-i", "3").stdout
    assert "    Persistence Mode                                   : Enabled" in smi(env, "-q", "-i", "2").stdout
    # The table's Persistence-M column: "Off" where a real H100 node without persistence mode shows it
    # ("|   0  NVIDIA H100 80GB HBM3          Off |"), in the column of the real H200's "On ".
    table = smi(env).stdout.splitlines()
    row3, row2 = next(x for x in table if x.startswith("|   3 ")), next(x for x in table if x.startswith("|   2 "))
    assert "NVIDIA H200                    Off |" in row3 and "NVIDIA H200                    On  |" in row2
    real = REAL_TABLE.splitlines()[7]
    assert [i for i, c in enumerate(row3) if c == "|"] == [i for i, c in enumerate(real) if c == "|"]
    again = smi(env, "--persistence-mode=0", "-i", "3")
    assert again.stdout == "Persistence mode is already Disabled for GPU 00000000:5D:00.0.\nAll done.\n"
    on = smi(env, "-pm", "1")
    assert on.returncode == 0 and on.stdout.splitlines()[-1] == "All done."
    assert "Enabled persistence mode for GPU 00000000:5D:00.0." in on.stdout.splitlines()
    assert on.stdout.count("Persistence mode is already Enabled for GPU") == 7
    assert _persistence(env) == ["Enabled"] * 8
    assert smi(env, "-pm", "2").returncode == 2


def test_the_persistence_off_fault_turns_it_off_until_clear(node):
    state, env = node
    inject(state, "persistence-off", gpu=5)
    assert _persistence(env) == ["Disabled" if g == 5 else "Enabled" for g in range(8)]
    assert smi(env, "-pm", "0", "-i", "5").stdout.startswith("Persistence mode is already Disabled for GPU")
    hw = NodeHardware.load(state, "gpu7")
    hw.clear()
    hw.save(state)
    assert _persistence(env) == ["Enabled"] * 8


def test_minor_numbers_follow_the_state(node):
    """The lab machine with reversed minor numbers (hwinstall.py) shows them in -q, where the real tool
    prints them; the default state numbers them as the indexes."""
    state, env = node
    minors = re.findall(r"Minor Number\s+: (\d+)", smi(env, "-q").stdout)
    assert minors == [str(i) for i in range(8)]
    hw = NodeHardware.load(state, "gpu7")
    hw.minors = list(reversed(range(8)))
    hw.save(state)
    out = smi(env, "-q").stdout
    assert re.findall(r"Minor Number\s+: (\d+)", out) == [str(7 - i) for i in range(8)]
    real = next(line for line in CAPTURE if "Minor Number" in line)
    assert real.replace(": 0", ": 7") in out.splitlines()  # the real line's layout


def test_a_hung_gpu_hangs_every_query_that_reaches_it(node):
    state, env = node
    inject(state, "gpu-hang", gpu=2)
    hung = subprocess.run(["timeout", "2", sys.executable, "-m", "opsctl_lab.hwtools.nvidia_smi", "-q"], env=env,
                          capture_output=True, text=True, timeout=30)
    assert hung.returncode == 124
    assert smi(env, "--query-gpu=index", "--format=csv,noheader", "-i", "3").stdout == "3\n"
