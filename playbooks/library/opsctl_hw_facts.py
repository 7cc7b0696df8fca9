#!/usr/bin/python
"""Ansible module: the hardware facts that Slurm node definitions are built from."""

import glob
import os
import re

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: opsctl_hw_facts
short_description: Discover GPUs, HCAs, NVMe drives, CPU topology and memory of a node
description:
  - Reads C(nvidia-smi), the InfiniBand sysfs tree, C(/sys/class/nvme), C(/sys/devices/system/cpu)
    and C(/proc/meminfo), and returns them as the C(opsctl_hw) fact.
  - A missing C(nvidia-smi), or C(nvidia-smi) exiting 9 (driver not loaded), means "no GPUs", not a
    failure, so the same play runs on head and storage nodes.
  - Read-only; supports check mode.
options:
  nvidia_smi:
    description: Path of nvidia-smi.
    type: str
    default: nvidia-smi
  sysfs_root:
    description: Root of the sysfs tree that holds C(class/infiniband) (the lab emulates it elsewhere).
    type: str
    default: /sys
  ib_devices:
    description: Regular expression of the HCA names that count as compute rails.
    type: str
    default: "^mlx5_[0-9]+$"
"""

EXAMPLES = r"""
- name: Discover hardware
  opsctl_hw_facts:
    sysfs_root: /var/lib/opsctl-hw/sys
"""

RETURN = r"""
ansible_facts:
  description: C(opsctl_hw) with gpu_model, gpu_count, gpus (index, name, pci_bus_id, minor, cores),
    hcas, nvme, sockets, cores_per_socket, threads_per_core, cpus, memory_mb.
  returned: always
  type: dict
"""

# rc 9 is NVML_ERROR_DRIVER_NOT_LOADED surfaced by nvidia-smi ("NVIDIA-SMI has failed because it
# couldn't communicate with the NVIDIA driver"): the node has no usable GPU.
NVSMI_NO_DRIVER = 9


def read(path, default=""):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return default


def cpu_topology(root="/sys/devices/system/cpu"):
    """Sockets, cores per socket and threads per core as the kernel reports them (hwloc, which
    slurmd uses, reads the same files), and each CPU's Slurm core index: Slurm numbers cores, not
    CPUs, in gres.conf Cores= (gres.conf(5), "Cores"), socket by socket."""
    cpu_core = {}
    for topo in sorted(glob.glob(os.path.join(root, "cpu[0-9]*", "topology"))):
        cpu = int(re.search(r"cpu(\d+)", topo).group(1))
        package = int(read(os.path.join(topo, "physical_package_id"), "0") or 0)
        core = int(read(os.path.join(topo, "core_id"), str(cpu)) or cpu)
        cpu_core[cpu] = (package, core)
    if not cpu_core:
        cpu_core = {cpu: (0, cpu) for cpu in range(os.cpu_count() or 1)}
    ordered = sorted(set(cpu_core.values()))
    index = {core: i for i, core in enumerate(ordered)}
    sockets = {package for package, _core in ordered}
    return {
        "cpus": len(cpu_core),
        "sockets": len(sockets),
        "cores_per_socket": max(1, len(ordered) // len(sockets)),
        "threads_per_core": max(1, len(cpu_core) // len(ordered)),
        "_cpu_to_core": {cpu: index[core] for cpu, core in cpu_core.items()},
    }


def core_list(cores):
    """[0, 1, 2, 5] -> '0-2,5'."""
    out = []
    for number in sorted(set(cores)):
        if out and out[-1][1] == number - 1:
            out[-1][1] = number
        else:
            out.append([number, number])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def memory_mb():
    match = re.search(r"^MemTotal:\s+(\d+) kB", read("/proc/meminfo"), re.M)
    return int(match.group(1)) // 1024 if match else 0


def parse_cpu_list(text):
    """'0-3,8' -> [0, 1, 2, 3, 8]; anything else -> []."""
    cores = []
    for part in text.replace(" ", "").split(","):
        if re.fullmatch(r"\d+-\d+", part):
            low, high = part.split("-")
            cores.extend(range(int(low), int(high) + 1))
        elif part.isdigit():
            cores.append(int(part))
        else:
            return []
    return cores


def parse_topo_affinity(text):
    """GPU index -> CPU list from `nvidia-smi topo -m`:

            GPU0    GPU1  ...  NIC0 ... CPU Affinity    NUMA Affinity   GPU NUMA ID
    GPU0     X      NV18  ...  PIX  ... 0-55,112-167    0               N/A
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or "CPU Affinity" not in lines[0]:
        return {}
    header = re.split(r"\t+|\s{2,}", lines[0].strip())
    column = header.index("CPU Affinity") + 1  # data rows start with the row label
    out = {}
    for line in lines[1:]:
        fields = re.split(r"\t+|\s{2,}", line.strip())
        match = re.fullmatch(r"GPU(\d+)", fields[0])
        if match and len(fields) > column:
            out[int(match.group(1))] = fields[column]
    return out


