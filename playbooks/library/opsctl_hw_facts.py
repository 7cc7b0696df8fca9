#!/usr/bin/python
"""Ansible module: the hardware facts that Slurm node definitions are built from."""

import glob
import os
import re

from ansible.module_utils.basic import AnsibleModule

# The PCIe-tree rule of `opsctl ib check`, one copy for both: playbooks/module_utils/opsctl_pcie_tree.py is a
# symlink to opsctl/hw/pcie_tree.py (stdlib only, Python 3.10+). This module runs on the node, where the
# checkout is not, so it cannot load that file by path as the filter plugins do on the control host.
# AnsiballZ bundles each ansible.module_utils.* import it finds into the payload it ships with the module,
# reading the file through the symlink; ansible.cfg names playbooks/module_utils in `module_utils`, so the
# import resolves for any playbook run with that config, not only for the playbooks beside the directory.
from ansible.module_utils.opsctl_pcie_tree import near_gpu, read_pci_tree

DOCUMENTATION = r"""
---
module: opsctl_hw_facts
short_description: Discover GPUs, HCAs, NVMe drives, CPU topology and memory of a node
description:
  - Reads C(nvidia-smi), the InfiniBand sysfs tree, C(/sys/class/nvme), C(/sys/devices/system/cpu)
    and C(/proc/meminfo), and returns them as the C(opsctl_hw) fact.
  - A missing C(nvidia-smi) means "no GPUs", not a failure, so the same play runs on head and storage
    nodes. C(nvidia-smi) exiting 9 (driver not loaded) fails the module on a GPU node (O(gpu_node)),
    and means "no GPUs" only on a host that is not one. C(nvidia-smi) exiting 15 (a GPU fell off the
    bus) gives the GPUs that still answer, and the lost ones in C(lost_gpus).
  - Every C(nvidia-smi) call runs under coreutils C(timeout) (O(command_timeout)); one that does not
    answer in time fails the module.
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
    description:
      - The site's pin of the compute rails, a regular expression of their names (searched, so anchor it).
        When set it alone decides each HCA's C(compute) flag.
      - Empty (the default), an HCA is a compute rail when its ports are InfiniBand and it sits behind
        the same PCIe switch as a GPU, the rule of C(opsctl ib check) (opsctl/ib/rails.py), from the same
        code (opsctl/hw/pcie_tree.py, shipped with this module as module_utils/opsctl_pcie_tree.py).
    type: str
    default: ""
  gpu_node:
    description:
      - Whether the host is a GPU node. On a GPU node, C(nvidia-smi) exiting 9 (driver not loaded) is
        an error; elsewhere it means "no GPUs".
    type: bool
    default: true
  command_timeout:
    description: Seconds each C(nvidia-smi) call may take before it is killed and the module fails.
    type: int
    default: 30
"""

EXAMPLES = r"""
- name: Discover hardware
  opsctl_hw_facts:
    sysfs_root: /var/lib/opsctl-hw/sys
"""

RETURN = r"""
ansible_facts:
  description: C(opsctl_hw) with gpu_model, gpu_count, gpus (index, name, pci_bus_id, minor, cores),
    lost_gpus (the PCI bus ids of GPUs nvidia-smi could not reach), hcas, nvme, sockets, cores_per_socket,
    threads_per_core, cpus, memory_mb.
  returned: always
  type: dict
"""

# rc 9 is NVML_ERROR_DRIVER_NOT_LOADED surfaced by nvidia-smi ("NVIDIA-SMI has failed because it
# couldn't communicate with the NVIDIA driver"): an error on a GPU node, "no GPUs" elsewhere.
NVSMI_NO_DRIVER = 9
# rc 15 is NVML_ERROR_GPU_IS_LOST ("a GPU has fallen off the bus", nvidia-smi(1)): nvidia-smi still
# answers for the other GPUs and names each lost one in a line of its own, which discovery keeps as
# lost_gpus, so that the node's Slurm line has the GPUs it has and the drain names the one it lost.
NVSMI_GPU_LOST = 15
LOST_GPU = re.compile(r"^Unable to determine the device handle for GPU\s*"
                      r"([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])")
# Exit statuses of coreutils `timeout -k 5 N cmd`: 124 when cmd ran past N s and TERM ended it, 137
# (128 + KILL) when it ignored TERM too and KILL ended it 5 s later.
TIMEOUT_RCS = (124, 137)


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
    """GPU index -> CPU Affinity cell (stripped; may be "" or "N/A") from `nvidia-smi topo -m`.

    nvidia-smi separates the cells with one tab each, and an empty cell is an empty string between two
    tabs (\\t shown as |):

    |GPU0|GPU1|NIC0|CPU Affinity|NUMA Affinity|GPU NUMA ID
    GPU0| X |NV18|PIX|0-55,112-167|0||N/A
    GPU0| X |NV18|PIX||0||N/A           <- empty CPU Affinity (e.g. a process confined to a cpuset)

    The header line starts with a tab (the empty corner cell), so a header cell's position is its
    column's position in a row. Runs of tabs are never merged: that would move the NUMA Affinity cell
    into the CPU Affinity column of a row whose CPU Affinity is empty. Lines before the header (a shell
    prompt) are skipped; a header without tabs (not nvidia-smi's format) gives {}.
    """
    lines = text.splitlines()
    headers = [i for i, line in enumerate(lines) if "CPU Affinity" in [c.strip() for c in line.split("\t")]]
    if not headers:
        return {}
    start = headers[0]
    column = [cell.strip() for cell in lines[start].split("\t")].index("CPU Affinity")
    out = {}
    for line in lines[start + 1:]:
        fields = line.split("\t")
        match = re.fullmatch(r"GPU(\d+)", fields[0].strip())
        if match and len(fields) > column:
            out[int(match.group(1))] = fields[column].strip()
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


