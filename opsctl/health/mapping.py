"""Which Slurm node a series belongs to.

The scrape target label `node` (the lab and the prometheus role set it) wins; without it the
exporter's own `Hostname` (released dcgm-exporter) or `hostname` (newer dcgm-exporter) is used, with
any domain stripped; without any of them, the host part of `instance`. `node_mapping.names` maps what
remains to a Slurm name when the two differ (e.g. an IP address).
"""

import ipaddress

from opsctl.config.schema import MappingConfig


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return False
    return True


def _host_of_instance(instance: str) -> str:
    if instance.startswith("["):  # [::1]:9400
        return instance[1:].split("]", 1)[0]
    return instance.rsplit(":", 1)[0] if instance.count(":") == 1 else instance


def node_name(labels: dict[str, str], mapping: MappingConfig) -> str | None:
    """The Slurm node name for a series, or None when its labels name no host at all."""
    name = next((labels[label] for label in mapping.labels if labels.get(label)), None)
    if name is None and labels.get("instance"):
        name = _host_of_instance(labels["instance"])
    if not name:
        return None
    if name in mapping.names:
        return mapping.names[name]
    if mapping.strip_domain and not _is_ip(name):
        name = name.split(".", 1)[0]
    return mapping.names.get(name, name)
