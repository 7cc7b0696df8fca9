"""Emulated `nvidia-smi` for the 8 H200 GPUs of a lab machine.

Forms (layouts copied from a real H200, tests/fixtures/gpu/nvidia-smi_q_and_query-gpu_csv_H200_1gpu.txt):
  nvidia-smi                                   the default table
  nvidia-smi -q [-i N]                         the full query
  nvidia-smi -L                                one line per GPU
  nvidia-smi --query-gpu=F1,F2 --format=csv[,noheader][,nounits] [-i N]
  nvidia-smi --query-compute-apps=F1,F2 --format=csv[,noheader][,nounits]
  nvidia-smi topo -m                           the topology matrix (nvidia_smi_topo.py)
  nvidia-smi -pm 0|1 [-i N]                    persistence mode (nvidia_smi_topo.py), kept in the state file
  nvidia-smi -r|--gpu-reset [-i N]             reset the GPU (nvidia_smi_reset.py): refused (rc 255) while
                                               a process or the persistence daemon holds it

Values come from the hardware state through the dcgm-exporter emulator's GpuView, so nvidia-smi and
DCGM report the same temperature, power, memory and error counters. A GPU with the gpu-hang fault makes
every query that reaches it hang, as NVML does with a GPU that stopped answering. The minor numbers
of -q are the state's (NodeHardware.minor), not always the index. Persistence mode is Enabled unless
`-pm 0` or the persistence-off fault turned it off; the table, -q and --query-gpu show it. Return codes
as documented in nvidia-smi(1): 0 success, 2 invalid argument, 15 a GPU has fallen off the bus; a refused
reset exits 255 (nvidia_smi_reset.py).
"""

import json
import sys
import time
from importlib import resources
from typing import Any

from opsctl_lab import hardware as hwm
from opsctl_lab.dcgm_emulator import PCI_BUS_IDS, GpuView, gpu_uuid
from opsctl_lab.hardware import NodeHardware, leftover_pid, stable_int
from opsctl_lab.hwtools.common import load, main_guard, state_path
from opsctl_lab.hwtools.nvidia_smi_reset import gpu_reset, monitoring_holders
from opsctl_lab.hwtools.nvidia_smi_topo import persistence_mode, render_topo
from opsctl_lab.training_load import read_load

RC_INVALID = 2
RC_FELL_OFF_BUS = 15
CUDA_VERSION = "12.8"  # the CUDA version driver 570 reports
HANG_SECONDS = 3600
# The default table's "Compute M." column abbreviates the -q words to fit its ten characters.
TABLE_COMPUTE_MODES = {"Default": "Default", "Prohibited": "Prohibited", "Exclusive_Process": "E. Process"}
KEY_WIDTH = 55  # column of the ':' in -q output
PERSISTENCE_VALUES = {"1": True, "ENABLED": True, "0": False, "DISABLED": False}  # nvidia-smi -pm's values

_FIELDS = json.loads(resources.files("opsctl_lab.hwtools").joinpath("nvidia_smi_fields.json").read_text())
_Q_TEMPLATE = resources.files("opsctl_lab.hwtools").joinpath("nvidia_smi_q.txt").read_text()
APP_FIELDS = {  # --query-compute-apps field -> csv header
    "timestamp": "timestamp", "gpu_name": "gpu_name", "gpu_bus_id": "gpu_bus_id", "gpu_serial": "gpu_serial",
    "gpu_uuid": "gpu_uuid", "pid": "pid", "process_name": "process_name", "name": "process_name",
    "used_memory": "used_gpu_memory [MiB]", "used_gpu_memory": "used_gpu_memory [MiB]",
}


def bus_id(gpu: int) -> str:
    return f"00000000:{PCI_BUS_IDS[gpu]}:00.0"


def processes(hw: NodeHardware, gpu: int) -> list[dict[str, Any]]:
    """Compute processes on a GPU. Only a leftover (dead job) process can be there in the lab."""
    if not hw.has("gpu-leftover-memory", gpu=gpu):
        return []
    view = GpuView(hw, gpu, time.time())
    return [{"pid": leftover_pid(gpu), "name": hwm.LEFTOVER_PROCESS, "used_mib": view.fb_used}]


