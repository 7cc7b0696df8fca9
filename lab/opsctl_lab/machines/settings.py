"""Where the lab machines tier keeps its state, and the addresses it uses.

Every path can be moved with an environment variable, so tests and CI can use their own:
  OPSCTL_LAB_DIR          state root; this tier uses <root>/machines[-<net>] (default /var/lib/opsctl-lab)
  OPSCTL_LAB_IMAGE_DIR    the cached Debian 12 images, one per recipe   (default /var/cache/opsctl/lab-images)
  OPSCTL_LAB_APT_CACHE    apt-cacher-ng's cache         (default /var/cache/opsctl/apt-cacher-ng[-<net>])
  OPSCTL_LAB_INVENTORY    hosts.yml, SSH key, known_hosts (default <project>/inventory/lab; net > 0: <state>/inventory)
  OPSCTL_LAB_NET          0-254: which lab network (default 0: 10.213.0.0/24, bridge opsctl-lab0). A
                          second lab on the same host (e.g. the integration tests) takes another one.

and one of the emulated hardware, written into each GPU machine's hardware state when `up` starts it:
  OPSCTL_LAB_FABRIC_TRAINING_S  seconds Fabric Manager takes to train the NVSwitch fabric, after it starts at
                          boot or after a GPU reset (default 60, about an HGX board's; tests set less)
"""

import os
from dataclasses import dataclass, field
from pathlib import Path

import opsctl

# Paths inside every GPU machine (opsctl_lab.installed_tools); the provisioning roles point here.
from opsctl_lab.installed_tools import HW_CODE as HW_CODE
from opsctl_lab.installed_tools import HW_KERNEL_LOG as HW_KERNEL_LOG
from opsctl_lab.installed_tools import HW_ROOT as HW_ROOT
from opsctl_lab.installed_tools import HW_STATE as HW_STATE
from opsctl_lab.installed_tools import HW_SYSFS_ROOT as HW_SYSFS_ROOT

PREFIX_LEN = 24
# Not apt-cacher-ng's default 3142: installing the Debian package starts a system instance on
# 0.0.0.0:3142 on hosts with systemd, which would answer in place of the lab's own.
APT_PORT = 3149
# The vendors' repositories the lab builds (opsctl_lab.vendor_repos), served beside it.
VENDOR_PORT = 3150
FIRST_HOST = 10  # head is .10, gpuN is .10+N, storage is .9
SUITE = "bookworm"
# The mirror apt-cacher-ng fetches from: the one this host's own apt uses.
DEFAULT_MIRROR = "http://deb.debian.org/debian"
MAX_GPU_NODES = 32

# The account provisioning logs in as (inventory ansible_user), with sudo, as on a real site; made in
# the image with this uid. The lab's own commands (inject, clear) still use root.
PROVISIONING_USER = "opsadmin"
PROVISIONING_UID = 1100
# Its home is on the machine's own disk, as it must be on a real site: /home is an NFS mount on the
# cluster's nodes, and a mount over the home would hide its authorized_keys (the nfs_client preflight
# refuses such an inventory).
PROVISIONING_HOME = f"/var/lib/{PROVISIONING_USER}"

# The NFS server of the lab: it exports /home and /shared from a disk of its own (disks.py).
STORAGE_MACHINE = "stor1"

# One machine whose GPUs' device minor numbers differ from their nvidia-smi index, as the NVIDIA
# driver allows: the roles must key gres.conf and the epilog by minor number (docs/lab-machines.md).
REVERSED_MINORS_MACHINE = "gpu2"

DCGM_PORT = 9400

# How long a GPU machine's fabric trains (NodeHardware.fabric_training_s): about a real HGX board's minute, so that
# whatever waits for it after a boot or a reset meets the wait it will meet on a cluster.
FABRIC_TRAINING_S = 60.0


def _project_inventory() -> Path:
    root = Path(opsctl.__file__).resolve().parents[1]
    if (root / "pyproject.toml").exists():
        return root / "inventory" / "lab"
    return Path.cwd() / "inventory" / "lab"


def _env_path(name: str, default: str) -> Path:
    return Path(os.environ.get(name) or default)


def _net_index() -> int:
    text = os.environ.get("OPSCTL_LAB_NET", "0")
    if not text.isdigit() or not 0 <= int(text) <= 254:
        from opsctl_lab.errors import LabError

        raise LabError(f"OPSCTL_LAB_NET must be 0-254, not {text!r}")
    return int(text)


