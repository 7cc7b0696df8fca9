"""The machines' InfiniBand fabric (opsctl_lab.fabric): one host directory, `<state>/fabric`, bound into every
GPU machine and the head at HW_FABRIC, as a fabric is the one medium every HCA is cabled to.

- fabric.json (written here, on the host): the GPU machines on the fabric in order (all in scalable unit 1:
  the tier has at most 32), the head, and the fabric's own faults (`opsctl lab machines inject fabric
  uplink-down:rail3-su1-leaf`).
- nodes/<machine>.json: each GPU machine's hardware state, published by its `opsctl-hw` after every command
  (and here, before it boots), so that `ibnetdiscover` in any machine sees every machine's cabling (a
  `recable-rail:3` injected into gpu2) as the real one sees every port of the subnet.

A machine started before its fabric existed has no such directory: `opsctl lab machines down` and `up` give
it one.
"""

from pathlib import Path

from opsctl_lab.fabric import HEAD, FabricState
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.installed_tools import HW_FABRIC, HW_FABRIC_NODES
from opsctl_lab.machines.settings import Settings, is_gpu_machine

FABRIC = "fabric"  # what `inject` and `clear` take in place of a machine for the fabric's own faults


def state_file(settings: Settings) -> Path:
    return settings.fabric_dir / "fabric.json"


def nspawn_args(settings: Settings, name: str) -> list[str]:
    """The fabric's directory, bound into the GPU machines and the head (they have HCAs)."""
    if name != HEAD and not is_gpu_machine(name):
        return []
    return [f"--bind={settings.fabric_dir}:{HW_FABRIC}"]


def write_fabric(settings: Settings, names: list[str]) -> FabricState:
    """fabric.json for these machines; the fabric's faults stay."""
    path = state_file(settings)
    faults = FabricState.load(path).faults if path.exists() else []
    state = FabricState(nodes=[n for n in names if is_gpu_machine(n)], state_pattern=f"{HW_FABRIC_NODES}/{{node}}.json",
                        head=HEAD, faults=faults)
    state.save(path)
    return state


def publish(fabric_nodes: Path, hw: NodeHardware) -> None:
    """A machine's hardware state where the fabric's other hosts read it."""
    hw.save(fabric_nodes / f"{hw.node}.json")


def inject(settings: Settings, fault: str) -> str:
    state = FabricState.load(state_file(settings))
    label = state.inject(fault)
    state.save(state_file(settings))
    return label


def clear(settings: Settings) -> list[str]:
    path = state_file(settings)
    if not path.exists():
        return []
    state = FabricState.load(path)
    cleared, state.faults = state.faults, []
    state.save(path)
    return cleared


def faults(settings: Settings) -> list[str]:
    path = state_file(settings)
    return FabricState.load(path).faults if path.exists() else []