def gpu_serial(node: str, gpu: int) -> str:
    return f"{1650924000000 + stable_int(node, gpu, 'serial', modulo=10**6)}"


def values(hw: NodeHardware, gpu: int, now: float) -> dict[str, Any]:
    """Every dynamic value of one GPU, named as in the -q template; a training rank's load as DCGM shows it."""
    view = GpuView(hw, gpu, now, read_load(state_path()))
    events = view.clock_events()
    sbe, dbe = int(view.counter("ecc_sbe_vol")), int(view.counter("ecc_dbe_vol"))
    power = min(hwm.POWER_LIMIT_W, view.power() + view.jitter("mw", 1000) / 1000.0)

    def event(bit: int) -> str:
        return "Active" if events & bit else "Not Active"
    return {
        "persistence_mode": "Enabled" if hw.persistence_mode(gpu) else "Disabled",
        "bus_id": bus_id(gpu), "bus": PCI_BUS_IDS[gpu], "minor": hw.minor(gpu), "module_id": gpu + 1,
        "serial": gpu_serial(hw.node, gpu), "vbios": view.vbios(),
        "uuid": gpu_uuid(hw.node, gpu), "pdi": f"0x{stable_int(hw.node, gpu, 'pdi', modulo=1 << 64):016x}",
        "board_id": f"0x{int(PCI_BUS_IDS[gpu], 16) << 8:x}",
        "pcie_replays": int(view.counter("pcie_replay")),
        "tx_kbs": 300 + view.jitter("tx", 100), "rx_kbs": 300 + view.jitter("rx", 100),
        "pstate": "P0",
        "ev_idle": event(hwm.CLOCK_EVENT_GPU_IDLE), "ev_sw_power_cap": event(hwm.CLOCK_EVENT_SW_POWER_CAP),
        "ev_hw_slowdown": event(hwm.CLOCK_EVENT_HW_SLOWDOWN),
        "ev_hw_thermal": event(hwm.CLOCK_EVENT_HW_THERMAL), "ev_sw_thermal": event(hwm.CLOCK_EVENT_SW_THERMAL),
        "ev_hw_power_brake": event(hwm.CLOCK_EVENT_HW_POWER_BRAKE), "gpu_util": 100 if view.busy() else 0,
        "fb_used": view.fb_used, "fb_free": hwm.FB_TOTAL_MIB - hwm.FB_RESERVED_MIB - view.fb_used,
        "sbe_vol": sbe, "dbe_vol": dbe, "sbe_agg": sbe, "dbe_agg": dbe,
        "remap_corr": int(view.counter("correctable_remapped_rows")),
        "remap_uncorr": int(view.counter("uncorrectable_remapped_rows")),
        "remap_pending": "Yes" if view.has("row-remap-pending") else "No",
        "remap_failure": "Yes" if view.has("row-remap-failure") else "No",
        "temp": view.temp(), "mem_temp": view.temp() + 3,
        "power": f"{power:.2f}", "power_avg": f"{power:.2f}",
        "sm_clock": view.sm_clock(), "pcie_width": view.pcie_width(),
        "clock_events": events,
        "mig_mode": "Enabled" if view.has("mig-on") else "Disabled",
        "compute_mode": hwm.COMPUTE_MODES[view.compute_mode()],
        "ecc_mode": "Disabled" if view.has("ecc-off") else "Enabled",
        # NVML's fabric status is read only once the state is Completed; before that nvidia-smi prints N/A.
        "fabric_state": hwm.FABRIC_STATES[view.fabric_status()],
        "fabric_status": "Success" if view.fabric_status() == hwm.FABRIC_SUCCESS else "N/A",
    }


def _missing(hw: NodeHardware, gpus: list[int]) -> list[int]:
    return [g for g in gpus if not hw.gpu_present(g)]


