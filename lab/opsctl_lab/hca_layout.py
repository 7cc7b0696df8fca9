"""Where an emulated node's HCAs and GPUs sit in its PCIe tree, and what the HCAs are named.

Two namings of the same board. HGX (the default): rails mlx5_0..mlx5_7 and a BlueField-3 Ethernet
storage port mlx5_bond_0, as in gpud's sys-class-infiniband-h100 fixture. DGX (the `dgx-naming` fault):
rails mlx5_0,3,4,5,6,9,10,11 and two dual-port ConnectX-7 in-band/storage cards whose ports take the
names between, port 1 InfiniBand and port 2 Ethernet (NVIDIA DGX H100 User Guide, Table 6, and the
DGX BasePOD deployment guide; tests/fixtures/ib/README.md).

Each rail shares a PCIe switch with its GPU (rail i with GPU i); the storage ports sit on root ports of
their own, as the `opsctl ib check` discovery expects of real nodes. A path lists the bdfs from the
root port to the device, under its host bridge, as /sys/devices does.
"""

from dataclasses import dataclass

# The GPUs' buses, as the lab's nvidia-smi and dcgm-exporter report them (PCI_BUS_IDS there).
GPU_BUSES = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
RAIL_BUSES = ["1a", "3c", "4d", "5e", "9c", "bc", "cc", "dc"]
HGX_RAILS = [f"mlx5_{i}" for i in range(8)]
HGX_STORAGE = ["mlx5_bond_0"]
DGX_RAILS = ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]
DGX_STORAGE = ["mlx5_1", "mlx5_2", "mlx5_7", "mlx5_8"]
GPU_CLASS = "0x030200"  # 3D controller
NVIDIA_VENDOR = "0x10de"
MELLANOX_VENDOR = "0x15b3"
PCI_CLASSES = {"InfiniBand": "0x020700", "Ethernet": "0x020000"}


@dataclass(frozen=True)
class PciDevice:
    path: tuple[str, ...]  # "pci0000:15", then the bdfs: root port first, the device last
    pci_class: str
    vendor: str

    @property
    def bdf(self) -> str:
        return self.path[-1]


@dataclass(frozen=True)
class HcaLayout:
    rails: list[str]
    storage: list[str]
    hcas: dict[str, PciDevice]  # every HCA, rails first
    gpus: list[PciDevice]

    def link_layer(self, hca: str) -> str:
        return "Ethernet" if self.hcas[hca].pci_class == PCI_CLASSES["Ethernet"] else "InfiniBand"


def _pair(index: int) -> tuple[PciDevice, PciDevice]:
    """Rail i and GPU i behind one switch: host bridge and root port on bus B, the switch's upstream
    port on B+1, its downstream ports on B+2 (B: 3 below the lower of the pair's buses, free here)."""
    gpu_bus, rail_bus = int(GPU_BUSES[index], 16), int(RAIL_BUSES[index], 16)
    base = min(gpu_bus, rail_bus) - 3
    above = (f"pci0000:{base:02x}", f"0000:{base:02x}:01.0", f"0000:{base + 1:02x}:00.0")
    hca = PciDevice((*above, f"0000:{base + 2:02x}:00.0", f"0000:{rail_bus:02x}:00.0"),
                    PCI_CLASSES["InfiniBand"], MELLANOX_VENDOR)
    gpu = PciDevice((*above, f"0000:{base + 2:02x}:01.0", f"0000:{gpu_bus:02x}:00.0"), GPU_CLASS, NVIDIA_VENDOR)
    return hca, gpu


def _storage_port(bus: int, function: int, layer: str) -> PciDevice:
    host = bus - 1
    return PciDevice((f"pci0000:{host:02x}", f"0000:{host:02x}:01.0", f"0000:{bus:02x}:00.{function}"),
                     PCI_CLASSES[layer], MELLANOX_VENDOR)


def layout(dgx: bool = False) -> HcaLayout:
    rails = DGX_RAILS if dgx else HGX_RAILS
    pairs = [_pair(i) for i in range(len(rails))]
    hcas = {rail: hca for rail, (hca, _gpu) in zip(rails, pairs, strict=True)}
    if dgx:
        hcas.update({"mlx5_1": _storage_port(0xe1, 0, "InfiniBand"), "mlx5_2": _storage_port(0xe1, 1, "Ethernet"),
                     "mlx5_7": _storage_port(0xe5, 0, "InfiniBand"), "mlx5_8": _storage_port(0xe5, 1, "Ethernet")})
    else:
        hcas["mlx5_bond_0"] = _storage_port(0xe1, 0, "Ethernet")
    return HcaLayout(rails=list(rails), storage=DGX_STORAGE if dgx else HGX_STORAGE, hcas=hcas,
                     gpus=[gpu for _hca, gpu in pairs])
