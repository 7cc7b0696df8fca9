"""The lab network: one bridge on the host, one network namespace per machine joined to it by a veth
pair, and a guard route.

No machine gets a default route and the host does no NAT, so a machine reaches only the lab subnet.
The guard route (`unreachable SUBNET metric 9999`) stays while the lab exists: if the bridge goes
away, traffic for the subnet is refused on this host instead of following the host's default route.
"""

from pathlib import Path

from opsctl.lab.machines.proc import run
from opsctl.lab.machines.settings import (
    BRIDGE,
    BRIDGE_ADDR,
    PREFIX_LEN,
    SUBNET,
    machine_addr,
    netns_name,
    veth_name,
)

NETNS_DIR = Path("/run/netns")


def link_exists(name: str) -> bool:
    return run(["ip", "link", "show", "dev", name], check=False).returncode == 0


def guard_route_present() -> bool:
    out = run(["ip", "route", "show", "type", "unreachable", SUBNET]).stdout
    return "metric 9999" in out


def ensure_bridge() -> None:
    if not guard_route_present():
        run(["ip", "route", "add", "unreachable", SUBNET, "metric", "9999"])
    if not link_exists(BRIDGE):
        run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    addrs = run(["ip", "-o", "-4", "addr", "show", "dev", BRIDGE]).stdout
    if f"{BRIDGE_ADDR}/{PREFIX_LEN}" not in addrs:
        run(["ip", "addr", "add", f"{BRIDGE_ADDR}/{PREFIX_LEN}", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])


def ensure_machine_netns(name: str) -> None:
    """netns with lo up and eth0 = the machine's address, its peer on the bridge. Idempotent."""
    ns, veth = netns_name(name), veth_name(name)
    if not (NETNS_DIR / ns).exists():
        run(["ip", "netns", "add", ns])
    if not link_exists(veth):
        run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
    run(["ip", "link", "set", veth, "master", BRIDGE, "up"])
    run(["ip", "-n", ns, "link", "set", "lo", "up"])
    addrs = run(["ip", "-n", ns, "-o", "-4", "addr", "show", "dev", "eth0"]).stdout
    if f"{machine_addr(name)}/{PREFIX_LEN}" not in addrs:
        run(["ip", "-n", ns, "addr", "add", f"{machine_addr(name)}/{PREFIX_LEN}", "dev", "eth0"])
    run(["ip", "-n", ns, "link", "set", "eth0", "up"])


def remove_machine_netns(name: str) -> None:
    # Deleting the namespace deletes eth0 and with it the host-side peer.
    if link_exists(veth_name(name)):
        run(["ip", "link", "del", veth_name(name)], check=False)
    if (NETNS_DIR / netns_name(name)).exists():
        run(["ip", "netns", "del", netns_name(name)])


def lab_netns() -> list[str]:
    """Machine names whose namespace exists (named opsctl-<machine>)."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name.removeprefix("opsctl-") for p in NETNS_DIR.iterdir() if p.name.startswith("opsctl-"))


def remove_bridge() -> None:
    if link_exists(BRIDGE):
        run(["ip", "link", "del", BRIDGE])
    while guard_route_present():
        run(["ip", "route", "del", "unreachable", SUBNET, "metric", "9999"])
