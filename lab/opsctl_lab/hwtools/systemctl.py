"""`systemctl is-active|stop|start UNIT...` of an emulated node's services (the simulated lab's nodes have no
systemd of their own). DCGM's host engine and dcgm-exporter (hardware.MONITORING_SERVICES) are kept in the node's
hardware state, where the emulated nvidia-smi -r sees them hold the GPUs and the dcgm-exporter emulator stops
answering while either is stopped; they alone stop and start. nvidia-fabricmanager (inactive under
`fabricmanager-down`) and nvidia-persistenced answer is-active (NodeHardware.unit_active).

As systemd 252 answers (systemctl(1)): `is-active` prints one state a unit, `active` or `inactive` (a unit not
loaded is `inactive` too), exit 0 only when all are active, else 3; `stop` and `start` of a unit it does not know
print `Failed to stop foo.service: Unit foo.service not loaded.` (`start`: `... not found.`) and exit 5.
A unit is named with or without `.service`.
"""

import sys

from opsctl_lab.hardware import NodeHardware
from opsctl_lab.hwtools.common import load, main_guard, state_path

RC_NOT_ACTIVE, RC_NO_UNIT = 3, 5


def systemctl(hw: NodeHardware, argv: list[str]) -> tuple[str, str, int]:
    """stdout, stderr and exit code of one call; `hw` is changed in place (the caller saves it)."""
    args = [a for a in argv if not a.startswith("-")]
    if len(args) < 2 or args[0] not in ("is-active", "stop", "start"):
        return "", "emulated systemctl: only is-active, stop and start of units\n", 1
    verb, units = args[0], [u.removesuffix(".service") for u in args[1:]]
    if verb == "is-active":
        states = ["active" if hw.unit_active(u) else "inactive" for u in units]
        quiet = "--quiet" in argv or "-q" in argv
        return ("" if quiet else "".join(f"{state}\n" for state in states),
                "", 0 if all(state == "active" for state in states) else RC_NOT_ACTIVE)
    unknown = [u for u in units if u not in hw.monitoring]
    if unknown:
        word = "loaded" if verb == "stop" else "found"
        return "", f"Failed to {verb} {unknown[0]}.service: Unit {unknown[0]}.service not {word}.\n", RC_NO_UNIT
    for unit in units:
        hw.monitoring[unit] = verb == "start"
    return "", "", 0


def main(argv: list[str]) -> int:
    hw = load()
    out, err, rc = systemctl(hw, argv)
    if rc == 0 and any(a in ("stop", "start") for a in argv):
        hw.save(state_path())
    sys.stdout.write(out)
    sys.stderr.write(err)
    return rc


if __name__ == "__main__":
    sys.exit(main_guard(main))