def _missing_lines(hw: NodeHardware, gpus: list[int]) -> str:
    # What nvidia-smi prints for a GPU that NVML cannot reach (XID 79, "fallen off the bus").
    return "".join(f"Unable to determine the device handle for GPU{bus_id(g)[4:]}: Unknown Error\n"
                   for g in _missing(hw, gpus))


# ---- default table -------------------------------------------------------------------------------
SEP = "+-----------------------------------------+------------------------+----------------------+"
WIDE = "+-----------------------------------------------------------------------------------------+"


def render_table(hw: NodeHardware, now: float, gpus: list[int]) -> str:
    out = [time.asctime(time.localtime(now)) + "       ",
           WIDE,
           f"| NVIDIA-SMI {hw.loaded_driver():<22} Driver Version: {hw.loaded_driver():<14} "
           f"CUDA Version: {CUDA_VERSION:<9}|",
           SEP,
           "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
           "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
           "|                                         |                        |               MIG M. |",
           "|=========================================+========================+======================|"]
    procs = []
    for gpu in gpus:
        if not hw.gpu_present(gpu):
            continue
        v = values(hw, gpu, now)
        watts = int(float(v["power"]))
        used = f"{v['fb_used']}MiB / {hwm.FB_TOTAL_MIB}MiB"
        persistence = "On" if v["persistence_mode"] == "Enabled" else "Off"
        out += [f"| {gpu:>3}  {hwm.GPU_MODEL:<31}{persistence:<4}|   {v['bus_id']} Off | {v['dbe_vol']:>20} |",
                f"| N/A  {v['temp']:>3}C    {v['pstate']}  {watts:>13}W / {int(hwm.POWER_LIMIT_W):>4}W |"
                f" {used:>22} | {v['gpu_util']:>6}%{TABLE_COMPUTE_MODES[v['compute_mode']]:>13} |",
                "|                                         |                        |             Disabled |",
                SEP]
        procs += [(gpu, p) for p in processes(hw, gpu)]
    out += ["", WIDE,
            "| Processes:                                                                              |",
            "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
            "|        ID   ID                                                               Usage      |",
            "|=========================================================================================|"]
    if not procs:
        out.append("|  No running processes found                                                             |")
    for gpu, proc in procs:
        out.append(f"|{gpu:>5}{'N/A':>5}{'N/A':>5}{proc['pid']:>17}{'C':>7}   {proc['name']:<36}"
                   f"{str(proc['used_mib']) + 'MiB':>10} |")
    out.append(WIDE)
    return "\n".join(out) + "\n"


# ---- -q --------------------------------------------------------------------------------------------
def _kv(indent: int, key: str, value: object) -> str:
    return f"{' ' * indent + key:<{KEY_WIDTH}}: {value}"


def render_q(hw: NodeHardware, now: float, gpus: list[int]) -> str:
    stamp = time.asctime(time.localtime(now))
    present = [g for g in gpus if hw.gpu_present(g)]
    out = ["", "==============NVSMI LOG==============", "", _kv(0, "Timestamp", stamp),
           _kv(0, "Driver Version", hw.loaded_driver()), _kv(0, "CUDA Version", CUDA_VERSION), "",
           _kv(0, "Attached GPUs", sum(hw.gpu_present(g) for g in range(hwm.GPUS_PER_NODE)))]
    for gpu in present:
        v = values(hw, gpu, now)
        procs = processes(hw, gpu)
        if procs:
            lines = ["    Processes"]
            for proc in procs:
                lines += [_kv(8, "GPU instance ID", "N/A"), _kv(8, "Compute instance ID", "N/A"),
                          _kv(8, "Process ID", proc["pid"]), _kv(12, "Type", "C"), _kv(12, "Name", proc["name"]),
                          _kv(12, "Used GPU Memory", f"{proc['used_mib']} MiB")]
            v["processes"] = "\n".join(lines)
        else:
            v["processes"] = _kv(4, "Processes", "None")
        # The template's line is the real capture's (Enabled); a GPU with persistence mode off says Disabled.
        block = _Q_TEMPLATE.format_map(v).replace(_kv(4, "Persistence Mode", "Enabled"),
                                                  _kv(4, "Persistence Mode", v["persistence_mode"]))
        block = block.replace(_kv(4, "Compute Mode", "Default"), _kv(4, "Compute Mode", v["compute_mode"]))
        out.append(block.rstrip("\n"))
    return "\n".join(out) + "\n\n"