def parse_lost_gpus(text):
    """The PCI bus ids of the GPUs nvidia-smi could not reach, from its lines such as
    `Unable to determine the device handle for GPU0000:DB:00.0: Unknown Error`."""
    return [match.group(1).upper() for match in map(LOST_GPU.match, text.splitlines()) if match]


def _bus_key(bus_id):
    """nvidia-smi writes the domain with 8 digits in one place and 4 in another: compare without it."""
    return bus_id.upper().split(":", 1)[-1]


def run_timed(module, argv, seconds):
    """module.run_command under coreutils `timeout -k 5 <seconds>` (run_command of ansible-core 2.19 takes
    no timeout); a call that does not answer in time fails the module."""
    timeout = module.get_bin_path("timeout", required=True)
    rc, out, err = module.run_command([timeout, "-k", "5", str(seconds), *argv])
    if rc in TIMEOUT_RCS:
        module.fail_json(msg=f"{argv[0]} did not answer within {seconds} s: {' '.join(argv)} (rc {rc})")
    return rc, out, err


def gpus(module, nvidia_smi, gpu_node=True, seconds=30):
    path = module.get_bin_path(nvidia_smi) if "/" not in nvidia_smi else nvidia_smi
    if not path or not os.access(path, os.X_OK):
        return [], []
    rc, out, _err = run_timed(module, [path, "--query-gpu=index,name,pci.bus_id", "--format=csv,noheader"],
                              seconds)
    if rc == NVSMI_NO_DRIVER:
        if gpu_node:
            module.fail_json(msg=f"{path} exited 9: the NVIDIA driver is not loaded on this GPU node")
        return [], []
    lost = parse_lost_gpus(out) if rc == NVSMI_GPU_LOST else []
    if rc != 0 and not lost:
        module.fail_json(msg=f"{path} --query-gpu failed with rc {rc}", stdout=out)
    found = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            found.append({"index": int(parts[0]), "name": parts[1], "pci_bus_id": parts[2], "minor": None,
                          "cores": ""})
    # The minor number is not promised to equal the index; without it gres.conf would name the wrong
    # device. A GPU whose minor number nvidia-smi -q does not show fails the module.
    rc, out, _err = run_timed(module, [path, "-q"], seconds)
    answered = (0, NVSMI_GPU_LOST) if lost else (0,)
    minors = {_bus_key(bus): minor for bus, minor in parse_q_minors(out).items()} if rc in answered else {}
    for gpu in found:
        if _bus_key(gpu["pci_bus_id"]) not in minors:
            module.fail_json(msg=f"{path} -q shows no minor number for GPU {gpu['index']} ({gpu['pci_bus_id']})")
        gpu["minor"] = minors[_bus_key(gpu["pci_bus_id"])]
    rc, out, _err = run_timed(module, [path, "topo", "-m"], seconds)
    if rc in answered:
        affinity = parse_topo_affinity(out)
        for gpu in found:
            gpu["cores"] = affinity.get(gpu["index"], "")
    return found, lost


def is_rail(dev, name, tree):
    """InfiniBand on every port, and behind a GPU's PCIe switch (opsctl ib check's rule)."""
    layers = {read(os.path.join(port, "link_layer")) for port in glob.glob(os.path.join(dev, "ports", "*"))}
    return layers == {"InfiniBand"} and near_gpu(name, tree)


def hcas(sysfs_root, pattern=""):
    """Every HCA, `compute` by the site's pattern when it gives one, else by what the HCA is."""
    found = []
    tree = read_pci_tree(sysfs_root) if not pattern else None
    for dev in sorted(glob.glob(os.path.join(sysfs_root, "class", "infiniband", "*"))):
        name = os.path.basename(dev)
        port = os.path.join(dev, "ports", "1")
        found.append({
            "name": name,
            "compute": bool(re.search(pattern, name)) if tree is None else is_rail(dev, name, tree),
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
            "ib_devices": {"type": "str", "default": ""},
            "gpu_node": {"type": "bool", "default": True},
            "command_timeout": {"type": "int", "default": 30},
        },
        supports_check_mode=True,
    )
    if module.params["command_timeout"] < 1:
        module.fail_json(msg=f"command_timeout must be at least 1 s, not {module.params['command_timeout']}")
    gpu_list, lost = gpus(module, module.params["nvidia_smi"], module.params["gpu_node"],
                          module.params["command_timeout"])
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
        "lost_gpus": lost,
        "hcas": hcas(module.params["sysfs_root"], module.params["ib_devices"]),
        "nvme": nvme(),
        "memory_mb": memory_mb(),
        **topo,
    }
    module.exit_json(changed=False, ansible_facts={"opsctl_hw": facts})


if __name__ == "__main__":
    main()
