"""Where the lab machines tier keeps its state, and the addresses it uses.

Every path can be moved with an environment variable, so tests and CI can use their own:
  OPSCTL_LAB_DIR          state root; this tier uses <root>/machines   (default /var/lib/opsctl-lab)
  OPSCTL_LAB_IMAGE_DIR    the cached Debian 12 image                     (default /var/cache/opsctl/lab-image)
  OPSCTL_LAB_APT_CACHE    apt-cacher-ng's cache                          (default /var/cache/opsctl/apt-cacher-ng)
  OPSCTL_LAB_INVENTORY    where hosts.yml, the SSH key and known_hosts go (default <project>/inventory/lab)
"""

import os
from dataclasses import dataclass, field
from pathlib import Path

import opsctl

# Addresses inside the lab bridge only; a guard route keeps them on this host (see net.py).
SUBNET = "10.213.0.0/24"
BRIDGE = "opsctl-lab0"
BRIDGE_ADDR = "10.213.0.1"
PREFIX_LEN = 24
APT_PORT = 3142
FIRST_HOST = 10  # head is .10, gpuN is .10+N
SUITE = "bookworm"
# The mirror apt-cacher-ng fetches from: the one this host's own apt uses.
DEFAULT_MIRROR = "http://deb.debian.org/debian"
MAX_GPU_NODES = 32

# Paths inside every GPU machine; the provisioning roles point here (docs/lab-machines.md).
HW_ROOT = "/var/lib/opsctl-hw"
HW_STATE = f"{HW_ROOT}/hardware.json"
HW_SYSFS_ROOT = f"{HW_ROOT}/sys"
HW_CODE = "/opt/opsctl-hw"
DCGM_PORT = 9400


def _project_inventory() -> Path:
    root = Path(opsctl.__file__).resolve().parents[1]
    if (root / "pyproject.toml").exists():
        return root / "inventory" / "lab"
    return Path.cwd() / "inventory" / "lab"


@dataclass(frozen=True)
class Settings:
    state_dir: Path = field(default_factory=lambda: Path(os.environ.get("OPSCTL_LAB_DIR", "/var/lib/opsctl-lab"))
                            / "machines")
    image_dir: Path = field(default_factory=lambda: Path(os.environ.get("OPSCTL_LAB_IMAGE_DIR",
                                                                        "/var/cache/opsctl/lab-image")))
    apt_cache_dir: Path = field(default_factory=lambda: Path(os.environ.get("OPSCTL_LAB_APT_CACHE",
                                                                            "/var/cache/opsctl/apt-cacher-ng")))
    inventory_dir: Path = field(default_factory=lambda: Path(os.environ["OPSCTL_LAB_INVENTORY"])
                                if os.environ.get("OPSCTL_LAB_INVENTORY") else _project_inventory())
    mirror: str = DEFAULT_MIRROR

    @property
    def apt_proxy(self) -> str:
        return f"http://{BRIDGE_ADDR}:{APT_PORT}"

    def machine_dir(self, name: str) -> Path:
        return self.state_dir / name

    @property
    def ssh_key(self) -> Path:
        return self.inventory_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.inventory_dir / "known_hosts"


def machine_names(gpu_nodes: int) -> list[str]:
    return ["head"] + [f"gpu{i}" for i in range(1, gpu_nodes + 1)]


def machine_addr(name: str) -> str:
    index = 0 if name == "head" else int(name.removeprefix("gpu"))
    return f"10.213.0.{FIRST_HOST + index}"


def netns_name(name: str) -> str:
    return f"opsctl-{name}"


def veth_name(name: str) -> str:
    return f"olab-{name}"[:15]  # IFNAMSIZ
