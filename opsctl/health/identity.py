"""Which Slurm node each scrape target is: decided once per run, then used for presence and for every
rule's series alike (every rule keeps the target's `job` and `instance`, the ${by} placeholder).

A target's name comes from, in order:
  1. its target label `node_mapping.target_label` (default `node`), when the scrape config sets one;
  2. `node_mapping.names` for its instance (`10.1.2.3:9400`) or the host part of it (`10.1.2.3`);
  3. what the target reports about itself: dcgm-exporter's `Hostname` or `hostname` label
     (`node_mapping.exporter_labels`), node_exporter's `node_uname_info{nodename}`;
  4. the host part of `instance`.
The domain is stripped (`node_mapping.strip_domain`), except from a name that `names` gave.

Identity conflicts make a node unknown, never acted on (check `identity-conflict`):
  - a name that two targets of one job claim;
  - a target whose series report different host names;
  - a target whose target label and its own report of its host name disagree: the label says
    node=gpu060, dcgm-exporter's Hostname (or node_exporter's nodename) says gpu061. Both names are
    unknown, so that two targets with swapped labels drain neither node.
Names are compared as short host names: the domain stripped, case-insensitive, after
`node_mapping.names` (a site whose Slurm names differ from its host names maps one to the other there).
"""

import ipaddress
from collections.abc import Set
from dataclasses import dataclass, field
from typing import NamedTuple

from opsctl.config.schema import Config, MappingConfig
from opsctl.prom.client import Sample

# dcgm-exporter metrics whose series carry the exporter's own host label; the XID ones also tell which
# XID source a target has (catalog.xid_source auto). node_exporter reports its host in node_uname_info.
XID_WINDOW = "DCGM_EXP_XID_ERRORS_COUNT"
XID_GAUGE = "DCGM_FI_DEV_XID_ERRORS"
SELF_METRICS = ("DCGM_FI_DEV_GPU_TEMP", XID_GAUGE, XID_WINDOW)


class Target(NamedTuple):  # a tuple: built and hashed for every series of a run, tens of thousands of times
    job: str
    instance: str


@dataclass
class TargetInfo:
    source: str  # "dcgm" or "node"
    name: str = ""
    via: str = ""  # target-label, names, exporter, instance
    reported: dict[str, str] = field(default_factory=dict)  # name the target reports -> the label it is in
    metrics: set[str] = field(default_factory=set)  # which of SELF_METRICS it exports
    conflict: str = ""  # why this target's identity cannot be trusted ("" when it can)
    conflict_names: set[str] = field(default_factory=set)  # the other node names the conflict involves


def identity_query(config: Config) -> str:
    """One query for every target's self-reported name and XID metrics, however many nodes there are."""
    jobs = config.prometheus.jobs
    labels = ", ".join(["job", "instance", *config.node_mapping.exporter_labels, "nodename", "__name__"])
    selector = f'{{job="{jobs["dcgm"]}", __name__=~"{"|".join(SELF_METRICS)}"}}'
    if "node" in jobs:
        selector += f' or node_uname_info{{job="{jobs["node"]}"}}'
    return f"group by ({labels}) ({selector})"


def _is_ip(text: str) -> bool:
    text = text.strip("[]")
    if ":" not in text and not text.replace(".", "").isdigit():
        return False  # a host name: ip_address() could only raise, which costs a second at 16,384 nodes
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def host_of(instance: str) -> str:
    if instance.startswith("["):  # [::1]:9400
        return instance[1:].split("]", 1)[0]
    return instance.rsplit(":", 1)[0] if instance.count(":") == 1 else instance


def _strip(name: str, mapping: MappingConfig) -> str:
    if mapping.strip_domain and not _is_ip(name):
        name = name.split(".", 1)[0]
    return mapping.names.get(name, name)


def host_key(name: str, mapping: MappingConfig) -> str:
    """What two host names are compared by: the node name opsctl would give it, short, lower case."""
    name = _strip(name, mapping)
    return (name if _is_ip(name) else name.split(".", 1)[0]).lower()


