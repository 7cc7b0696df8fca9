"""A sysfs-format InfiniBand tree (`<root>/class/infiniband/...`) for one emulated node.

The real node_exporter reads it with `--path.sysfs=<root>`; ibstat and ibv_devinfo emulators read the
same files. Layout and wording follow a real 8x ConnectX-7 NDR host (gpud's
sys-class-infiniband-h100 fixture, see tests/fixtures/SOURCES.md), e.g.

    mlx5_0/fw_ver: 28.41.1000
    mlx5_0/hca_type: MT4129
    mlx5_0/ports/1/rate: 400 Gb/sec (4X NDR)
    mlx5_0/ports/1/state: 4: ACTIVE
    mlx5_0/ports/1/phys_state: 5: LinkUp
    mlx5_0/ports/1/link_layer: InfiniBand

Counters in sysfs are cumulative since boot; the emulated ones are a stable per-port base plus
whatever faults added (NodeHardware.counter) and, on the compute rails, the all-reduce traffic of the training
steps the node completed (opsctl_lab.training_load), so they only go up.
"""

import os
import shutil
import tempfile
import time
from pathlib import Path

from opsctl_lab.hardware import STORAGE_HCA, NodeHardware, stable_int
from opsctl_lab.hca_layout import PciDevice
from opsctl_lab.training_load import RankLoad, ib_traffic

# Counter files of a real mlx5 port (ports/1/counters/) and a plausible base magnitude each.
PORT_COUNTERS = {
    "VL15_dropped": 0,
    "excessive_buffer_overrun_errors": 0,
    "link_downed": 0,
    "link_error_recovery": 0,
    "local_link_integrity_errors": 0,
    "multicast_rcv_packets": 0,
    "multicast_xmit_packets": 0,
    "port_rcv_constraint_errors": 0,
    "port_rcv_data": 10**14,
    "port_rcv_errors": 0,
    "port_rcv_packets": 10**11,
    "port_rcv_remote_physical_errors": 0,
    "port_rcv_switch_relay_errors": 0,
    "port_xmit_constraint_errors": 0,
    "port_xmit_data": 10**14,
    "port_xmit_discards": 0,
    "port_xmit_packets": 10**11,
    "port_xmit_wait": 10**9,
    "symbol_error": 0,
    "unicast_rcv_packets": 10**11,
    "unicast_xmit_packets": 10**11,
}
HW_COUNTERS = ["duplicate_request", "implied_nak_seq_err", "local_ack_timeout_err", "out_of_buffer",
               "out_of_sequence", "packet_seq_err", "rnr_nak_retry_err", "roce_adp_retrans"]


def _base(node: str, hca: str, counter: str, magnitude: int) -> int:
    return stable_int(node, hca, counter, modulo=magnitude) if magnitude else 0


def node_guid(node: str, hca: str) -> str:
    raw = f"{stable_int(node, hca, 'guid', modulo=1 << 48):012x}"
    return f"a088:c203:00{raw[0:2]}:{raw[2:6]}"  # NVIDIA OUI a0:88:c2 as in real CX-7 GUIDs


def port_lid(hw: NodeHardware, hca: str, port: dict[str, str]) -> int:
    """The port's LID: stable per node and device; 0 where no subnet manager configured it (INIT), and on a
    port of no InfiniBand rail. What ibstat and the lab fabric's ibnetdiscover show too."""
    configured = hca in hw.hca_layout().rails and not port["state"].startswith("2")
    return stable_int(hw.node, hca, "lid", modulo=0xBFFF) + 1 if configured else 0


def device_files(hw: NodeHardware, hca: str, now: float, load: RankLoad | None = None) -> dict[str, str]:
    """Relative path -> content for one device, exactly one line each as in sysfs; `load`: the node's
    training rank's, whose steps moved data over the compute rails."""
    port = hw.hca_port(hca)
    compute = hca in hw.hca_layout().rails
    bluefield = hca == STORAGE_HCA  # the HGX storage port; a DGX's are ConnectX-7 ports
    configured = compute and not port["state"].startswith("2")
    lid = port_lid(hw, hca, port)
    files = {
        "board_id": "MT_0000000884" if bluefield else "MT_0000000838",
        "fw_ver": port["fw_ver"],
        "hca_type": "MT41692" if bluefield else "MT4129",
        "node_guid": node_guid(hw.node, hca),
        "node_type": "1: CA",
        "ports/1/state": port["state"],
        "ports/1/phys_state": port["phys_state"],
        "ports/1/rate": port["rate"],
        "ports/1/link_layer": port["link_layer"],
        # A port the subnet manager has not configured (INIT) has no LID and knows no SM.
        "ports/1/lid": f"0x{lid:x}",
        "ports/1/sm_lid": "0x1" if configured else "0x0",
        "ports/1/cap_mask": "0xa651e848" if compute else "0x00010000",
    }
    traffic = ib_traffic(hw.node, hca, load) if compute else {}
    for counter, magnitude in PORT_COUNTERS.items():
        value = hw.counter(hca, counter, _base(hw.node, hca, counter, magnitude) + traffic.get(counter, 0), now)
        files[f"ports/1/counters/{counter}"] = str(int(value))
    for counter in HW_COUNTERS:
        files[f"ports/1/hw_counters/{counter}"] = str(int(hw.counter(hca, counter, 0, now)))
    return files


