"""`nvidia-smi topo -m` and `nvidia-smi -pm` of the emulated H200 node.

Topology of an HGX H200 board: the 8 GPUs all-to-all over NVSwitch (NV18), GPUs 0-3 on NUMA node 0
and 4-7 on node 1, rail-aligned NICs (GPU i and mlx5_i behind one PCIe switch: PIX). The storage
port sits on node 0. Layout (tabs, " X " on the diagonal, the legends) as in a real 8-GPU HGX
capture (tests/fixtures/gpu/nvidia-smi_topo_-m_8xH100_HGX_NV18.txt):

    \tGPU0\tGPU1\t...\tNIC0\t...\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
    GPU0\t X \tNV18\t...\tPIX\t...\t0-55,112-167\t0\t\tN/A

CPU affinity is split over the CPUs this machine really has, so it names CPUs that exist here.
"""

import os

from opsctl_lab.hardware import ALL_HCAS, COMPUTE_HCAS, GPUS_PER_NODE, NodeHardware

LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def cpu_list(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    parts: list[str] = []
    for cpu in sorted(cpus):
        if parts and "-" in parts[-1] and int(parts[-1].split("-")[1]) == cpu - 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{cpu}"
        elif parts and "-" not in parts[-1] and int(parts[-1]) == cpu - 1:
            parts[-1] = f"{parts[-1]}-{cpu}"
        else:
            parts.append(str(cpu))
    return ",".join(parts)


def numa_of_gpu(gpu: int) -> int:
    return 0 if gpu < GPUS_PER_NODE // 2 else 1


def numa_of_nic(nic: str) -> int:
    return numa_of_gpu(COMPUTE_HCAS.index(nic)) if nic in COMPUTE_HCAS else 0


def render_topo(hw: NodeHardware, cpus: list[int] | None = None) -> str:
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else sorted(cpus)
    half = max(1, len(cpus) // 2)
    node_cpus = [cpus[:half], cpus[half:] or cpus[:half]]
    gpus = [g for g in range(GPUS_PER_NODE) if hw.gpu_present(g)]
    nics = ALL_HCAS
    cols = [f"GPU{g}" for g in gpus] + [f"NIC{i}" for i in range(len(nics))]
    lines = ["\t" + "\t".join(cols + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])]

    def link(numa_a: int, numa_b: int, pix: bool) -> str:
        return "PIX" if pix else ("NODE" if numa_a == numa_b else "SYS")

    for g in gpus:
        cells = [" X " if h == g else "NV18" for h in gpus]
        cells += [link(numa_of_gpu(g), numa_of_nic(n), n == f"mlx5_{g}") for n in nics]
        numa = numa_of_gpu(g)
        lines.append(f"GPU{g}\t" + "\t".join(cells) + f"\t{cpu_list(node_cpus[numa])}\t{numa}\t\tN/A")
    for i, n in enumerate(nics):
        cells = [link(numa_of_nic(n), numa_of_gpu(g), n == f"mlx5_{g}") for g in gpus]
        cells += [" X " if m == n else link(numa_of_nic(n), numa_of_nic(m), False) for m in nics]
        lines.append(f"NIC{i}\t" + "\t".join(cells) + "\t\t\t\t")
    nic_legend = "\nNIC Legend:\n\n" + "".join(f"  NIC{i}: {n}\n" for i, n in enumerate(nics))
    return "\n".join(lines) + "\n" + LEGEND + nic_legend


def persistence_mode(hw: NodeHardware, buses: dict[int, str], enable: bool) -> str:
    """`nvidia-smi -pm 1|0` on the GPUs of `buses` (index -> PCI bus id): sets each one's mode in `hw` (the
    caller saves it) and says what it did, in nvidia-smi's words ("Enabled persistence mode for GPU
    00000000:19:00.0.", "Persistence mode is already Enabled for GPU ...", the same with Disabled; one
    line per GPU, then "All done.")."""
    word = "Enabled" if enable else "Disabled"
    lines = []
    for gpu, bus in buses.items():
        if hw.persistence_mode(gpu) == enable:
            lines.append(f"Persistence mode is already {word} for GPU {bus}.")
        else:
            hw.set_persistence_mode(gpu, enable)
            lines.append(f"{word} persistence mode for GPU {bus}.")
    return "\n".join(lines + ["All done."]) + "\n"
