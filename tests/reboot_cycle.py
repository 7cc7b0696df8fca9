"""A reboot through Slurm as opsctl's remediation ladder asks for it (`SlurmCliImpl.reboot`: `scontrol reboot ASAP
nextstate=DOWN reason=...`), watched through opsctl's own client until the node is back: the lab tier's test
runs it on Debian 12's 22.05 (the lab's own slurmctld), the component tier's on 24.11 and 26.05 (chroot
clusters). The lab's RebootProgram "reboots" the node by restarting its slurmd with -b (opsctl_lab.slurm_reboot).

What each release showed, in order, for a drained idle node (sinfo --json of 22.05, scontrol show nodes --json
of 24.11 and 26.05; tests/fixtures/slurm/*-reboot-*.json hold captures), the same in all three:

    REBOOT_REQUESTED   idle, flags DRAIN REBOOT_REQUESTED, the reboot's reason (it replaces the drain's)
    REBOOT_ISSUED      down, flags DRAIN REBOOT_ISSUED, reason + " : reboot issued" (slurmd runs RebootProgram)
    back               down, no flags, reason + " : reboot issued : reboot complete" (slurmd registered with a
                       new boot time; nextstate=DOWN)

REBOOT_REQUESTED lasts until slurmctld issues the reboot: within a second on 22.05 and 24.11 (its background
loop), up to power_save_interval on 26.05 (the power_save thread: 10 s by default, 1 s in the chroot clusters).
"""

import time

from opsctl.slurm import SlurmCliImpl, SlurmNode

DRAIN_REASON = "opsctl:xid-79 gpu3 xid=79 count=1"
REBOOT_REASON = "opsctl:reboot gpu3 xid-79 xid=79 count=1"
REQUESTED = ("idle", ("DRAIN", "REBOOT_REQUESTED"), REBOOT_REASON)
ISSUED = ("down", ("DRAIN", "REBOOT_ISSUED"), f"{REBOOT_REASON} : reboot issued")
BACK = ("down", (), f"{REBOOT_REASON} : reboot issued : reboot complete")
UNEXPECTED_REBOOT = "Node unexpectedly rebooted"


def seen(node: SlurmNode) -> tuple[str, tuple[str, ...], str]:
    return node.state, node.flags, node.reason


def wait_for(slurm: SlurmCliImpl, node: str, done, what: str, timeout: float) -> list[SlurmNode]:
    """Read the node every 0.2 s until done(node); every distinct reading on the way, the last one done.
    A deadline, never an endless wait: AssertionError with what was seen."""
    readings: list[SlurmNode] = []
    deadline = time.monotonic() + timeout
    while True:
        now = slurm.nodes()[node]
        if not readings or seen(now) != seen(readings[-1]):
            readings.append(now)
        if done(now):
            return readings
        if time.monotonic() > deadline:
            raise AssertionError(f"{node}: no {what} within {timeout:g} s; seen: {[seen(n) for n in readings]}")
        time.sleep(0.2)


def reboot_cycle(slurm: SlurmCliImpl, node: str, timeout: float = 25) -> list[SlurmNode]:
    """Drain `node` as opsctl's health rules do, reboot it as the ladder does, and wait until it is back
    (SlurmNode.back_from_reboot); returns the distinct readings from the reboot request on."""
    slurm.drain([node], DRAIN_REASON)
    slurm.reboot([node], REBOOT_REASON)
    return wait_for(slurm, node, lambda n: n.back_from_reboot, "return from the reboot", timeout)


def check_cycle(readings: list[SlurmNode]) -> None:
    """Every reading before the last is the reboot under way (down_for_reboot), the states in the order
    above (a short one may fall between two readings), and the last is the node back, DOWN with the reason."""
    states = [seen(n) for n in readings]
    assert states[-1] == BACK and readings[-1].back_from_reboot, states
    assert all(n.down_for_reboot and not n.back_from_reboot for n in readings[:-1]), states
    assert len(states) > 1 and states == [s for s in (REQUESTED, ISSUED, BACK) if s in states], states


def resume(slurm: SlurmCliImpl, node: str, timeout: float = 10) -> SlurmNode:
    """opsctl's resume after its checks: the node idle, nothing holding it.

    The lab's stand-in reboot restarts slurmd with -b. At times slurmctld misses a ping during the restart
    (NOT_RESPONDING after the resume) and takes the slurmd's next registration, whose -b boot time is later
    than the last response it kept, for a reboot of its own: at ReturnToService=1 the node goes DOWN "Node
    unexpectedly rebooted" (seen once in five CI runs, on 22.05). A real node boots once, so its boot time
    precedes every later response; that one reading is resumed once more, anything else fails."""
    slurm.resume([node])
    try:
        return wait_for(slurm, node, lambda n: n.state == "idle" and not n.flags, "idle after the resume",
                        timeout)[-1]
    except AssertionError:
        if slurm.nodes()[node].reason != UNEXPECTED_REBOOT:
            raise
    slurm.resume([node])
    return wait_for(slurm, node, lambda n: n.state == "idle" and not n.flags, "idle after a second resume",
                    timeout)[-1]
