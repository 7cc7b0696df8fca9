"""inventory/lab/hosts.yml: connection data and group membership only. The variables that point the
roles at the emulated hardware are committed separately in inventory/lab/group_vars/. Provisioning logs
in as the lab's provisioning account and becomes root with sudo, as on a real site."""

import yaml

from opsctl_lab.machines.settings import PROVISIONING_USER, STORAGE_MACHINE, Settings, is_gpu_machine


def render(settings: Settings, names: list[str]) -> str:
    def host(name: str) -> dict[str, str | bool]:
        return {
            "ansible_host": settings.addr(name),
            "ansible_user": PROVISIONING_USER,
            "ansible_become": True,
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_private_key_file": str(settings.ssh_key),
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={settings.known_hosts} -o StrictHostKeyChecking=yes",
        }

    gpus = [n for n in names if is_gpu_machine(n)]
    storage = [n for n in names if n == STORAGE_MACHINE]
    doc = {
        "all": {
            "children": {
                "cluster": {
                    "children": {
                        "controller": {"hosts": {"head": host("head")}},
                        "storage": {"hosts": {n: host(n) for n in storage}},
                        "gpu_nodes": {"hosts": {n: host(n) for n in gpus}},
                    }
                }
            }
        }
    }
    header = "# Written by `opsctl lab machines up`; do not edit (group_vars/ holds the lab's variables).\n"
    return header + yaml.safe_dump(doc, sort_keys=False)


VENDOR_VARS = "vendor-repos.yml"


def write_vendor_vars(settings: Settings, variables: dict[str, str]) -> None:
    """A second inventory source beside hosts.yml: where the lab serves the vendors' repositories and the
    key that signs them (opsctl_lab.machines.vendor_server.vendor_vars), the only variables a lab inventory
    has that a production one sets to the vendors' own."""
    settings.inventory_dir.mkdir(parents=True, exist_ok=True)
    header = ("---\n# Written by `opsctl lab machines up`: the lab's vendor repositories (URLs on the bridge, the\n"
              "# lab's signing key); a production inventory names the vendors' (inventory/example).\n")
    text = header + yaml.safe_dump({"all": {"vars": variables}}, sort_keys=False)
    (settings.inventory_dir / VENDOR_VARS).write_text(text)


def write(settings: Settings, names: list[str]) -> None:
    settings.inventory_dir.mkdir(parents=True, exist_ok=True)
    (settings.inventory_dir / "hosts.yml").write_text(render(settings, names))
