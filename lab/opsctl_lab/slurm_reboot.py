"""How the lab's Slurm clusters reboot a node: slurm.conf's RebootProgram, as Slurm expects of it.

`scontrol reboot [ASAP] [nextstate=...] NODES` marks the nodes REBOOT_REQUESTED; once a node is idle,
slurmctld sends its slurmd the reboot request (REBOOT_ISSUED, base state DOWN) and slurmd runs
RebootProgram. A real node then goes down and comes back, and its slurmd registers with a new boot
time; slurmctld clears REBOOT_ISSUED and applies nextstate (DOWN keeps the node out of service with
the reason, RESUME returns it), or marks it DOWN "reboot timed out" after ResumeTimeout (60 s).

The lab's nodes are slurmds on one host, so a reboot is: stop that node's slurmd, reboot its emulated
hardware (the simulated lab's NodeHardware.reboot: volatile faults end, sticky ones stay), pause, and
start slurmd again with `-b` (slurmd(8): "Report node rebooted when daemon restarted. Used for testing
purposes."). The program (templates/reboot-program.sh.j2) is written into each cluster's directory,
for the host lab by `opsctl lab up` and for a chroot cluster by ChrootCluster.up; the restarted slurmd
takes the place of the old one in the lab's PID files, so `opsctl lab down` (or ChrootCluster.down)
stops it as it stops the rest.

A host lab node with the `reboot-hang` fault never comes back: its slurmd stops and stays down, its hardware
keeps every fault, and slurmctld marks it DOWN "reboot timed out" after ResumeTimeout. Only a power cycle
through the lab's BMC (opsctl_lab.bmc, which boots the node with the program's `--boot NODE`) brings it back.

Slurm keeps boot times in whole seconds and takes a node whose boot time is not before the reboot request
for one that has booted already: a node rebooted again within a second or two of coming back can be
returned to service by its old slurmd's answer, still REBOOT_ISSUED, until ResumeTimeout marks it DOWN
"reboot timed out". A real node's boot is minutes before any reboot request; a lab test reboots a node
that has been up for a while.

    python -m opsctl_lab.slurm_reboot hardware LAB_DIR NODE    # what the host lab's program runs

exits 0 once the hardware rebooted, HANG_EXIT (3) when the reboot hangs (nothing rebooted).
"""

import shlex
import stat
import sys
from pathlib import Path

import jinja2

from opsctl_lab import paths as lp
from opsctl_lab.hardware import NodeHardware, fault_label, write_kernel_log

# Between slurmd's end and its start again: a boot time in a later second than slurmctld's reboot
# request (both in whole seconds; a registration that boots earlier is "still waiting for boot"), and a
# moment in which the node shows REBOOT_ISSUED with no slurmd, as a rebooting node does.
PAUSE_S = 2.0
# The hardware step's exit status for a reboot that hangs: the program leaves slurmd down.
HANG_EXIT = 3

_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("opsctl_lab", "templates"), undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True, autoescape=False)
_TEMPLATES.filters["shell"] = lambda value: shlex.quote(str(value))


def write_program(path: Path, *, cluster: str, run_dir: Path | str, log_dir: Path | str, slurm_conf: Path | str,
                  hardware: list[str] | None = None, self_path: Path | str | None = None,
                  pause: float = PAUSE_S) -> None:
    """Write the RebootProgram to `path` (mode 0755). The other paths are as slurmd sees them (inside a
    chroot, the chroot's own; `self_path` is `path` as slurmd sees it): `run_dir` holds the lab's PID
    files (slurmd.NODE.pid, as opsctl_lab.processes.start names them), `log_dir` the slurmd.NODE.log
    that the restarted slurmd writes to. `hardware`: a command that gets the node's name as its last
    argument and reboots its emulated hardware, run while slurmd is down."""
    text = _TEMPLATES.get_template("reboot-program.sh.j2").render(
        cluster=cluster, program=self_path or path, run_dir=run_dir, log_dir=log_dir, slurm_conf=slurm_conf,
        hardware=hardware or [], pause=f"{pause:g}", hang_exit=HANG_EXIT)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def hardware_command(paths: lp.LabPaths) -> list[str]:
    """The host lab's hardware step of a reboot: this module run by the Python that runs the lab."""
    return [sys.executable, "-m", "opsctl_lab.slurm_reboot", "hardware", str(paths.root)]


def reboot_hardware(paths: lp.LabPaths, node: str) -> list[str]:
    """What the reboot does to the node's emulated hardware (NodeHardware.reboot), its kernel log started
    again too; returns the faults it ended, as the lab names them."""
    hw = NodeHardware.load(paths.hardware(node), node)
    ended = hw.reboot()
    hw.save(paths.hardware(node))
    write_kernel_log(paths.kernel_log(node), hw)
    return [fault_label(fault) for fault in ended]


def reboot_hangs(paths: lp.LabPaths, node: str) -> bool:
    """Whether the node's graceful reboot never finishes (the `reboot-hang` fault): nothing reboots then."""
    return NodeHardware.load(paths.hardware(node), node).node_fault("reboot-hang")


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "hardware":
        sys.stderr.write("usage: python -m opsctl_lab.slurm_reboot hardware LAB_DIR NODE\n")
        return 2
    paths, node = lp.LabPaths(Path(argv[1])), argv[2]
    if reboot_hangs(paths, node):
        sys.stdout.write(f"the reboot of {node} hangs (reboot-hang): its hardware keeps every fault\n")
        return HANG_EXIT
    ended = reboot_hardware(paths, node)
    sys.stdout.write(f"emulated hardware of {argv[2]} rebooted; faults ended: {', '.join(ended) or 'none'}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
