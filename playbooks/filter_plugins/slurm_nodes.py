"""slurm_node_lines: the NodeName= lines of one node group, from the hardware each node reported.

Every node of the group is held against the group's profile: what the site declares for it
(slurm_nodegroups[].profile: gpus, gpu_model, memory_gb, hcas) and, for what it leaves out, what most of
the group's nodes report. The nodes that fit share one line; its RealMemory comes from the smallest of
them, so that none registers with less than slurm.conf says. A node that differs (GPU count or model,
memory beyond the tolerance, HCA count, CPU topology) gets a line of its own with what it really has, and
the line says why: slurm_compute hands that to `opsctl hw quarantine`, which drains it
`opsctl:hw-mismatch <why>`. One node's facts never define the others, so a node that lost a GPU never
shrinks the group.

    {{ groups['gpu_nodes'] | slurm_node_lines(hostvars, {'gpus': 8}, 5) }}
    -> [{'hosts': ['gpu1', 'gpu2'], 'hw': {'gpu_count': 8, ..., 'memory_mb': 2063000}, 'mismatch': ''},
        {'hosts': ['gpu3'], 'hw': {'gpu_count': 7, ...}, 'mismatch': 'gpus 7 (profile 8)'}]

The first line is the one that fits the profile (when any node does); the others follow by host name.
"""

from collections import Counter

from ansible.errors import AnsibleFilterError

# What a node line is made of, from the opsctl_hw facts of hw_discovery.
CPU_KEYS = ("sockets", "cores_per_socket", "threads_per_core")


def _hardware(host: str, hw: dict) -> dict:
    try:
        # The compute HCAs (hw_discovery: InfiniBand behind a GPU's PCIe switch, or the site's ib_devices);
        # storage and in-band ports do not count.
        hcas = [hca for hca in hw.get("hcas") or [] if not isinstance(hca, dict) or hca.get("compute", True)]
        return {"gpu_count": int(hw.get("gpu_count") or 0), "gpu_model": str(hw.get("gpu_model") or ""),
                "hca_count": len(hcas), "memory_mb": int(hw["memory_mb"]), "lost_gpus": list(hw.get("lost_gpus") or []),
                **{key: int(hw[key]) for key in CPU_KEYS}}
    except (KeyError, TypeError, ValueError) as err:
        raise AnsibleFilterError(f"the opsctl_hw facts of {host} lack {err} (run hw_discovery on it)") from err


def _most_common(values: list):
    """The value most nodes report; on a tie the larger one (a node more often loses a part than gains one)."""
    counts = Counter(values)
    return max(counts, key=lambda value: (counts[value], value))


def _profile(nodes: dict[str, dict], declared: dict) -> dict:
    memories = sorted(hw["memory_mb"] for hw in nodes.values())
    profile = {key: _most_common([hw[key] for hw in nodes.values()])
               for key in ("gpu_count", "gpu_model", "hca_count", *CPU_KEYS)}
    profile["memory_mb"] = memories[len(memories) // 2]
    if "gpus" in declared:
        profile["gpu_count"] = int(declared["gpus"])
    if "hcas" in declared:
        profile["hca_count"] = int(declared["hcas"])
    if "memory_gb" in declared:
        profile["memory_mb"] = int(float(declared["memory_gb"]) * 1024)
    if "gpu_model" in declared:
        profile["gpu_model"] = str(declared["gpu_model"])
    return profile


def _differences(hw: dict, profile: dict, tolerance_percent: float) -> list[str]:
    found = []
    if hw["gpu_count"] != profile["gpu_count"]:
        found.append(f"gpus {hw['gpu_count']} (profile {profile['gpu_count']})")
    if hw["lost_gpus"]:  # nvidia-smi could not reach them: their bus ids are what a vendor ticket needs
        found.append(f"lost {','.join(hw['lost_gpus'])}")
    # A declared model is matched as a part of the name nvidia-smi reports ("H200" in "NVIDIA H200").
    if hw["gpu_count"] and profile["gpu_model"].lower() not in hw["gpu_model"].lower():
        model, expected = (name.replace(" ", "_") for name in (hw["gpu_model"], profile["gpu_model"]))
        found.append(f"gpu model {model} (profile {expected})")
    if abs(hw["memory_mb"] - profile["memory_mb"]) > profile["memory_mb"] * tolerance_percent / 100:
        found.append(f"memory {hw['memory_mb'] // 1024}GiB (profile {profile['memory_mb'] // 1024}GiB "
                     f"+-{tolerance_percent:g}%)")
    if hw["hca_count"] != profile["hca_count"]:
        found.append(f"hcas {hw['hca_count']} (profile {profile['hca_count']})")
    cpus, expected = ([hw[key] for key in CPU_KEYS], [profile[key] for key in CPU_KEYS])
    if cpus != expected:
        found.append(f"cpus {'x'.join(map(str, cpus))} (profile {'x'.join(map(str, expected))})")
    return found


def slurm_node_lines(hosts, hostvars, declared=None, tolerance_percent=5) -> list[dict]:
    nodes, missing = {}, []
    for host in hosts:
        hw = hostvars[host].get("opsctl_hw")
        if hw:
            nodes[host] = _hardware(host, hw)
        else:
            missing.append(host)
    if missing:
        raise AnsibleFilterError(f"no opsctl_hw facts for {', '.join(missing)}: run hw_discovery on them "
                                 "(make provision PLAYBOOK_ARGS='--tags facts')")
    if not nodes:
        return []
    profile = _profile(nodes, declared or {})
    differences = {host: _differences(hw, profile, tolerance_percent) for host, hw in nodes.items()}
    fitting = [host for host in nodes if not differences[host]]
    lines = []
    if fitting:
        smallest = min(nodes[h]["memory_mb"] for h in fitting)
        lines.append({"hosts": fitting, "hw": {**nodes[fitting[0]], "memory_mb": smallest}, "mismatch": ""})
    for host in sorted(set(nodes) - set(fitting)):
        lines.append({"hosts": [host], "hw": nodes[host],
                      "mismatch": ", ".join(differences[host])})
    return lines


def slurm_hw_mismatches(nodegroups, groups, hostvars, hosts, tolerance_percent=5) -> dict[str, str]:
    """host -> why its hardware differs from its group's profile ("" when it fits), for the hosts given
    (those of this run: a host out of it is never judged on cached facts): `opsctl hw quarantine`'s input.

    {{ slurm_nodegroups | slurm_hw_mismatches(groups, hostvars, ansible_play_hosts, 5) }}
    -> {'gpu1': '', 'gpu2': '', 'gpu3': 'gpus 7 (profile 8)'}
    """
    wanted, found = set(hosts), {}
    for group in nodegroups:
        for line in slurm_node_lines(groups[group["group"]], hostvars, group.get("profile"), tolerance_percent):
            found.update({host: line["mismatch"] for host in line["hosts"] if host in wanted})
    return found


class FilterModule:
    def filters(self):
        return {"slurm_node_lines": slurm_node_lines, "slurm_hw_mismatches": slurm_hw_mismatches}