# ---- --query-gpu / --query-compute-apps ----------------------------------------------------------
def csv_values(hw: NodeHardware, gpu: int, now: float) -> dict[str, str]:
    """field -> csv value with units, for every field of the real H200 capture."""
    v = values(hw, gpu, now)
    row = {name: value for name, (_header, value) in _FIELDS.items()}
    events = v["clock_events"]
    row.update({
        "timestamp": time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}",
        "driver_version": hw.loaded_driver(), "count": str(sum(hw.gpu_present(g) for g in range(8))),
        "name": hwm.GPU_MODEL, "serial": v["serial"], "uuid": v["uuid"], "pci.bus_id": v["bus_id"],
        "vbios_version": v["vbios"],
        "pci.bus": f"0x{v['bus']}", "index": str(gpu), "persistence_mode": v["persistence_mode"],
        "clocks_event_reasons.active": f"0x{events:016X}",
        "clocks_event_reasons.gpu_idle": v["ev_idle"], "clocks_event_reasons.hw_slowdown": v["ev_hw_slowdown"],
        "clocks_event_reasons.sw_power_cap": v["ev_sw_power_cap"],
        "clocks_event_reasons.hw_thermal_slowdown": v["ev_hw_thermal"],
        "clocks_event_reasons.sw_thermal_slowdown": v["ev_sw_thermal"],
        "clocks_event_reasons.hw_power_brake_slowdown": v["ev_hw_power_brake"],
        "utilization.gpu": f"{v['gpu_util']} %", "pcie.link.width.current": str(v["pcie_width"]),
        "memory.used": f"{v['fb_used']} MiB", "memory.free": f"{v['fb_free']} MiB",
        "ecc.errors.corrected.volatile.dram": str(v["sbe_vol"]),
        "ecc.errors.corrected.volatile.total": str(v["sbe_vol"]),
        "ecc.errors.corrected.aggregate.dram": str(v["sbe_agg"]),
        "ecc.errors.corrected.aggregate.total": str(v["sbe_agg"]),
        "ecc.errors.uncorrected.volatile.dram": str(v["dbe_vol"]),
        "ecc.errors.uncorrected.volatile.total": str(v["dbe_vol"]),
        "ecc.errors.uncorrected.aggregate.dram": str(v["dbe_agg"]),
        "ecc.errors.uncorrected.aggregate.total": str(v["dbe_agg"]),
        "remapped_rows.correctable": str(v["remap_corr"]), "remapped_rows.uncorrectable": str(v["remap_uncorr"]),
        "remapped_rows.pending": v["remap_pending"], "remapped_rows.failure": v["remap_failure"],
        "temperature.gpu": str(v["temp"]), "temperature.memory": str(v["mem_temp"]),
        "power.draw": f"{v['power']} W", "power.draw.average": f"{v['power_avg']} W",
        "power.draw.instant": f"{v['power']} W",
        "clocks.current.graphics": f"{v['sm_clock']} MHz", "clocks.current.sm": f"{v['sm_clock']} MHz",
        "platform.module_id": str(gpu + 1),
        "fabric.state": v["fabric_state"], "fabric.status": v["fabric_status"],
        "mig.mode.current": v["mig_mode"], "mig.mode.pending": v["mig_mode"], "compute_mode": v["compute_mode"],
        "ecc.mode.current": v["ecc_mode"], "ecc.mode.pending": v["ecc_mode"],
    })
    return row


def _strip_unit(value: str) -> str:
    for unit in (" MiB", " W", " %", " MHz", " us", " ms"):
        if value.endswith(unit):
            return value[: -len(unit)]
    return value


