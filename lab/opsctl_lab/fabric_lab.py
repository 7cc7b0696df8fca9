"""The simulated cluster's InfiniBand fabric (opsctl_lab.fabric): its state file, the head's `ibnetdiscover`,
and the fabric's own faults.

- `<lab>/fabric.json`: the nodes on the fabric (every lab node, in order), where each node's hardware state is
  (`<lab>/nodes/{node}/hardware.json`, so a node's `recable-*` faults move its cables) and the fabric's own
  faults (`uplink-down:<leaf>`). Rewritten by `opsctl lab up`, keeping its faults across a restart.
- `<lab>/bin/ibnetdiscover`: the emulated tool as the head (this host, `head` on the fabric, an HCA on every
  rail at spine 1's port 64) runs it; the lab's opsctl config points `ib.ibnetdiscover` at it.
- `opsctl lab inject fabric uplink-down:rail3-su1-leaf` and `opsctl lab clear fabric` (or `clear all`).
"""

import sys
from pathlib import Path

from opsctl_lab import paths as lp
from opsctl_lab.fabric import HEAD, FabricState
from opsctl_lab.prometheus_lab import python_env

FABRIC = "fabric"  # what `opsctl lab inject` and `clear` take in place of a node for the fabric's own faults


def write_fabric(paths: lp.LabPaths, nodes: int) -> FabricState:
    """The fabric of `nodes` lab nodes; the faults it had stay."""
    faults = FabricState.load(paths.fabric).faults if paths.fabric.exists() else []
    state = FabricState(nodes=[lp.node_name(i) for i in range(nodes)], state_pattern=str(paths.hardware("{node}")),
                        head=HEAD, faults=faults)
    state.save(paths.fabric)
    return state


def write_ibnetdiscover(paths: lp.LabPaths) -> Path:
    """<lab>/bin/ibnetdiscover: the emulated tool, run as the head."""
    tool = paths.root / "bin" / "ibnetdiscover"
    tool.parent.mkdir(parents=True, exist_ok=True)
    env = " ".join(f"{k}={v}" for k, v in {**python_env(), "OPSCTL_HW_FABRIC": paths.fabric,
                                           "OPSCTL_HW_NODE": HEAD}.items())
    tool.write_text(f"#!/bin/sh\n{env} exec {sys.executable} -m opsctl_lab.hwtools.ibnetdiscover \"$@\"\n")
    tool.chmod(0o755)
    return tool


def inject(paths: lp.LabPaths, fault: str) -> str:
    state = FabricState.load(paths.fabric)
    label = state.inject(fault)
    state.save(paths.fabric)
    return label


def clear(paths: lp.LabPaths) -> list[str]:
    """Every fault of the fabric ends; returns them."""
    if not paths.fabric.exists():
        return []
    state = FabricState.load(paths.fabric)
    cleared, state.faults = state.faults, []
    state.save(paths.fabric)
    return cleared


def faults(paths: lp.LabPaths) -> list[str]:
    return FabricState.load(paths.fabric).faults if paths.fabric.exists() else []