def _fabric_training_s() -> float:
    text = os.environ.get("OPSCTL_LAB_FABRIC_TRAINING_S") or str(FABRIC_TRAINING_S)
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        from opsctl_lab.errors import LabError

        raise LabError(f"OPSCTL_LAB_FABRIC_TRAINING_S must be a number of seconds, 0 or more, not {text!r}")
    return seconds


@dataclass(frozen=True)
class Settings:
    # state_dir, apt_cache_dir and inventory_dir: None (the default) is a default that depends on `net` (and
    # inventory_dir's on state_dir), set in __post_init__; every Settings has all three.
    net: int = field(default_factory=_net_index)
    state_dir: Path = None  # type: ignore[assignment]  # set in __post_init__
    image_dir: Path = field(default_factory=lambda: _env_path("OPSCTL_LAB_IMAGE_DIR", "/var/cache/opsctl/lab-images"))
    apt_cache_dir: Path = None  # type: ignore[assignment]  # set in __post_init__
    inventory_dir: Path = None  # type: ignore[assignment]  # set in __post_init__
    mirror: str = DEFAULT_MIRROR
    fabric_training_s: float = field(default_factory=_fabric_training_s)

    def __post_init__(self) -> None:
        # Another lab network gets its own state (and inventory) by default: two labs must never share one.
        if self.state_dir is None:
            name = "machines" if self.net == 0 else f"machines-{self.net}"
            object.__setattr__(self, "state_dir", _env_path("OPSCTL_LAB_DIR", "/var/lib/opsctl-lab") / name)
        if self.inventory_dir is None:
            default = _project_inventory() if self.net == 0 else self.state_dir / "inventory"
            object.__setattr__(self, "inventory_dir", _env_path("OPSCTL_LAB_INVENTORY", str(default)))
        if self.apt_cache_dir is None:
            # Each lab network has its own apt-cacher-ng, so each needs its own cache directory.
            suffix = "" if self.net == 0 else f"-{self.net}"
            default = f"/var/cache/opsctl/apt-cacher-ng{suffix}"
            object.__setattr__(self, "apt_cache_dir", _env_path("OPSCTL_LAB_APT_CACHE", default))

    # ---- network ---------------------------------------------------------------------------------
    @property
    def subnet(self) -> str:
        return f"10.213.{self.net}.0/{PREFIX_LEN}"

    @property
    def bridge(self) -> str:
        return f"opsctl-lab{self.net}"

    @property
    def bridge_addr(self) -> str:
        return f"10.213.{self.net}.1"

    @property
    def apt_proxy(self) -> str:
        return f"http://{self.bridge_addr}:{APT_PORT}"

    @property
    def vendor_url(self) -> str:
        return f"http://{self.bridge_addr}:{VENDOR_PORT}"

    def addr(self, name: str) -> str:
        if name == STORAGE_MACHINE:
            return f"10.213.{self.net}.{FIRST_HOST - 1}"
        index = 0 if name == "head" else int(name.removeprefix("gpu"))
        return f"10.213.{self.net}.{FIRST_HOST + index}"

    @property
    def prefix(self) -> str:
        """Prefix of the host-side names of this lab (namespaces, nspawn machine names)."""
        return "opsctl-" if self.net == 0 else f"opsctl{self.net}-"

    def netns(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def veth(self, name: str) -> str:
        return (f"olab-{name}" if self.net == 0 else f"olab{self.net}-{name}")[:15]  # IFNAMSIZ

    def nspawn_name(self, name: str) -> str:
        # The first lab keeps the plain names; another lab's machines need names of their own on the host.
        return name if self.net == 0 else f"{self.prefix}{name}"

    # ---- files -----------------------------------------------------------------------------------
    def machine_dir(self, name: str) -> Path:
        return self.state_dir / name

    @property
    def fabric_dir(self) -> Path:
        """The InfiniBand fabric's directory (HW_FABRIC in the GPU machines and the head)."""
        return self.state_dir / "fabric"

    # In a dot directory: ansible never reads those as inventory sources (a key or known_hosts next to
    # hosts.yml would be tried as one, with a warning each).
    @property
    def ssh_key(self) -> Path:
        return self.inventory_dir / ".ssh" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.inventory_dir / ".ssh" / "known_hosts"


def machine_names(gpu_nodes: int) -> list[str]:
    return ["head", STORAGE_MACHINE] + [f"gpu{i}" for i in range(1, gpu_nodes + 1)]


def is_gpu_machine(name: str) -> bool:
    return name not in ("head", STORAGE_MACHINE)