def _csv(header: list[str], rows: list[list[str]], opts: set[str]) -> str:
    lines = [] if "noheader" in opts else [", ".join(header)]
    for row in rows:
        lines.append(", ".join(_strip_unit(x) if "nounits" in opts else x for x in row))
    return "".join(line + "\n" for line in lines)


def query_gpu(hw: NodeHardware, now: float, fields: list[str], opts: set[str], gpus: list[int]) -> str:
    aliases = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id", "gpu_serial": "serial"}
    fields = [aliases.get(f, f) for f in fields]
    header = [_FIELDS[f][0] for f in fields]
    rows = []
    for gpu in gpus:
        if hw.gpu_present(gpu):
            row = csv_values(hw, gpu, now)
            rows.append([row[f] for f in fields])
    return _csv(header, rows, opts)


def query_apps(hw: NodeHardware, now: float, fields: list[str], opts: set[str]) -> str:
    header = [APP_FIELDS[f] for f in fields]
    rows = []
    for gpu in range(hwm.GPUS_PER_NODE):
        if not hw.gpu_present(gpu):
            continue
        gv = csv_values(hw, gpu, now)
        for proc in processes(hw, gpu):
            cell = {"timestamp": gv["timestamp"], "gpu_name": gv["name"], "gpu_bus_id": gv["pci.bus_id"],
                    "gpu_serial": gv["serial"], "gpu_uuid": gv["uuid"], "pid": str(proc["pid"]),
                    "process_name": proc["name"], "name": proc["name"],
                    "used_memory": f"{proc['used_mib']} MiB", "used_gpu_memory": f"{proc['used_mib']} MiB"}
            rows.append([cell[f] for f in fields])
    return _csv(header, rows, opts)


# ---- command line ----------------------------------------------------------------------------------
class Usage(Exception):
    pass


def _parse(argv: list[str]) -> dict[str, Any]:
    opts: dict[str, Any] = {"mode": "table", "gpus": list(range(hwm.GPUS_PER_NODE)), "format": None}
    args = list(argv)
    while args:
        arg = args.pop(0)
        key, eq, val = arg.partition("=")
        if key in ("-i", "--id"):
            val = val if eq else (args.pop(0) if args else "")
            try:
                opts["gpus"] = [int(x) for x in val.split(",")]
            except ValueError as err:
                raise Usage(f'Invalid value "{val}" for parameter -i') from err
            if any(not 0 <= g < hwm.GPUS_PER_NODE for g in opts["gpus"]):
                raise Usage("No devices were found")
        elif arg in ("-q", "--query"):
            opts["mode"] = "q"
        elif arg in ("-L", "--list-gpus"):
            opts["mode"] = "list"
        elif arg in ("-r", "--gpu-reset"):
            opts["mode"] = "reset"
        elif key in ("-pm", "--persistence-mode"):
            val = val if eq else (args.pop(0) if args else "")
            if val.upper() not in PERSISTENCE_VALUES:
                raise Usage(f'Invalid value "{val}" for parameter -pm')
            opts["mode"] = "pm"
            opts["enable"] = PERSISTENCE_VALUES[val.upper()]
        elif key in ("--query-gpu", "--query-compute-apps") and eq:
            opts["mode"] = key
            opts["fields"] = [f.strip() for f in val.split(",") if f.strip()]
        elif key == "--format" and eq:
            opts["format"] = {x.strip() for x in val.split(",")}
        else:
            raise Usage("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.")
    if opts["mode"].startswith("--query"):
        if not opts["format"] or "csv" not in opts["format"]:
            raise Usage(f"{opts['mode']} requires --format=csv")
        known = APP_FIELDS if opts["mode"] == "--query-compute-apps" else {
            **_FIELDS, "gpu_name": 1, "gpu_uuid": 1, "gpu_bus_id": 1, "gpu_serial": 1}
        for name in opts["fields"]:
            if name not in known:
                raise Usage(f'Field "{name}" is not a valid field to query.')
    return opts


