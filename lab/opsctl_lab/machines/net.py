"""The lab network: one bridge on the host, one network namespace per machine joined to it by a veth
pair, and a guard route.

No machine gets a default route and the host does no NAT, so a machine reaches only the lab subnet.
The guard route (`unreachable <subnet> metric 9999`) stays while the lab exists: if the bridge goes
away, traffic for the subnet is refused on this host instead of following the host's default route.
"""

from pathlib import Path

from opsctl_lab.machines.settings import PREFIX_LEN, Settings
from opsctl_lab.processes import run

NETNS_DIR = Path("/run/netns")


def link_exists(name: str) -> bool:
    return run(["ip", "link", "show", "dev", name], check=False).returncode == 0


def guard_route_present(settings: Settings) -> bool:
    out = run(["ip", "route", "show", "type", "unreachable", settings.subnet]).stdout
    return "metric 9999" in out


def ensure_bridge(settings: Settings) -> None:
    if not guard_route_present(settings):
        run(["ip", "route", "add", "unreachable", settings.subnet, "metric", "9999"])
    if not link_exists(settings.bridge):
        run(["ip", "link", "add", settings.bridge, "type", "bridge"])
    addrs = run(["ip", "-o", "-4", "addr", "show", "dev", settings.bridge]).stdout
    if f"{settings.bridge_addr}/{PREFIX_LEN}" not in addrs:
        run(["ip", "addr", "add", f"{settings.bridge_addr}/{PREFIX_LEN}", "dev", settings.bridge])
    run(["ip", "link", "set", settings.bridge, "up"])


def ensure_machine_netns(settings: Settings, name: str) -> None:
    """netns with lo up and eth0 = the machine's address, its peer on the bridge. Idempotent."""
    ns, veth, addr = settings.netns(name), settings.veth(name), f"{settings.addr(name)}/{PREFIX_LEN}"
    if not (NETNS_DIR / ns).exists():
        run(["ip", "netns", "add", ns])
    if not link_exists(veth):
        run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
    run(["ip", "link", "set", veth, "master", settings.bridge, "up"])
    run(["ip", "-n", ns, "link", "set", "lo", "up"])
    if addr not in run(["ip", "-n", ns, "-o", "-4", "addr", "show", "dev", "eth0"]).stdout:
        run(["ip", "-n", ns, "addr", "add", addr, "dev", "eth0"])
    run(["ip", "-n", ns, "link", "set", "eth0", "up"])


def remove_machine_netns(settings: Settings, name: str) -> None:
    # Deleting the namespace deletes eth0 and with it the host-side peer.
    if link_exists(settings.veth(name)):
        run(["ip", "link", "del", settings.veth(name)], check=False)
    if (NETNS_DIR / settings.netns(name)).exists():
        run(["ip", "netns", "del", settings.netns(name)])


def lab_netns(settings: Settings) -> list[str]:
    """Machine names whose namespace exists in this lab."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name.removeprefix(settings.prefix) for p in NETNS_DIR.iterdir()
                  if p.name.startswith(settings.prefix))


def remove_bridge(settings: Settings) -> None:
    if link_exists(settings.bridge):
        run(["ip", "link", "del", settings.bridge])
    while guard_route_present(settings):
        run(["ip", "route", "del", "unreachable", settings.subnet, "metric", "9999"])
