"""Where an emulated tool finds the machine's hardware: the state file and the sysfs tree. Both are
settings (environment variables) so the tools also run outside a machine, e.g. in unit tests."""

import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from opsctl.errors import OpsctlError
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.ib_sysfs import write_tree

DEFAULT_STATE = "/var/lib/opsctl-hw/hardware.json"
DEFAULT_SYSFS_ROOT = "/var/lib/opsctl-hw/sys"


def state_path() -> Path:
    return Path(os.environ.get("OPSCTL_HW_STATE", DEFAULT_STATE))


def sysfs_root() -> Path:
    return Path(os.environ.get("OPSCTL_HW_SYSFS_ROOT", DEFAULT_SYSFS_ROOT))


def load() -> NodeHardware:
    return NodeHardware.load(state_path(), socket.gethostname())


def fresh_sysfs(hw: NodeHardware | None = None) -> Path:
    """The sysfs root, rewritten from the state first: a tool never shows a port older than the state
    (the dcgm-exporter service refreshes it too, but may not be running)."""
    root = sysfs_root()
    write_tree(root, hw or load())
    return root


def main_guard(func: Callable[[list[str]], int]) -> int:
    """Run a tool's main; a bad state file or argument is one stderr line and rc 255, as the real
    tools' "Other error"."""
    try:
        return func(sys.argv[1:])
    except OpsctlError as err:
        sys.stderr.write(f"{err}\n")
        return 255
    except BrokenPipeError:
        return 0