# ---- nvlink -s ------------------------------------------------------------------------------------
def render_nvlink_status(hw: NodeHardware, now: float, gpus: list[int]) -> str:
    """`nvidia-smi nvlink -s`: each GPU's line, then each link's speed (tests/fixtures/gpu/
    nvidia-smi_nvlink_-s_2xH100_PCIe.txt: a tab and a space before each link)."""
    out = []
    for gpu in gpus:
        if not hw.gpu_present(gpu):
            continue
        out.append(f"GPU {gpu}: {hwm.GPU_MODEL} (UUID: {gpu_uuid(hw.node, gpu)})\n")
        for link, speed in GpuView(hw, gpu, now).nvlink_speeds().items():
            out.append(f"\t Link {link}: {f'{speed:.3f} GB/s' if speed else '<inactive>'}\n")
    return "".join(out)


def nvlink(argv: list[str]) -> int:
    """`nvlink -s|--status [-i G]`, the only nvlink query the lab answers."""
    rest = [a for a in argv if a not in ("-s", "--status")]
    if len(rest) == len(argv):
        sys.stdout.write("Invalid combination of input arguments. Please run 'nvidia-smi nvlink -h' for help.\n\n")
        return RC_INVALID
    try:
        opts = _parse(rest)
    except Usage as err:
        sys.stdout.write(f"{err}\n\n")
        return RC_INVALID
    hw = load()
    if any(hw.has("gpu-hang", gpu=g) for g in opts["gpus"]):
        time.sleep(HANG_SECONDS)
    sys.stdout.write(_missing_lines(hw, opts["gpus"]) + render_nvlink_status(hw, time.time(), opts["gpus"]))
    return RC_FELL_OFF_BUS if _missing(hw, opts["gpus"]) else 0


def main(argv: list[str]) -> int:
    if argv[:2] == ["topo", "-m"] or argv[:2] == ["topo", "--matrix"]:
        sys.stdout.write(render_topo(load()))
        return 0
    if argv[:1] == ["nvlink"]:
        return nvlink(argv[1:])
    try:
        opts = _parse(argv)
    except Usage as err:
        sys.stdout.write(f"{err}\n\n")
        return RC_INVALID
    hw, now, gpus = load(), time.time(), opts["gpus"]
    # A GPU that stopped answering hangs NVML, and nvidia-smi with it, until something kills it.
    if any(hw.has("gpu-hang", gpu=g) for g in gpus):
        time.sleep(HANG_SECONDS)
    sys.stdout.write(_missing_lines(hw, gpus))
    if opts["mode"] == "table":
        text = render_table(hw, now, gpus)
    elif opts["mode"] == "q":
        text = render_q(hw, now, gpus)
    elif opts["mode"] == "list":
        text = "".join(f"GPU {g}: {hwm.GPU_MODEL} (UUID: {gpu_uuid(hw.node, g)})\n" for g in gpus
                       if hw.gpu_present(g))
    elif opts["mode"] == "pm":
        targets = {g: bus_id(g) for g in gpus if hw.gpu_present(g)}
        changed = any(hw.persistence_mode(g) != opts["enable"] for g in targets)
        text = persistence_mode(hw, targets, opts["enable"])
        if changed:
            hw.save(state_path())
    elif opts["mode"] == "reset":
        text, rc = gpu_reset(hw, {g: bus_id(g) for g in gpus if hw.gpu_present(g)}, now, monitoring_holders(hw))
        hw.save(state_path())
        sys.stdout.write(text)
        return RC_FELL_OFF_BUS if _missing(hw, gpus) else rc
    elif opts["mode"] == "--query-gpu":
        text = query_gpu(hw, now, opts["fields"], opts["format"], gpus)
    else:
        text = query_apps(hw, now, opts["fields"], opts["format"])
    sys.stdout.write(text)
    return RC_FELL_OFF_BUS if _missing(hw, gpus) else 0


if __name__ == "__main__":
    sys.exit(main_guard(main))
