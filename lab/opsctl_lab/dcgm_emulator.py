"""A dcgm-exporter emulator: serves /metrics for emulated H200 nodes in dcgm-exporter's exact text
format and label set, rendered from each node's NodeHardware state file.

Format facts (tests/fixtures/dcgm-exporter/dcgm-exporter-sample.txt and dcgm-exporter's
render_metrics.go): one `# HELP` and `# TYPE` per field, then one series per GPU with labels
gpu, UUID, pci_bus_id, device, modelName, Hostname, then the label fields of the role's counters file
(DCGM_FI_DEV_INFOROM_IMAGE_VER, DCGM_FI_DEV_VBIOS_VERSION, DCGM_FI_DRIVER_VERSION), and err_code/err_msg on
DCGM_FI_DEV_XID_ERRORS. A field DCGM cannot read is skipped, so a GPU that fell off the bus simply
has no series. DCGM_EXP_XID_ERRORS_COUNT carries window_size_in_ms and xid, one series per XID seen
in the window, and a series of value 0 without `xid` for a GPU that saw none (dcgm-exporter's
expCollector.getMetrics, "Create metric with Zero value if group is empty": NVIDIA/dcgm-exporter
@ 1f7abdb7dc0f86f3cf7853995b0d262fd3e80bc6, internal/pkg/collector/expcollector.go). A stock
dcgm-exporter, whose default counters file does not enable that field, exports none of it
(`render(hw, xid_count=False)`).

One process serves any number of nodes, each on its own address (the lab gives each node a
loopback address; a lab machine runs one instance as its dcgm-exporter service):

    python3 -m opsctl_lab.dcgm_emulator --listen 10.213.0.11:9400 --node gpu1 \
        --state /var/lib/opsctl-hw/hardware.json --sysfs-root /var/lib/opsctl-hw/sys
    python3 -m opsctl_lab.dcgm_emulator --nodes-file nodes.json   # [{node, listen, state, sysfs_root,
                                                                  #   storage_root, mount_base}]

It also keeps each node's sysfs InfiniBand tree current (rising counters), and stops answering for
a node while that node has the `exporter-down` fault. A node whose training rank (opsctl_lab.hwtools.train)
publishes its load next to the state file shows that load: busy GPUs, their power and activity, and the
all-reduce traffic of its steps in the NVLink and InfiniBand counters (opsctl_lab.training_load).
"""

import argparse
import json
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opsctl_lab import hardware as hwm
from opsctl_lab import training_load as tl
from opsctl_lab.hardware import NodeHardware, stable_int
from opsctl_lab.ib_sysfs import GPU_COUNTERS, write_tree
from opsctl_lab.storage_view import write_storage
from opsctl_lab.training_load import RankLoad, read_load

# A fixed origin for time-driven counters, so that a restarted emulator does not reset them.
COUNTER_EPOCH = 1_750_000_000.0
# HGX H200 baseboard PCI bus ids of GPUs 0-7.
PCI_BUS_IDS = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]


@dataclass(frozen=True)
class Field:
    name: str
    kind: str  # gauge | counter
    help: str
    value: Callable[["GpuView"], float | None]  # None: DCGM could not read it
    fmt: str = "int"  # int | float


