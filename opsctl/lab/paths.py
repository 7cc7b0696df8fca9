"""Where the simulated cluster keeps its files. Everything lives under one directory:
$OPSCTL_LAB_DIR, by default /var/lib/opsctl-lab."""

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_LAB_DIR = "/var/lib/opsctl-lab"
PROMETHEUS_LISTEN = "127.0.0.1:19090"
SLURMCTLD_PORT = 16817
SLURMD_FIRST_PORT = 17001
DCGM_PORT = 9400
NODE_EXPORTER_PORT = 9100


def lab_dir() -> Path:
    return Path(os.environ.get("OPSCTL_LAB_DIR") or DEFAULT_LAB_DIR)


def node_name(index: int) -> str:
    """0 -> gpu001."""
    return f"gpu{index + 1:03d}"


def node_address(index: int) -> str:
    """Each emulated node answers on its own loopback address (all of 127/8 is loopback)."""
    return f"127.10.{index // 250}.{index % 250 + 1}"


@dataclass(frozen=True)
class LabPaths:
    root: Path

    @property
    def state_file(self) -> Path:
        return self.root / "lab.json"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def logs(self) -> Path:
        return self.root / "log"

    @property
    def munge(self) -> Path:
        return self.root / "munge"

    @property
    def slurm(self) -> Path:
        return self.root / "slurm"

    @property
    def slurm_conf(self) -> Path:
        return self.slurm / "slurm.conf"

    @property
    def dev(self) -> Path:
        return self.root / "dev"

    @property
    def prometheus(self) -> Path:
        return self.root / "prometheus"

    @property
    def opsctl_config(self) -> Path:
        return self.root / "opsctl.yaml"

    @property
    def opsctl_state(self) -> Path:
        return self.root / "state"

    def node_dir(self, node: str) -> Path:
        return self.root / "nodes" / node

    def hardware(self, node: str) -> Path:
        return self.node_dir(node) / "hardware.json"

    def sysfs(self, node: str) -> Path:
        return self.node_dir(node) / "sys"
