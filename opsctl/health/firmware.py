"""The PromQL of firmware-drift (each GPU's firmware) and version-drift (each HCA's firmware, each node's
driver and OFED): each version against what the rest of the fleet runs.

Where the versions are read, all from series the exporters already export:
- dcgm-exporter shows a GPU's versions as labels of every metric it exports for that GPU, when its counters
  file lists the fields with the type `label` (the dcgm_exporter role's file does; dcgm-exporter's
  etc/default-counters.csv has the lines, the first two commented out): DCGM_FI_DEV_VBIOS_VERSION (field 85),
  DCGM_FI_DEV_INFOROM_IMAGE_VER (field 82, "G520.0280.02.02" on an H200) and DCGM_FI_DRIVER_VERSION (field 1).
  One series per GPU carries them here: DCGM_FI_DEV_GPU_TEMP, a default counter every GPU exports. The
  driver is the node's, so its GPUs' series are folded into one per node.
- node_exporter's infiniband collector shows each HCA's firmware as node_infiniband_info{firmware_version,
  hca_type} (/sys/class/infiniband/<hca>/fw_ver and hca_type).
- `opsctl node check` writes the node's MLNX_OFED or DOCA-OFED release (`ofed_info -s`) into node_exporter's
  textfile: opsctl_node_ofed_info{distribution, version}.
The CUDA version that nvidia-smi and DCGM report (DCGM_FI_CUDA_DRIVER_VERSION) is the driver's own, so the
driver stands for it.

What a device should run, per group (a GPU model, an HCA type, the fleet for the driver) and component: the
version that hardware.firmware pins (GPU firmware only), else the one most devices of that group run (one of
them, on a tie, and then none is in a minority). A pin makes firmware-drift's difference a failure that
drains (PINNED); without one it is a warning, for a fleet's majority is only a hint: in a rollout it moves
from the old version to the new.

Each component's series carries `firmware`, the words of the evidence ("gpu3 vbios 96.00.89.00.01 (most run
96.00.A5.00.03)"); its other labels ride along until the rule's `max by`: fewer aggregations keep the query
short (VictoriaMetrics refuses one over 16 KiB).
"""

from collections.abc import Mapping
from dataclasses import dataclass

RULE = "firmware-drift"
# The rule's fields while any version is pinned (hardware.firmware): below catalog.overrides.
PINNED = {"severity": "fail", "action": "drain"}
_GPU_SERIES = 'DCGM_FI_DEV_GPU_TEMP{{job="{dcgm}", {label}!=""}}'


@dataclass(frozen=True)
class Component:
    label: str  # the label that holds the version
    group: str  # the label whose devices should all run one version; "" for the whole fleet
    series: str  # the selector that carries the label ({dcgm}, {node}, {label} filled in)
    device: tuple[str, str] = ("", "")  # (label, replacement) that names the device in the evidence
    per_node: bool = False  # one version per node: its devices' series are folded into one


# firmware-drift's: a GPU's firmware, which a site may pin (opsctl.config.schema.FIRMWARE_COMPONENTS)
COMPONENTS = {
    "vbios": Component("DCGM_FI_DEV_VBIOS_VERSION", "modelName", _GPU_SERIES, ("gpu", "gpu$1")),
    "inforom": Component("DCGM_FI_DEV_INFOROM_IMAGE_VER", "modelName", _GPU_SERIES, ("gpu", "gpu$1")),
}
# version-drift's: what a rollout changes a batch at a time (HCA firmware with mlxfwmanager, the driver and
# DOCA-OFED with `opsctl rollout`), so that a minority is the normal state of a rollout: never pinned here, never
# drained (ib.firmware pins the HCAs' for the node check, the rollout the driver's).
FLEET_COMPONENTS = {
    "hca": Component("firmware_version", "hca_type", 'node_infiniband_info{{job="{node}", {label}!=""}}',
                     ("device", "$1")),
    "driver": Component("DCGM_FI_DRIVER_VERSION", "", _GPU_SERIES, per_node=True),
    "ofed": Component("version", "", 'opsctl_node_ofed_info{{job="{node}", {label}!=""}}'),
}


def versions(dcgm: str, node: str, by: str, pins: Mapping[str, str],
             components: Mapping[str, Component] = COMPONENTS) -> str:
    """One series per device (GPU, HCA, or node for the driver) and component, labelled `firmware` (the
    device, the component, its version and the expected one with its basis: "pinned" or "most run"), besides
    the device's ${by}: 1 when the version differs from the expected one, 0 when not."""
    judged = " or ".join(_component(name, c, dcgm, node, by, pins.get(name)) for name, c in components.items())
    # firmware="gpu3 vbios 96.00.89.00.01 (most run 96.00.A5.00.03)"; a node-wide component names no part
    said = f'label_replace(label_join({judged}, "said", " ", "basis", "expected"), "said", "($1)", "said", "(.*)")'
    words = f'label_join({said}, "firmware", " ", "part", "version", "said")'
    return f'label_replace({words}, "firmware", "$1", "firmware", " *(.*)")'


def _component(name: str, c: Component, dcgm: str, node: str, by: str, pin: str | None) -> str:
    selector = c.series.format(dcgm=dcgm, node=node, label=c.label)
    group = f"by ({c.group}) " if c.group else ""
    keys = ", ".join(label for label in (c.group, c.label) if label)

    def at(offset: str) -> str:
        return f"max by ({by}, {c.label}) ({selector}{offset})" if c.per_node else f"{selector}{offset}"
    # Held by itself: a device is judged once its series has had this version for a hold (the same labels now
    # and a hold ago), so a new node, or a device just flashed, is not judged on its first scrape. The
    # majority is what the fleet runs now.
    held = f"({at('')} and {at(' offset ${hold}')})"
    if pin is None:
        expected = (f'label_replace(label_replace(topk {group}(1, count by ({keys}) ({at("")})), '
                    f'"expected", "$1", "{c.label}", "(.*)"), "basis", "most run", "", "")')
    else:
        expected = (f'label_replace(label_replace(label_replace(group {group}({selector}), '
                    f'"{c.label}", "{pin}", "", ""), "expected", "{pin}", "", ""), "basis", "pinned", "", "")')
    # `> bool 0`: the expected series' value (a count) must not scale the result
    judged = (f"(({held} unless on({keys}) {expected}) * 0 + 1 or {held} * 0)"
              f" * on({c.group}) group_left(expected, basis) ({expected} > bool 0)")
    named = f'label_replace({judged}, "version", "{name} $1", "{c.label}", "(.*)")'
    return f'label_replace({named}, "part", "{c.device[1]}", "{c.device[0]}", "(.*)")' if c.device[0] else named