def parse_q_minors(text):
    """PCI bus id -> device minor number (the N of /dev/nvidiaN) from `nvidia-smi -q`, which prints
    one block per GPU:

    GPU 00000000:18:00.0
        Product Name                          : NVIDIA H200
        ...
        Minor Number                          : 0
    """
    minors = {}
    bus = None
    for line in text.splitlines():
        header = re.match(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$", line)
        if header:
            bus = header.group(1).upper()
            continue
        minor = re.match(r"^\s+Minor Number\s*:\s*(\d+)\s*$", line)
        if minor and bus:
            minors[bus] = int(minor.group(1))
    return minors


def _bus_key(bus_id):
    """nvidia-smi writes the domain with 8 digits in one place and 4 in another: compare without it."""
    return bus_id.upper().split(":", 1)[-1]


def gpus(module, nvidia_smi):
    path = module.get_bin_path(nvidia_smi) if "/" not in nvidia_smi else nvidia_smi
    if not path or not os.access(path, os.X_OK):
        return []
    rc, out, _err = module.run_command([path, "--query-gpu=index,name,pci.bus_id", "--format=csv,noheader"])
    if rc == NVSMI_NO_DRIVER:
        return []
    if rc != 0:
        module.fail_json(msg=f"{path} --query-gpu failed with rc {rc}", stdout=out)
    found = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            found.append({"index": int(parts[0]), "name": parts[1], "pci_bus_id": parts[2], "minor": None,
                          "cores": ""})
    # The minor number is not promised to equal the index; without it gres.conf would name the wrong
    # device. A GPU whose minor number nvidia-smi -q does not show fails the module.
    rc, out, _err = module.run_command([path, "-q"])
    minors = {_bus_key(bus): minor for bus, minor in parse_q_minors(out).items()} if rc == 0 else {}
    for gpu in found:
        if _bus_key(gpu["pci_bus_id"]) not in minors:
            module.fail_json(msg=f"{path} -q shows no minor number for GPU {gpu['index']} ({gpu['pci_bus_id']})")
        gpu["minor"] = minors[_bus_key(gpu["pci_bus_id"])]
    rc, out, _err = module.run_command([path, "topo", "-m"])
    if rc == 0:
        affinity = parse_topo_affinity(out)
        for gpu in found:
            gpu["cores"] = affinity.get(gpu["index"], "")
    return found


def hcas(sysfs_root, pattern):
    found = []
    for dev in sorted(glob.glob(os.path.join(sysfs_root, "class", "infiniband", "*"))):
        name = os.path.basename(dev)
        port = os.path.join(dev, "ports", "1")
        found.append({
            "name": name,
            "compute": bool(re.search(pattern, name)),
            "fw_ver": read(os.path.join(dev, "fw_ver")),
            "rate": read(os.path.join(port, "rate")),
            "link_layer": read(os.path.join(port, "link_layer")),
        })
    return found


def nvme():
    found = []
    for dev in sorted(glob.glob("/sys/class/nvme/nvme*")):
        found.append({"name": os.path.basename(dev), "model": read(os.path.join(dev, "model"))})
    return found


def main():
    module = AnsibleModule(
        argument_spec={
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "sysfs_root": {"type": "str", "default": "/sys"},
            "ib_devices": {"type": "str", "default": "^mlx5_[0-9]+$"},
        },
        supports_check_mode=True,
    )
    gpu_list = gpus(module, module.params["nvidia_smi"])
    topo = cpu_topology()
    cpu_to_core = topo.pop("_cpu_to_core")
    # Cores= is only "known" if every CPU that nvidia-smi lists exists here; a partial map would make
    # slurmd reject gres.conf, so any gap drops the affinity for the whole node.
    for gpu in gpu_list:
        cpus = parse_cpu_list(gpu["cores"]) if gpu["cores"] else []
        known = cpus and all(cpu in cpu_to_core for cpu in cpus)
        gpu["cores"] = core_list(cpu_to_core[cpu] for cpu in cpus) if known else ""
    if any(not gpu["cores"] for gpu in gpu_list):
        for gpu in gpu_list:
            gpu["cores"] = ""
    models = sorted({gpu["name"] for gpu in gpu_list})
    facts = {
        "gpu_count": len(gpu_list),
        "gpu_model": models[0] if len(models) == 1 else ("mixed" if models else ""),
        "gpus": gpu_list,
        "hcas": hcas(module.params["sysfs_root"], module.params["ib_devices"]),
        "nvme": nvme(),
        "memory_mb": memory_mb(),
        **topo,
    }
    module.exit_json(changed=False, ansible_facts={"opsctl_hw": facts})


if __name__ == "__main__":
    main()
