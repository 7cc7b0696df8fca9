"""Evidence for people: a rule's raw value (kept as a number in the JSON `value` field) in words.

An evidence template names a value and, after a colon, how to show it: `${value:ib_state}`,
`${threshold:gbps}`. Plain `${value}` is the number itself.

  ib_state      InfiniBand port state id -> its name (sysfs ports/N/state, IBTA PortState): 1 -> DOWN
  gbps          bytes per second -> Gb/s: 25000000000 -> 200
  clock_events  DCGM clock event reason mask -> flag names and the mask: 72 -> HW_SLOWDOWN,HW_THERMAL (0x48)
  clock_slowdown  the slowdown bits of that mask -> their short names: 136 -> hw-slowdown,power-brake
  fabric_status DCGM's Fabric Manager status of a GPU (dcgmFabricManagerStatus_t) -> its name: 2 -> In Progress
  compute_mode  DCGM's compute mode of a GPU (DCGM_CONFIG_COMPUTEMODE_*) -> nvidia-smi's word: 2 -> Exclusive_Process
  celsius       degrees -> with the unit: 92 -> 92°C
  percent       a fraction -> a percentage: 0.5 -> 50%
  age           seconds -> minutes and seconds: 312 -> 5m12s, 300 -> 5m, 42.5 -> 42s
"""

import math
import re
from collections.abc import Callable

# The kernel's words in /sys/class/infiniband/<hca>/ports/<n>/state ("4: ACTIVE").
IB_PORT_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
# dcgm_fields.h DCGM_CLOCKS_EVENT_REASON_* (the same bits as NVML's nvmlClocksEventReason*).
CLOCK_EVENTS = {0x1: "GPU_IDLE", 0x2: "CLOCKS_SETTING", 0x4: "SW_POWER_CAP", 0x8: "HW_SLOWDOWN",
                0x10: "SYNC_BOOST", 0x20: "SW_THERMAL", 0x40: "HW_THERMAL", 0x80: "HW_POWER_BRAKE",
                0x100: "DISPLAY_CLOCKS"}
# The bits of that mask that slow a busy GPU down, by short name (nvidia-smi -q's "Clocks Event Reasons":
# HW Slowdown, SW Thermal Slowdown, HW Thermal Slowdown, HW Power Brake Slowdown).
CLOCK_SLOWDOWNS = {0x8: "hw-slowdown", 0x20: "sw-thermal", 0x40: "hw-thermal", 0x80: "power-brake"}
# dcgm_structs.h dcgmFabricManagerStatus_t, in the words of nvidia-smi -q's Fabric section where it has them.
FABRIC_STATUSES = {0: "Not Supported", 1: "Not Started", 2: "In Progress", 3: "Success", 4: "Failure",
                   5: "Unrecognized", 6: "NVML too old"}

# dcgm_structs.h DCGM_CONFIG_COMPUTEMODE_*, in the words of nvidia-smi -q's "Compute Mode"; the same order as
# opsctl.config.schema.COMPUTE_MODES, the names hardware.compute_mode takes.
COMPUTE_MODES = {0: "Default", 1: "Prohibited", 2: "Exclusive_Process"}


def plain(value: float) -> str:
    """4.0 -> '4', 0.25 -> '0.25', 1234.5678 -> '1.23e+03': three significant digits say enough."""
    if not math.isfinite(value):
        return str(value)
    return str(int(value)) if value == int(value) and abs(value) < 1e15 else f"{value:.3g}"


def ib_state(value: float) -> str:
    return IB_PORT_STATES.get(int(value), f"state {plain(value)}") if math.isfinite(value) else str(value)


def gbps(value: float) -> str:
    return plain(value * 8 / 1e9) if math.isfinite(value) else str(value)


def _flags(mask: int, names: dict[int, str]) -> list[str]:
    """The names of the bits of `mask` that `names` names, lowest bit first."""
    return [name for bit, name in names.items() if mask & bit]


def clock_events(value: float) -> str:
    if not math.isfinite(value) or value < 0:
        return str(value)
    mask = int(value)
    names = _flags(mask, CLOCK_EVENTS)
    unknown = mask & ~sum(CLOCK_EVENTS)
    if unknown:
        names.append(f"0x{unknown:x}")
    return f"{','.join(names) or 'none'} (0x{mask:x})"


def clock_slowdown(value: float) -> str:
    if not math.isfinite(value) or value < 0:
        return str(value)
    return ",".join(_flags(int(value), CLOCK_SLOWDOWNS)) or "none"


def fabric_status(value: float) -> str:
    return FABRIC_STATUSES.get(int(value), f"status {plain(value)}") if math.isfinite(value) else str(value)


def compute_mode(value: float) -> str:
    return COMPUTE_MODES.get(int(value), plain(value)) if math.isfinite(value) else str(value)


def celsius(value: float) -> str:
    return f"{plain(value)}°C"


def percent(value: float) -> str:
    return f"{plain(value * 100)}%" if math.isfinite(value) else str(value)


def age(value: float) -> str:
    if not math.isfinite(value) or value < 0:
        return str(value)
    seconds = int(value)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if n]
    return "".join(parts) or "0s"


FORMATS: dict[str, Callable[[float], str]] = {"ib_state": ib_state, "gbps": gbps, "clock_events": clock_events,
                                              "clock_slowdown": clock_slowdown, "fabric_status": fabric_status,
                                              "compute_mode": compute_mode, "celsius": celsius, "percent": percent,
                                              "age": age}
PLACEHOLDER = re.compile(r"\$\{(value|threshold)(?::([a-z_]+))?\}")


def unknown_formats(template: str) -> list[str]:
    return [m.group(2) for m in PLACEHOLDER.finditer(template) if m.group(2) and m.group(2) not in FORMATS]


def fill(template: str, value: float, threshold: float) -> str:
    """The template with ${value}, ${threshold} and their formatted forms replaced; anything else kept."""
    numbers = {"value": value, "threshold": threshold}

    def one(match: re.Match[str]) -> str:
        number = numbers[match.group(1)]
        return FORMATS[match.group(2)](number) if match.group(2) in FORMATS else plain(number)

    return PLACEHOLDER.sub(one, template)
