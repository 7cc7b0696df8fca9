"""Jinja filters for Slurm config templates.

hostlist_expression: fold host names into Slurm's bracket notation, so that 64 H200 nodes take one
NodeName= line instead of 64:

    {{ ['gpu001', 'gpu002', 'gpu003', 'gpu010', 'head'] | hostlist_expression }}
    -> ['gpu[001-003,010]', 'head']

The implementation is opsctl's own (opsctl/slurm/hostlist.py), taken from this checkout, so the
playbooks and opsctl always fold names alike. It is loaded from its file alone: ansible-playbook loads
every filter plugin again in each worker it forks (one per task and host), and importing it through the
opsctl package would import opsctl's config schema too, which was the largest part of a run's CPU.

slurm_gres_layouts: the hosts of a node group that share one GPU layout, for gres.conf. A layout is each
GPU's device minor number (the N of /dev/nvidiaN, which the driver does not promise to equal
nvidia-smi's index) and CPU affinity, from the hosts' opsctl_hw facts (hw_discovery):

    {{ groups['gpu_nodes'] | slurm_gres_layouts(hostvars) }}
    -> [{'nodes': 'gpu[1,3]', 'first': 'gpu1', 'gpus': [{'index': 0, 'minor': 0, 'cores': '0-55'}, ...]},
        {'nodes': 'gpu2', 'first': 'gpu2', 'gpus': [{'index': 0, 'minor': 7, 'cores': '0-55'}, ...]}]
"""

import importlib.util
from pathlib import Path

from ansible.errors import AnsibleFilterError

# playbooks/filter_plugins/ -> the checkout that holds the opsctl package these playbooks belong to.
_HOSTLIST = Path(__file__).resolve().parents[2] / "opsctl" / "slurm" / "hostlist.py"
_spec = importlib.util.spec_from_file_location("_opsctl_slurm_hostlist", _HOSTLIST)
assert _spec is not None and _spec.loader is not None, _HOSTLIST
_hostlist = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_hostlist)
hostlist_expression = _hostlist.hostlist_expression


def slurm_gres_layouts(hosts, hostvars) -> list[dict]:
    layouts: dict[tuple, list[str]] = {}
    missing = []
    for host in hosts:
        hw = hostvars[host].get("opsctl_hw")
        if not hw:
            missing.append(host)
            continue
        gpus = tuple((int(gpu["index"]), int(gpu.get("minor", gpu["index"])), str(gpu.get("cores") or ""))
                     for gpu in sorted(hw["gpus"], key=lambda gpu: int(gpu["index"])))
        layouts.setdefault(gpus, []).append(host)
    if missing:
        raise AnsibleFilterError(f"no opsctl_hw facts for {', '.join(missing)}: run hw_discovery on them "
                                 "(make provision PLAYBOOK_ARGS='--tags facts')")
    return [{"nodes": ",".join(hostlist_expression(members)), "first": members[0],
             "gpus": [{"index": index, "minor": minor, "cores": cores} for index, minor, cores in gpus]}
            for gpus, members in layouts.items()]


def hosts_without(hosts, hostvars, name: str) -> list[str]:
    """The hosts that have no variable `name` (in this run or the fact cache):

    {{ groups['gpu_nodes'] | hosts_without(hostvars, 'opsctl_hw') }}  -> ['gpu7']
    """
    return [host for host in hosts if name not in hostvars[host]]


class FilterModule:
    def filters(self):
        return {"hostlist_expression": hostlist_expression, "slurm_gres_layouts": slurm_gres_layouts,
                "hosts_without": hosts_without}
