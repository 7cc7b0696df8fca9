"""Emulated `ib_write_bw` (perftest). As the real one: started without a host it waits for a client;
with a host it connects to the server there (TCP port 18515, perftest's default), both print the
test header and the result. The result follows the lab fabric model (fabric_model.py) from both
machines' hardware state, so a fault on either end shows.

    ib_write_bw -d mlx5_0 --report_gbits            # on gpu2
    ib_write_bw -d mlx5_0 --report_gbits gpu2       # on gpu1

Output format: tests/fixtures/infiniband/ib_write_bw_ib_read_bw_cx7_ndr_b2b_client.txt (--report_gbits).
"""

import argparse
import json
import socket
import sys

from opsctl_lab.hardware import COMPUTE_HCAS, hca_name, stable_int
from opsctl_lab.hwtools.common import load, main_guard
from opsctl_lab.hwtools.fabric_model import PortView, bandwidth_gbps

DEFAULT_PORT = 18515
DASH = "-" * 87


def header(device: str, link_type: str, port: PortView, peer: PortView) -> str:
    def addr(view: PortView) -> str:
        seed = (view.node, view.hca)
        # perftest's printf formats: LID %#04x, QPN %#06x, PSN %#08x, VAddr %#016llx.
        return (f"LID {stable_int(*seed, 'lid', modulo=0xfe) + 1:#04x}"
                f" QPN {stable_int(*seed, 'qpn', modulo=0xffff):#06x}"
                f" PSN {stable_int(*seed, 'psn', modulo=0xffffff):#08x} RKey 0x1fff00"
                f" VAddr {stable_int(*seed, 'va', modulo=1 << 44):#016x}")

    return (f"{DASH}\n                    RDMA_Write BW Test\n"
            f" Dual-port       : OFF\t\tDevice         : {device}\n"
            " Number of qps   : 1\t\tTransport type : IB\n"
            " Connection type : RC\t\tUsing SRQ      : OFF\n"
            " PCIe relax order: ON\t\tLock-free      : OFF\n"
            " ibv_wr* API     : ON\t\tUsing Enhanced Reorder      : OFF\n"
            " TX depth        : 128\n CQ Moderation   : 1\n CQE Poll Batch  : Dynamic\n"
            " Mtu             : 4096[B]\n"
            f" Link type       : {link_type}\n Max inline data : 0[B]\n rdma_cm QPs\t : OFF\n"
            " Data ex. method : Ethernet\n"
            f"{DASH}\n local address: {addr(port)}\n remote address: {addr(peer)}\n{DASH}\n")


def result(size: int, iterations: int, peak: float, average: float) -> str:
    msg_rate = average * 1e9 / 8 / size / 1e6
    return (" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
            f" {size:<10} {iterations:<16} {peak:.2f}             {average:.2f} \t\t     {msg_rate:.6f}\n{DASH}\n")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ib_write_bw", add_help=True)
    p.add_argument("-d", "--ib-dev", default=COMPUTE_HCAS[0])
    p.add_argument("-p", "--port", type=int, default=DEFAULT_PORT)
    p.add_argument("-s", "--size", type=int, default=65536)
    p.add_argument("-n", "--iters", type=int, default=5000)
    p.add_argument("-D", "--duration", type=int, default=None)
    p.add_argument("-F", "--CPU-freq", action="store_true")
    p.add_argument("--report_gbits", action="store_true")
    p.add_argument("host", nargs="?")
    return p


def _exchange(conn: socket.socket, mine: PortView) -> PortView:
    conn.sendall((json.dumps(mine.to_dict()) + "\n").encode())
    line = conn.makefile("r").readline()
    if not line:
        raise ConnectionError("peer closed the connection")
    return PortView(**json.loads(line))


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    hw = load()
    device = hca_name(args.ib_dev) if args.ib_dev.isdigit() else args.ib_dev
    if device not in COMPUTE_HCAS:
        sys.stderr.write(f" Couldn't find device {args.ib_dev}\n Unable to find the Infiniband/RoCE device\n")
        return 1
    mine = PortView.of(hw, device)
    if not mine.active:
        sys.stderr.write(" Port number 1 state is Down\n Couldn't set the link layer\n"
                         " Couldn't get context for the device\n")
        return 1
    if args.host:
        try:
            conn = socket.create_connection((args.host, args.port), timeout=10)
        except OSError:
            sys.stderr.write(f"Couldn't connect to {args.host}:{args.port}\n"
                             " Unable to open file descriptor for socket connection\n")
            return 1
    else:
        with socket.create_server(("0.0.0.0", args.port)) as server:
            # Listening before the banner: a client started on seeing it always finds the server.
            sys.stdout.write("\n************************************\n* Waiting for client to connect... *\n"
                             "************************************\n")
            sys.stdout.flush()
            conn, _ = server.accept()
    with conn:
        peer = _exchange(conn, mine)
    peak, average = bandwidth_gbps(mine, peer)
    if average == 0:
        sys.stderr.write(" Completion with error at client\n Failed status 12: wr_id 0 syndrom 0x81\n")
        return 1
    size = args.size
    iterations = args.iters
    scale = 1.0 if args.report_gbits else 1000.0 / 8 / 1.048576  # MB/sec as perftest prints without the flag
    out = header(device, "IB", mine, peer) + result(size, iterations, peak * scale, average * scale)
    if not args.report_gbits:
        out = out.replace("[Gb/sec]", "[MB/sec]")
    sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main_guard(main))