@dataclass
class GpuView:
    """What DCGM would read from one GPU at `now`; `load`: the node's training rank's, if one published it."""

    hw: NodeHardware
    gpu: int
    now: float
    load: RankLoad | None = None
    fb_used: int = field(init=False)
    train: tl.GpuLoad = field(init=False)

    def __post_init__(self) -> None:
        self.fb_used = 81920 + self.jitter("fbleft", 2048) if self.has("gpu-leftover-memory") else self.jitter("fb", 2)
        self.train = tl.gpu_load(self.load, self.gpu, self.now, slow=self.has("slow-gpu"))

    def has(self, fault: str) -> bool:
        return self.hw.has(fault, gpu=self.gpu)

    def jitter(self, what: str, spread: int) -> int:
        return stable_int(self.hw.node, self.gpu, what, modulo=spread) if spread else 0

    def counter(self, name: str, base: float = 0.0) -> float:
        return self.hw.counter(self.gpu, name, base, self.now)

    def power(self) -> float:
        if self.train.busy:
            return tl.power(self.hw.node, self.gpu, self.train)
        return 72.0 + self.jitter("power", 40) + (0.0 if not self.has("thermal") else 210.0)

    def temp(self) -> int:
        return 94 + self.jitter("hot", 4) if self.has("thermal") else 29 + self.jitter("temp", 10)

    def clock_events(self) -> int:
        """DCGM's clock event reasons (hwm.CLOCK_EVENT_*): GPU_IDLE on an idle GPU; a slowdown's bits; a
        slow GPU's power cap."""
        if self.has("thermal"):
            return hwm.CLOCK_EVENT_HW_SLOWDOWN | hwm.CLOCK_EVENT_SW_THERMAL | hwm.CLOCK_EVENT_HW_THERMAL
        mask = hwm.CLOCK_EVENT_SW_POWER_CAP if self.has("slow-gpu") else 0
        for fault in self.hw.faults_on("clock-slowdown", gpu=self.gpu):
            mask |= hwm.CLOCK_SLOWDOWNS.get(fault.variant or "", 0)
        return mask if self.busy() else mask | hwm.CLOCK_EVENT_GPU_IDLE

    def busy(self) -> bool:
        """Whether a kernel runs on the GPU: a training rank's (computing, or spinning in NCCL while it waits),
        or a clock slowdown's (it shows under load)."""
        return self.train.busy or self.has("clock-slowdown")

    def nvlink_speeds(self) -> dict[int, float]:
        """link -> GB/s as `nvidia-smi nvlink -s` prints it, 0 for an inactive link."""
        slowed = {int(str(f.variant)): speed for name, speed in (("nvlink-down", 0.0),
                                                               ("nvlink-degraded", hwm.NVLINK_DEGRADED_SPEED_GBPS))
                  for f in self.hw.faults_on(name, self.gpu)}
        return {link: slowed.get(link, hwm.NVLINK_SPEED_GBPS) for link in range(hwm.NVLINKS_PER_GPU)}

    def vbios(self) -> str:
        return hwm.VBIOS_DRIFT_VERSION if self.has("vbios-drift") else hwm.VBIOS_VERSION

    def compute_mode(self) -> int:
        """DCGM's compute mode of the GPU (hwm.COMPUTE_MODES)."""
        return hwm.COMPUTE_MODE_EXCLUSIVE_PROCESS if self.has("compute-exclusive") else 0

    def pcie_width(self) -> int:
        return hwm.PCIE_GPU_DOWNTRAINED_WIDTH if self.has("pcie-downtrain") else hwm.PCIE_GPU_WIDTH

    def sm_clock(self) -> int:
        if self.has("thermal") or self.has("clock-slowdown"):
            return hwm.SLOWED_SM_CLOCK_MHZ
        return hwm.SLOW_GPU_SM_CLOCK_MHZ if self.has("slow-gpu") else hwm.SM_CLOCK_MHZ

    def fabric_status(self) -> int:
        """DCGM's Fabric Manager status of the GPU (hwm.FABRIC_*)."""
        return self.hw.fabric_status(self.gpu, self.now)

    def uptime(self) -> float:
        return max(0.0, self.now - COUNTER_EPOCH)


