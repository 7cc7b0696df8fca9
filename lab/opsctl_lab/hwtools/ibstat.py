"""Emulated `ibstat` (infiniband-diags), reading the machine's sysfs InfiniBand tree.

Output (tab-indented) as on a real ConnectX-7 host (tests/fixtures/infiniband/gpud_ibstat.47.0.h100.all.active.0.txt):

    CA 'mlx5_0'
        CA type: MT4129
        Number of ports: 1
        Firmware version: 28.41.1000
        Hardware version: 0
        Node GUID: 0xa088c20300e3142a
        System image GUID: 0xa088c20300e3142a
        Port 1:
            State: Active
            Physical state: LinkUp
            Rate: 400
            Base lid: 0
            LMC: 0
            SM lid: 0
            Capability mask: 0x00010000
            Port GUID: 0xa288c2fffee3142a
            Link layer: Ethernet

Forms: `ibstat`, `ibstat -l` (CA names), `ibstat CA [PORT]`.
"""

import sys

from opsctl_lab.hwtools.common import fresh_sysfs, main_guard
from opsctl_lab.hwtools.sysfs_read import DeviceInfo, PortInfo, devices, guid_hex

STATES = {"1": "Down", "2": "Initializing", "3": "Armed", "4": "Active"}
PHYS = {"1": "Sleep", "2": "Polling", "3": "Disabled", "4": "PortConfigurationTraining", "5": "LinkUp",
        "6": "LinkErrorRecovery", "7": "Phy Test"}


def port_guid(dev: DeviceInfo, port: PortInfo) -> str:
    if port["link_layer"] == "Ethernet":
        # RoCE ports: the GID-derived GUID, as in the real capture (0xa088c203.. -> 0xa288c2fffe..).
        raw = dev["node_guid"].replace(":", "")
        return f"0x{int(raw[0:2], 16) | 0x02:02x}{raw[2:6]}fffe{raw[10:16]}"
    return guid_hex(dev["node_guid"])


def render_ca(dev: DeviceInfo, only_port: int | None = None) -> str:
    guid = guid_hex(dev["node_guid"])
    lines = [f"CA '{dev['name']}'", f"\tCA type: {dev['hca_type']}", f"\tNumber of ports: {len(dev['ports'])}",
             f"\tFirmware version: {dev['fw_ver']}", "\tHardware version: 0", f"\tNode GUID: {guid}",
             f"\tSystem image GUID: {guid}"]
    for port in dev["ports"]:
        if only_port is not None and port["port"] != only_port:
            continue
        lines += [f"\tPort {port['port']}:",
                  f"\t\tState: {STATES.get(port['state'].split(':')[0], 'Unknown')}",
                  f"\t\tPhysical state: {PHYS.get(port['phys_state'].split(':')[0], 'Unknown')}",
                  f"\t\tRate: {port['rate'].split()[0]}",
                  f"\t\tBase lid: {port['lid']}", "\t\tLMC: 0", f"\t\tSM lid: {port['sm_lid']}",
                  f"\t\tCapability mask: {port['cap_mask']}",
                  f"\t\tPort GUID: {port_guid(dev, port)}",
                  f"\t\tLink layer: {port['link_layer']}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    devs = devices(fresh_sysfs())
    if argv[:1] in (["-l"], ["--list_of_cas"]):
        sys.stdout.write("".join(f"{d['name']}\n" for d in devs))
        return 0
    if argv:
        match = [d for d in devs if d["name"] == argv[0]]
        if not match:
            sys.stderr.write(f"ibpanic: [{__import__('os').getpid()}] main: '{argv[0]}' IB device can't be found: "
                             "No such file or directory\n")
            return 255
        port = int(argv[1]) if len(argv) > 1 and argv[1].isdigit() else None
        sys.stdout.write(render_ca(match[0], port))
        return 0
    sys.stdout.write("".join(render_ca(d) for d in devs))
    return 0


if __name__ == "__main__":
    sys.exit(main_guard(main))