def find_conflict(target: Target, info: TargetInfo, label: str, mapping: MappingConfig) -> tuple[str, set[str]]:
    """(why, the other node names involved) when what names this target disagrees, else ("", set())."""
    if info.via == "target-label":
        mine = host_key(label, mapping)
        others = sorted((name, by) for name, by in info.reported.items() if host_key(name, mapping) != mine)
        if not others:
            return "", set()
        said = ", ".join(f"{by}={name}" for name, by in others)
        why = f"{info.source} target {target.instance} is labelled {mapping.target_label}={label} but reports {said}"
        return why, {_strip(name, mapping) for name, _ in others}
    if info.via == "exporter" and len(info.reported) > 1 and len({host_key(n, mapping) for n in info.reported}) > 1:
        names = sorted(info.reported)
        why = f"{info.source} target {target.instance} reports several names: {', '.join(names)}"
        return why, {_strip(name, mapping) for name in names} - {info.name}
    return "", set()


def name_of(labels: dict[str, str], mapping: MappingConfig, reported: Set[str] = frozenset()) -> tuple[str, str]:
    """(name, how it was found) for a target with these labels; ("", "") when nothing names it."""
    if mapping.target_label and labels.get(mapping.target_label):
        return _strip(labels[mapping.target_label], mapping), "target-label"
    instance = labels.get("instance", "")
    for key in (instance, host_of(instance)):
        if key and key in mapping.names:
            return mapping.names[key], "names"
    own = reported or {labels[lb] for lb in mapping.exporter_labels if labels.get(lb)}
    if own:
        return _strip(sorted(own)[0], mapping), "exporter"
    if instance:
        return _strip(host_of(instance), mapping), "instance"
    return "", ""


class Identities:
    """Target -> node name for one run, built from the presence answer (`up`) and the identity query."""

    def __init__(self, up: list[Sample], reported: list[Sample], config: Config):
        self.mapping = config.node_mapping
        sources = {job: source for source, job in config.prometheus.jobs.items()}
        self.targets: dict[Target, TargetInfo] = {}
        self.up: dict[Target, float] = {}
        labels_of: dict[Target, dict[str, str]] = {}
        self._by_node: dict[str, dict[str, list[tuple[Target, TargetInfo]]]] | None = None
        for sample in up:
            target = Target(sample.labels.get("job", ""), sample.labels.get("instance", ""))
            if target.job in sources:
                self.targets.setdefault(target, TargetInfo(sources[target.job]))
                self.up[target] = sample.value
                labels_of[target] = sample.labels
        name_labels = (*self.mapping.exporter_labels, "nodename")
        for sample in reported:
            info = self.targets.get(Target(sample.labels.get("job", ""), sample.labels.get("instance", "")))
            if info is None:
                continue
            info.metrics.add(sample.labels.get("__name__", ""))
            for label in name_labels:
                if sample.labels.get(label):
                    info.reported.setdefault(sample.labels[label], label)
        for target, info in self.targets.items():
            labels = labels_of[target]
            info.name, info.via = name_of(labels, self.mapping, set(info.reported))
            label = labels.get(self.mapping.target_label or "", "")
            info.conflict, info.conflict_names = find_conflict(target, info, label, self.mapping)

    def target(self, labels: dict[str, str]) -> TargetInfo | None:
        return self.targets.get(Target(labels.get("job", ""), labels.get("instance", "")))

    def node_of(self, labels: dict[str, str]) -> str:
        """The node a series belongs to: its target's name, else what its own labels say ("" if nothing)."""
        info = self.target(labels)
        if info is not None:
            return info.name
        return name_of(labels, self.mapping)[0]

    def by_node(self) -> dict[str, dict[str, list[tuple[Target, TargetInfo]]]]:
        """node -> source -> the targets that name it (built once: the targets are fixed after __init__)."""
        if self._by_node is None:
            self._by_node = {}
            for target, info in self.targets.items():
                if info.name:
                    self._by_node.setdefault(info.name, {}).setdefault(info.source, []).append((target, info))
        return self._by_node
