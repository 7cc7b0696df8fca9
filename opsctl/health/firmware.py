"""The firmware-drift rule's PromQL: each GPU's firmware versions against what its fleet runs.

dcgm-exporter shows a GPU's versions as labels of every metric it exports for that GPU, when its counters
file lists the fields with the type `label` (the dcgm_exporter role's file does; dcgm-exporter's
etc/default-counters.csv has the lines, commented out): DCGM_FI_DEV_VBIOS_VERSION (field 85) and
DCGM_FI_DEV_INFOROM_IMAGE_VER (field 82, "G520.0280.02.02" on an H200). One series per GPU carries them
here: DCGM_FI_DEV_GPU_TEMP, a default counter every GPU exports. Its other labels ride along until the
rule's `max by`: fewer aggregations keep the query short (VictoriaMetrics refuses one over 16 KiB).

What a GPU should run, per GPU model and component: the version that hardware.firmware pins, else the one
most GPUs of that model run (one of them, on a tie, and then no GPU is in a minority). A pin makes a
difference a failure that drains (PINNED); without one it is a warning, for a fleet's majority is only a
hint: in a firmware rollout it moves from the old version to the new.
"""

from collections.abc import Mapping

RULE = "firmware-drift"
# component -> the dcgm-exporter label that holds its version
COMPONENTS = {"vbios": "DCGM_FI_DEV_VBIOS_VERSION", "inforom": "DCGM_FI_DEV_INFOROM_IMAGE_VER"}
# The rule's fields while any version is pinned (hardware.firmware): below catalog.overrides.
PINNED = {"severity": "fail", "action": "drain"}
_CARRIER = "DCGM_FI_DEV_GPU_TEMP"


def versions(job: str, by: str, pins: Mapping[str, str]) -> str:
    """One series per GPU and component, labelled component, version, expected (the version it should run)
    and basis ("pinned" or "most run"), besides the GPU's ${by}, gpu and modelName: 1 when the version
    differs from the expected one, 0 when not."""
    return " or ".join(_component(job, by, component, label, pins.get(component))
                       for component, label in COMPONENTS.items())


def _component(job: str, by: str, component: str, label: str, pin: str | None) -> str:
    # Held by itself: a GPU's series with this version now and a hold ago (the same labels at both ends), so
    # a fleet whose scrapes have just begun has no majority yet, and a freshly flashed GPU counts after a hold.
    seen = f'{_CARRIER}{{job="{job}", {label}!=""}}'
    gpus = f"({seen} and {seen} offset ${{hold}})"
    if pin is None:
        expected = (f'label_replace(label_replace(topk by (modelName) (1, count by (modelName, {label}) {gpus}), '
                    f'"expected", "$1", "{label}", "(.*)"), "basis", "most run", "", "")')
    else:
        expected = (f'label_replace(label_replace(label_replace(group by (modelName) ({seen}), '
                    f'"{label}", "{pin}", "", ""), "expected", "{pin}", "", ""), "basis", "pinned", "", "")')
    # `> bool 0`: the expected series' value (a count) must not scale the result
    judged = (f"(({gpus} unless on(modelName, {label}) {expected}) * 0 + 1 or {gpus} * 0)"
              f" * on(modelName) group_left(expected, basis) ({expected} > bool 0)")
    named = f'label_replace({judged}, "version", "$1", "{label}", "(.*)")'
    return f'label_replace({named}, "component", "{component}", "", "")'