# The errors of each of the kernel's aer_dev_* files as drivers/pci/pcie/aer.c (5.x and later) names them, then
# the file's total (Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats).
AER_ERRORS = {
    "aer_dev_correctable": (["RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr",
                             "HeaderOF"], "TOTAL_ERR_COR"),
    **{file: (["Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF", "MalfTLP",
               "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr"], total)
       for file, total in (("aer_dev_fatal", "TOTAL_ERR_FATAL"), ("aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"))},
}


# The GPU counters that sysfs shows (the rest are DCGM's): a fault that raises one keeps the tree rewritten.
GPU_COUNTERS = {"pcie_aer_correctable"}


def aer_files(correctable: int) -> dict[str, str]:
    """A device's aer_dev_* files: `correctable` receiver errors (what a marginal link shows), nothing else."""
    files = {}
    for file, (names, total) in AER_ERRORS.items():
        count = correctable if file == "aer_dev_correctable" else 0
        files[file] = "".join(f"{name} {count if name == 'RxErr' else 0}\n" for name in names) + f"{total} {count}\n"
    return files


def write_tree(root: Path, hw: NodeHardware, now: float | None = None, load: RankLoad | None = None) -> None:
    """Write (or refresh) <root>/class/infiniband for hw, the PCI devices behind it and the GPUs beside
    them (opsctl_lab.hca_layout), and the module list. Only files whose content changed are rewritten;
    HCAs of another naming (before or after `dgx-naming`) are removed. `load`: the node's training rank's
    (the dcgm-exporter emulator, which keeps the tree current, passes it)."""
    now = time.time() if now is None else now
    root = Path(root)
    base = root / "class" / "infiniband"
    layout = hw.hca_layout()
    for index, gpu in enumerate(layout.gpus):
        _write_pci_device(root, gpu, aer_files(int(hw.counter(index, "pcie_aer_correctable", 0.0, now))))
    for hca, device in layout.hcas.items():
        for rel, content in device_files(hw, hca, now, load).items():
            _write_if_changed(base / hca / rel, content)
        # As in sysfs: class/infiniband/<hca>/device leads to the HCA's PCI device, whose path under
        # devices/ names the bridges above it (how `opsctl ib check` tells a rail from a storage port).
        _write_pci_device(root, device, {**hw.hca_pcie(hca), **aer_files(0)})
        _link(base / hca / "device", Path("../../../bus/pci/devices") / device.bdf)
    for stale in sorted(base.iterdir()):
        if stale.name not in layout.hcas:
            shutil.rmtree(stale, ignore_errors=True)
    # A loaded module has a directory under /sys/module; GPUDirect RDMA needs nvidia_peermem.
    _write_if_changed(root / "module" / "nvidia_peermem" / "initstate", "live")


def _write_pci_device(root: Path, device: PciDevice, files: dict[str, str]) -> None:
    """devices/<path> with its class, vendor and `files`, and bus/pci/devices/<bdf> linking there."""
    where = root / "devices" / Path(*device.path)
    for name, content in {"class": device.pci_class, "vendor": device.vendor, **files}.items():
        _write_if_changed(where / name, content)
    entry = root / "bus" / "pci" / "devices" / device.bdf
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)  # a tree written before the lab laid out the bridges
    _link(entry, Path("../../..") / "devices" / Path(*device.path))


def _link(path: Path, target: Path) -> None:
    """A symlink to `target`, replaced atomically when it pointed elsewhere (the naming changed)."""
    if path.is_symlink() and os.readlink(path) == str(target):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.link")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, path)


def _write_if_changed(path: Path, content: str) -> None:
    """One sysfs value: a single line."""
    write_if_changed(path, content + "\n")


def write_if_changed(path: Path, text: str) -> None:
    """An emulated file, atomically, so a concurrent reader never sees a torn one; untouched when the same."""
    try:
        if path.read_text() == text:
            return
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
    # A temporary name of this writer's own: the inject command and the emulator's refresh loop write
    # the same tree at the same moment, and a shared name lets one rename the other's file away.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(tmp, 0o644)  # readable by node_exporter and the tools, as sysfs files are
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