FIELDS = [
    Field("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", lambda g: g.sm_clock()),
    Field("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", lambda g: 3201),
    Field("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", lambda g: g.temp() + 3),
    Field("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda g: g.temp()),
    Field("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).",
          lambda g: min(hwm.POWER_LIMIT_W, g.power() + (g.jitter("mw", 1000) / 1000.0)), "float"),
    Field("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ).",
          lambda g: int(g.uptime() * (72.0 + g.jitter("power", 40)) * 1000)),
    Field("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.",
          lambda g: int(g.counter("pcie_replay"))),
    Field("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda g: 100 if g.busy() else 0),
    Field("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", lambda g: 0),
    Field("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", lambda g: 0),
    Field("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", lambda g: 0),
    Field("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.",
          lambda g: g.hw.last_xid.get(str(g.gpu), 0)),
    Field("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).",
          lambda g: hwm.FB_TOTAL_MIB - hwm.FB_RESERVED_MIB - g.fb_used),
    Field("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", lambda g: g.fb_used),
    Field("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).",
          lambda g: hwm.FB_RESERVED_MIB),
    Field("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors.",
          lambda g: int(g.counter("ecc_sbe_vol"))),
    Field("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.",
          lambda g: int(g.counter("ecc_dbe_vol"))),
    Field("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors",
          lambda g: int(g.counter("uncorrectable_remapped_rows"))),
    Field("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors",
          lambda g: int(g.counter("correctable_remapped_rows"))),
    Field("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed",
          lambda g: int(g.has("row-remap-failure"))),
    Field("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending",
          lambda g: int(g.has("row-remap-pending"))),
    Field("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "Current clock event reasons (bitmask).",
          lambda g: g.clock_events()),
    Field("DCGM_FI_DEV_PCIE_LINK_GEN", "gauge", "PCIe current link generation.", lambda g: hwm.PCIE_GPU_GEN),
    Field("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "gauge", "PCIe max link generation.", lambda g: hwm.PCIE_GPU_GEN),
    Field("DCGM_FI_DEV_PCIE_LINK_WIDTH", "gauge", "PCIe current link width.", lambda g: g.pcie_width()),
    Field("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "gauge", "PCIe max link width.", lambda g: hwm.PCIE_GPU_WIDTH),
    Field("DCGM_FI_DEV_FABRIC_MANAGER_STATUS", "gauge", "Fabric Manager status of the GPU (dcgmFabricManagerStatus_t).",
          lambda g: g.fabric_status()),
    Field("DCGM_FI_DEV_ECC_CURRENT", "gauge", "Current ECC mode of the GPU (1 enabled, 0 disabled).",
          lambda g: int(not g.has("ecc-off"))),
    Field("DCGM_FI_DEV_MIG_MODE", "gauge", "MIG mode of the GPU (1 enabled, 0 disabled).",
          lambda g: int(g.has("mig-on"))),
    Field("DCGM_FI_DEV_COMPUTE_MODE", "gauge",
          "Compute mode of the GPU (0 Default, 1 Prohibited, 2 Exclusive_Process).", lambda g: g.compute_mode()),
    Field("DCGM_FI_DEV_PERSISTENCE_MODE", "gauge", "Persistence mode of the GPU (1 enabled, 0 disabled).",
          lambda g: int(g.hw.persistence_mode(g.gpu))),
    Field("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter",
          "Total number of NVLink flow-control CRC errors.", lambda g: int(g.counter("nvlink_crc_flit"))),
    Field("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink data CRC errors.",
          lambda g: int(g.counter("nvlink_crc_data"))),
    Field("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink retries.",
          lambda g: int(g.counter("nvlink_replay"))),
    Field("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink recovery errors.",
          lambda g: int(g.counter("nvlink_recovery"))),
    Field("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter",
          "Total number of NVLink bandwidth counters for all lanes.",
          lambda g: tl.nvlink_bytes(g.hw.node, g.gpu, g.load)),
    Field("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status", lambda g: 0),
    Field("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.",
          lambda g: tl.gr_engine_active(g.hw.node, g.gpu, g.train), "float"),
    Field("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.",
          lambda g: tl.tensor_active(g.hw.node, g.gpu, g.train), "float"),
    Field("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
          "Ratio of cycles the device memory interface is active sending or receiving data.",
          lambda g: tl.dram_active(g.hw.node, g.gpu, g.train), "float"),
    Field("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus - including "
          "both protocol headers and data payloads - in bytes per second.", lambda g: 1024 + g.jitter("tx", 4096)),
    Field("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus - including "
          "both protocol headers and data payloads - in bytes per second.", lambda g: 1024 + g.jitter("rx", 4096)),
]
XID_COUNT_HELP = "Count of XID Errors within user-specified time window (see xid-count-window-size param)."


def gpu_uuid(node: str, gpu: int) -> str:
    h = f"{stable_int(node, gpu, 'uuid', modulo=1 << 128):032x}"
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def base_labels(node: str, gpu: int, minor: int | None = None, driver: str = hwm.DRIVER_VERSION,
                vbios: str = hwm.VBIOS_VERSION) -> str:
    # The fields of type `label` (the role's counters file) follow Hostname in the order of their names: Go's
    # template ranges over the metric's Labels map sorted by key (render_metrics.go).
    pairs = [
        ("gpu", str(gpu)),
        ("UUID", gpu_uuid(node, gpu)),
        ("pci_bus_id", f"00000000:{PCI_BUS_IDS[gpu]}:00.0"),
        ("device", f"nvidia{gpu if minor is None else minor}"),  # the device file, /dev/nvidia<minor>
        ("modelName", hwm.GPU_MODEL),
        ("Hostname", node),
        ("DCGM_FI_DEV_INFOROM_IMAGE_VER", hwm.INFOROM_IMAGE_VERSION),
        ("DCGM_FI_DEV_VBIOS_VERSION", vbios),
        ("DCGM_FI_DRIVER_VERSION", driver),
    ]
    return ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)


def render(hw: NodeHardware, now: float | None = None, xid_count: bool = True, load: RankLoad | None = None) -> str:
    """The /metrics body of one node; xid_count=False is an exporter without DCGM_EXP_XID_ERRORS_COUNT;
    `load`: the node's training rank's."""
    now = time.time() if now is None else now
    views = [GpuView(hw, gpu, now, load) for gpu in range(hwm.GPUS_PER_NODE) if hw.gpu_present(gpu)]
    labels = {view.gpu: base_labels(hw.node, view.gpu, hw.minor(view.gpu), hw.loaded_driver(), view.vbios())
              for view in views}
    out = []
    for fld in FIELDS:
        out.append(f"# HELP {fld.name} {fld.help}\n# TYPE {fld.name} {fld.kind}\n")
        for view in views:
            value = fld.value(view)
            if value is None:
                continue
            extra = ""
            if fld.name == "DCGM_FI_DEV_XID_ERRORS":
                msg = hwm.XID_MESSAGES.get(int(value), "Unknown Error") if value else "No Error"
                extra = f',err_code="{int(value)}",err_msg="{_escape(msg)}"'
            text = f"{value:.6f}" if fld.fmt == "float" else str(int(value))
            out.append(f"{fld.name}{{{labels[view.gpu]}{extra}}} {text}\n")
    if not xid_count:
        return "".join(out)
    out.append(f"# HELP DCGM_EXP_XID_ERRORS_COUNT {XID_COUNT_HELP}\n# TYPE DCGM_EXP_XID_ERRORS_COUNT gauge\n")
    for view in views:
        window = f'{labels[view.gpu]},window_size_in_ms="{hwm.XID_WINDOW_MS}"'
        seen = sorted(hw.xid_window(view.gpu, now).items())
        for xid, count in seen:
            out.append(f'DCGM_EXP_XID_ERRORS_COUNT{{{window},xid="{xid}"}} {count}\n')
        if not seen:
            out.append(f"DCGM_EXP_XID_ERRORS_COUNT{{{window}}} 0\n")
    return "".join(out)


@dataclass
class EmulatedNode:
    node: str
    listen: str
    state: Path
    sysfs_root: Path | None = None
    storage_root: Path | None = None  # where the node's emulated mountinfo and mountstats go (storage_view)
    mount_base: Path | None = None  # under which its mount points are
    hw: NodeHardware | None = None
    version: tuple[int, ...] = ()  # (inode, mtime_ns) of the state file last read; os.replace makes a new inode
    sysfs_version: tuple[int, ...] | None = None  # the version the sysfs tree was last written for
    load: RankLoad | None = None  # the node's training rank's, as last read
    sysfs_steps: int = 0  # the training steps the sysfs tree's traffic counters were last written for
    server: ThreadingHTTPServer | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def refresh(self) -> NodeHardware:
        """Re-read the state file if it changed. Scrape threads and the tick loop both call this, so
        whether the sysfs tree is current is judged by its own version, not by who read the file."""
        with self.lock:
            version: tuple[int, ...]
            try:
                stat = self.state.stat()
                version = (stat.st_ino, stat.st_mtime_ns)
            except FileNotFoundError:
                version = ()
            if version != self.version or self.hw is None:
                self.hw = NodeHardware.load(self.state, self.node)
                self.version = version
            # A rank rewrites its small file a few times a second: read at every look, it is never behind.
            self.load = read_load(self.state)
            return self.hw


class QuietHTTPServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer that starts fast; port 0 picks a free port (see server_port)."""

    daemon_threads = True
    allow_reuse_address = True

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls getfqdn(), which takes seconds per listener here.
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(self.server_address)
        address = self.socket.getsockname()  # (host, port)
        self.server_address = address
        self.server_name, self.server_port = address[:2]


def send_body(handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _handler_for(node: EmulatedNode) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            hw = node.refresh()
            send_body(self, 200, render(hw, load=node.load).encode(), METRICS_CONTENT_TYPE)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server API)
            pass

    return Handler


def _start(node: EmulatedNode) -> None:
    host, _, port = node.listen.rpartition(":")
    node.server = QuietHTTPServer((host, int(port)), _handler_for(node))
    threading.Thread(target=node.server.serve_forever, name=f"dcgm-{node.node}", daemon=True).start()


def _stop(node: EmulatedNode) -> None:
    if node.server is not None:
        node.server.shutdown()
        node.server.server_close()
        node.server = None


def tick(node: EmulatedNode, now: float) -> None:
    """Follow the node's state: stop or start its listener (exporter-down, or its services stopped around a GPU
    reset), keep its sysfs tree current."""
    hw = node.refresh()
    down = hw.node_fault("exporter-down") or not hw.exporter_serves()
    if down and node.server is not None:
        _stop(node)
    elif not down and node.server is None:
        try:
            _start(node)
        except OSError as err:  # the address may still be held; try again next tick
            sys.stderr.write(f"dcgm-exporter emulator: {node.node}: {err}\n")
    # A counter that sysfs shows rises: an HCA's, or a GPU's AER count (ib_sysfs.GPU_COUNTERS).
    rising = any((f.hca is not None and hwm.FAULTS[f.fault].rates) or GPU_COUNTERS & hwm.FAULTS[f.fault].rates.keys()
                 for f in hw.active)
    steps = tl.total_steps(node.load)
    if node.sysfs_root is not None and (node.sysfs_version != node.version or rising or steps != node.sysfs_steps):
        write_tree(node.sysfs_root, hw, now, node.load)
        if node.storage_root is not None and node.mount_base is not None:
            write_storage(node.storage_root, node.mount_base, hw)
        node.sysfs_version, node.sysfs_steps = node.version, steps


def run(nodes: list[EmulatedNode], tick_s: float = 0.5) -> None:
    """Serve until SIGTERM/SIGINT, following every node's state each tick."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    while not stopping.is_set():
        now = time.time()
        for node in nodes:
            tick(node, now)
        stopping.wait(tick_s)
    for node in nodes:
        _stop(node)


def _optional_path(spec: dict[str, str], key: str) -> Path | None:
    return Path(spec[key]) if spec.get(key) else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dcgm-exporter (opsctl lab emulator)", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes-file", type=Path,
                        help="JSON list of {node, listen, state, sysfs_root, storage_root, mount_base}")
    parser.add_argument("--listen", help="ADDR:PORT for a single node")
    parser.add_argument("--node", help="node name (the Hostname label)")
    parser.add_argument("--state", type=Path, help="the node's hardware state file")
    parser.add_argument("--sysfs-root", type=Path, help="keep this sysfs InfiniBand tree current")
    args = parser.parse_args(argv)
    if args.nodes_file:
        spec = json.loads(args.nodes_file.read_text())
        nodes = [EmulatedNode(n["node"], n["listen"], Path(n["state"]), sysfs_root=_optional_path(n, "sysfs_root"),
                              storage_root=_optional_path(n, "storage_root"),
                              mount_base=_optional_path(n, "mount_base")) for n in spec]
    elif args.listen and args.node and args.state:
        nodes = [EmulatedNode(args.node, args.listen, args.state, args.sysfs_root)]
    else:
        parser.error("give --nodes-file, or --listen, --node and --state")
    run(nodes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
