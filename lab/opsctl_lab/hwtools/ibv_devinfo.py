"""Emulated `ibv_devinfo` (rdma-core ibverbs-utils), reading the machine's sysfs InfiniBand tree.

Layout follows rdma-core's libibverbs/examples/devinfo.c (tabs as printed there):

    hca_id:    mlx5_0
        transport:            InfiniBand (0)
        fw_ver:                28.41.1000
        node_guid:            a088:c203:00e3:142a
        ...
            port:    1
                state:            PORT_ACTIVE (4)

Forms: `ibv_devinfo`, `ibv_devinfo -d DEV`, `ibv_devinfo -l`.
"""

import sys

from opsctl_lab.hwtools.common import fresh_sysfs, main_guard
from opsctl_lab.hwtools.sysfs_read import DeviceInfo, devices

PORT_STATES = {"0": "PORT_NOP", "1": "PORT_DOWN", "2": "PORT_INIT", "3": "PORT_ARMED", "4": "PORT_ACTIVE",
               "5": "PORT_ACTIVE_DEFER"}
MELLANOX_VENDOR = 0x02C9


def render_dev(dev: DeviceInfo) -> str:
    part = int(dev["hca_type"].removeprefix("MT")) if dev["hca_type"].startswith("MT") else 0
    lines = [f"hca_id:\t{dev['name']}", "\ttransport:\t\t\tInfiniBand (0)", f"\tfw_ver:\t\t\t\t{dev['fw_ver']}",
             f"\tnode_guid:\t\t\t{dev['node_guid']}", f"\tsys_image_guid:\t\t\t{dev['node_guid']}",
             f"\tvendor_id:\t\t\t0x{MELLANOX_VENDOR:04x}", f"\tvendor_part_id:\t\t\t{part}",
             "\thw_ver:\t\t\t\t0x0", f"\tboard_id:\t\t\t{dev['board_id']}",
             f"\tphys_port_cnt:\t\t\t{len(dev['ports'])}"]
    for port in dev["ports"]:
        code = port["state"].split(":")[0]
        lines += [f"\t\tport:\t{port['port']}",
                  f"\t\t\tstate:\t\t\t{PORT_STATES.get(code, 'invalid state')} ({code})",
                  "\t\t\tmax_mtu:\t\t4096 (5)", "\t\t\tactive_mtu:\t\t4096 (5)",
                  f"\t\t\tsm_lid:\t\t\t{port['sm_lid']}", f"\t\t\tport_lid:\t\t{port['lid']}",
                  "\t\t\tport_lmc:\t\t0x00", f"\t\t\tlink_layer:\t\t{port['link_layer']}"]
    return "\n".join(lines) + "\n\n"


def main(argv: list[str]) -> int:
    devs = devices(fresh_sysfs())
    if argv[:1] in (["-l"], ["--list"]):
        sys.stdout.write(f"{len(devs)} HCAs found:\n" + "".join(f"\t{d['name']}\n" for d in devs))
        return 0
    if argv[:1] in (["-d"], ["--ib-dev"]) and len(argv) > 1:
        devs = [d for d in devs if d["name"] == argv[1]]
        if not devs:
            sys.stderr.write(f"IB device '{argv[1]}' wasn't found\n")
            return 255
    elif argv:
        sys.stderr.write(f"ibv_devinfo: unsupported arguments: {' '.join(argv)}\n")
        return 255
    if not devs:
        sys.stderr.write("No IB devices found\n")
        return 255
    sys.stdout.write("".join(render_dev(d) for d in devs))
    return 0


if __name__ == "__main__":
    sys.exit(main_guard(main))
