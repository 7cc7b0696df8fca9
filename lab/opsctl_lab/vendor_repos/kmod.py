"""Kernel modules as the lab's packages "build" them: a DKMS build writes a stand-in file in the
module's real place (/lib/modules/<kernel>/updates/dkms/<name>.ko) that says what the real build would
have produced; `load` refuses what the real kernel would refuse.

What decides it (the real sources):
- nvidia-peermem gets the peer-memory symbols only when MLNX_OFED's kernel tree is there at build time:
  its Kbuild looks in /usr/src/ofa_kernel/<arch>/<kernel>, /usr/src/ofa_kernel/<kernel> and
  /usr/src/ofa_kernel/default, and builds against that Module.symvers (NVIDIA/open-gpu-kernel-modules,
  kernel-open/nvidia-peermem/nvidia-peermem.Kbuild). Built without them, its init returns -EINVAL
  (nvidia-peermem.c, `nv_mem_client_init` when NV_MLNX_IB_PEER_MEM_SYMBOLS_PRESENT is not defined):
  `modprobe: ERROR: could not insert 'nvidia_peermem': Invalid argument`.
- A module built against one MLNX_OFED's Module.symvers does not load against another's ib_core: the
  kernel says "disagrees about version of symbol", modprobe "Invalid argument". So a DOCA upgrade needs
  the driver's DKMS modules rebuilt.
- Lustre's ko2iblnd is built against one ib_core: the kernel's own (Whamcloud's prebuilt modules, or a
  DKMS build on a node where configure finds no `ofed_info`) or MLNX_OFED's tree (lnet/autoconf/
  lustre-lnet.m4).

So a stand-in built against an ib_core says which (`ib_core=`: an MLNX_OFED build, or `in-kernel`) and
loads only against that one; nvidia-peermem also says it needs the peer-memory symbol (`needs=`), and one
built without MLNX_OFED (no `ib_core`) does not load at all.
"""

import os
from pathlib import Path

MAGIC = "opsctl-lab-kernel-module"
OFA_ROOT = "usr/src/ofa_kernel"
# The symbol nvidia-peermem needs from MLNX_OFED's ib_core (nvidia-peermem.c: ib_register_peer_memory_client).
PEER_SYMBOL = "ib_register_peer_memory_client"
# A module's `ib_core=` when it was built against the kernel's own RDMA stack, not MLNX_OFED's.
IN_KERNEL = "in-kernel"
# An ib_core symbol ko2iblnd calls (o2iblnd.c: ib_alloc_pd, a macro of __ib_alloc_pd).
IB_CORE_SYMBOL = "__ib_alloc_pd"


class LoadError(Exception):
    pass


def kernel() -> str:
    return os.uname().release


def module_path(root: Path, name: str, release: str) -> Path:
    return root / "lib/modules" / release / "updates/dkms" / f"{name.replace('_', '-')}.ko"


# Where nvidia-peermem's Kbuild looks for MLNX_OFED's kernel tree, in its order (under OFA_ROOT).
OFA_CANDIDATES = ("x86_64/{release}", "{release}", "default")


def ofa_tree(root: Path, release: str) -> Path | None:
    """The first MLNX_OFED kernel tree nvidia-peermem's Kbuild would find; None without one."""
    for candidate in OFA_CANDIDATES:
        tree = root / OFA_ROOT / candidate.format(release=release)
        if (tree / "Module.symvers").is_file():
            return tree
    return None


def read(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines()
    if not lines or lines[0] != MAGIC:
        raise LoadError(f"{path}: not a module")
    return dict(line.split("=", 1) for line in lines[1:] if "=" in line)


def text(fields: dict[str, str]) -> str:
    """A stand-in module's file: the marker line, then a `name=value` line per field."""
    return "\n".join([MAGIC, *(f"{k}={v}" for k, v in fields.items())]) + "\n"


def write(path: Path, fields: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text(fields))


def symvers_id(tree: Path) -> str:
    """Which MLNX_OFED build the tree is (the ofed-dkms behaviour writes its version there)."""
    version = tree / "opsctl-lab-version"
    return version.read_text().strip() if version.exists() else ""


def find(root: Path, name: str, release: str) -> Path | None:
    """Where modprobe finds the module: DKMS's updates/dkms first, then anywhere under updates/ (Lustre's
    packages install to updates/kernel/{fs,net}/lustre)."""
    path = module_path(root, name, release)
    if path.exists():
        return path
    return next(iter(sorted((root / "lib/modules" / release / "updates").rglob(path.name))), None)


def running_ib_core(root: Path, release: str) -> str:
    """The ib_core of the kernel now: MLNX_OFED's (its version) when its tree is installed, else the kernel's."""
    tree = ofa_tree(root, release)
    return symvers_id(tree) if tree is not None else IN_KERNEL


def load(root: Path, name: str, release: str, loaded_dir: Path) -> dict[str, str]:
    """modprobe NAME: the stand-in must exist and, if built against an ib_core, against the one running now.
    A loaded module is a directory in `loaded_dir` (the emulated /sys/module). Returns the module's fields."""
    path = find(root, name, release)
    if path is None:
        raise LoadError(f"modprobe: FATAL: Module {name} not found in directory /lib/modules/{release}")
    fields = read(path)
    built_against, needs = fields.get("ib_core", ""), fields.get("needs", "")
    if needs == PEER_SYMBOL and not built_against:  # nvidia-peermem.c: nv_mem_client_init returns -EINVAL
        raise LoadError(f"modprobe: ERROR: could not insert '{name}': Invalid argument")
    if built_against and built_against != running_ib_core(root, release):
        raise LoadError(f"modprobe: ERROR: could not insert '{name}': Invalid argument "
                        f"({name}: disagrees about version of symbol {needs or IB_CORE_SYMBOL})")
    (loaded_dir / name).mkdir(parents=True, exist_ok=True)
    (loaded_dir / name / "version").write_text(fields.get("version", "") + "\n")
    return fields
