"""Where the simulated cluster keeps its files and which addresses it takes.

Everything lives under one directory: $OPSCTL_LAB_DIR, by default /var/lib/opsctl-lab.
$OPSCTL_LAB_SLOT (0-9, default 0) moves every address and port, so that several labs (each with its
own directory) run side by side on one host:

    slot  Prometheus        slurmctld  slurmd ports   node N's exporters   opsctl --watch metrics
    0     127.0.0.1:19090   16817      17001-18000    127.10.0.N:9400, :9100  127.0.0.1:19190
    k     127.0.0.1:19090+k 16817+k    17001+1000k..  127.(10+k).0.N          127.0.0.1:19190+k

and the accounting (opsctl_lab.accounting) on 127.0.0.1: slurmdbd on 16830+k, MariaDB on 16840+k; the BMC
(opsctl_lab.bmc) on 127.0.0.1: its Redfish service on 16850+k, the listener for its power changes on 16860+k.
"""

import os
from dataclasses import dataclass
from pathlib import Path

from opsctl_lab.errors import LabError

DEFAULT_LAB_DIR = "/var/lib/opsctl-lab"
PROMETHEUS_PORT = 19090
SLURMCTLD_PORT = 16817
SLURMD_FIRST_PORT = 17001
SLURMDBD_PORT = 16830
MARIADB_PORT = 16840
BMC_PORT = 16850
BMC_POWER_PORT = 16860
DCGM_PORT = 9400
NODE_EXPORTER_PORT = 9100
OPSCTL_METRICS_PORT = 19190
MAX_NODES = 1000


def lab_dir() -> Path:
    return Path(os.environ.get("OPSCTL_LAB_DIR") or DEFAULT_LAB_DIR)


def slot() -> int:
    text = os.environ.get("OPSCTL_LAB_SLOT") or "0"
    if not text.isdigit() or int(text) > 9:
        raise LabError(f"OPSCTL_LAB_SLOT must be 0-9, not {text!r}")
    return int(text)


def prometheus_listen() -> str:
    return f"127.0.0.1:{PROMETHEUS_PORT + slot()}"


def opsctl_metrics_listen() -> str:
    """Where the lab's `opsctl health --watch` serves its metrics (config metrics.listen_address)."""
    return f"127.0.0.1:{OPSCTL_METRICS_PORT + slot()}"


def slurmctld_port() -> int:
    return SLURMCTLD_PORT + slot()


def slurmdbd_port() -> int:
    return SLURMDBD_PORT + slot()


def mariadb_port() -> int:
    return MARIADB_PORT + slot()


def bmc_port() -> int:
    """The BMC's Redfish service (sushy-emulator)."""
    return BMC_PORT + slot()


def bmc_power_port() -> int:
    """The listener that the BMC tells each power change of a node (opsctl_lab.bmc)."""
    return BMC_POWER_PORT + slot()


def slurmd_first_port() -> int:
    return SLURMD_FIRST_PORT + MAX_NODES * slot()


def node_name(index: int) -> str:
    """0 -> gpu001."""
    return f"gpu{index + 1:03d}"


def node_address(index: int) -> str:
    """Each emulated node answers on its own loopback address (all of 127/8 is loopback)."""
    return f"127.{10 + slot()}.{index // 250}.{index % 250 + 1}"


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
    def accounting(self) -> Path:
        """MariaDB's data directory and socket, the database password, slurmdbd's PID file."""
        return self.root / "accounting"

    @property
    def bmc(self) -> Path:
        """The BMC's config, its state, its user's password (`password`, mode 0600) and htpasswd file."""
        return self.root / "bmc"

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

    @property
    def why_spool(self) -> Path:
        """EpilogSlurmctld's spool: an empty file per job that did not end cleanly (docs/why.md)."""
        return self.root / "why-spool"

    @property
    def fabric(self) -> Path:
        """The InfiniBand fabric's state: its nodes and its own faults (opsctl_lab.fabric_lab)."""
        return self.root / "fabric.json"

    def node_dir(self, node: str) -> Path:
        return self.root / "nodes" / node

    def hardware(self, node: str) -> Path:
        return self.node_dir(node) / "hardware.json"

    def sysfs(self, node: str) -> Path:
        return self.node_dir(node) / "sys"

    def storage(self, node: str) -> Path:
        """The node's emulated storage (opsctl_lab.storage_view): mountinfo, mountstats, mnt/<mount points>,
        bin/lctl and bin/lfs."""
        return self.node_dir(node) / "storage"

    def kernel_log(self, node: str) -> Path:
        """The node's kernel log: /dev/kmsg records, one a line (opsctl_lab.hardware.write_kernel_log), for
        `opsctl node check`'s gpu.kernel_log_path."""
        return self.node_dir(node) / "kmsg"

    def textfile(self, node: str) -> Path:
        """The directory of the node's node_exporter textfile collector (`opsctl node check --textfile`)."""
        return self.node_dir(node) / "textfile"

    def node_check_config(self, node: str) -> Path:
        """An opsctl config for `opsctl node check` of this node: its sysfs tree, mounts and Lustre tools."""
        return self.node_dir(node) / "node-check.yaml"
