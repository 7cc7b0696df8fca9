"""Emulated `ibnetdiscover` (rdma-core infiniband-diags): the topology of the rail the local HCA is on, in
the lab's fabric (opsctl_lab.fabric), printed as infiniband-diags/ibnetdiscover.c prints it.

    ibnetdiscover -C mlx5_3 -P 1        # rail 3's fabric, as this host's mlx5_3 finds it
    ibnetdiscover -C mlx5_3 -P 1 FILE   # the same, written to FILE
    ibnetdiscover -l | -H | -S | -R     # the node lists (list_node)

A real capture of a QM9701 NDR fabric (tests/fixtures/infiniband/ibnetdiscover-topograph-ndr-rail-optimised.txt):

    #
    # Topology file: generated on Wed Aug  6 16:11:23 2025
    #
    # Initiated from node e09d730300156ff6 port e09d730300156ff6

    vendid=0x2c9
    devid=0xd2f2
    sysimgguid=0x2c5eab0300b87b40
    switchguid=0x2c5eab0300b87b40(2c5eab0300b87b40)
    Switch	65 "S-2c5eab0300b87b40"		# "MF0;A09-P1-IBLEAF-04-04:MQM9701/U1" enhanced port 0 lid 73 lmc 0
    [1]	"H-e09d7303007a4bd8"[1](e09d7303007a4bd8) 		# "a08-p1-dgx-04-c01 mlx5_5" lid 647 4xNDR
    [35]	"S-2c5eab0300c26280"[32]		# "MF0;A10-P1-IBSPINE-02:MQM9701/U1" lid 236 4xNDR
    ...
    vendid=0x2c9
    devid=0x1021
    sysimgguid=0xe09d730300156ff6
    caguid=0xe09d730300156ff6
    Ca	1 "H-e09d730300156ff6"		# "b05-p1-dgx-05-c08 HCA-6"
    [1](e09d730300156ff6) 	"S-2c5eab0300c26480"[8]		# lid 246 lmc 0 "MF0;B09-P1-IBLEAF-04-05:MQM9701/U1" lid 119 ...

Switches first, then CAs, each list in the reverse of the order libibnetdisc discovered them (it prepends to
its lists): a breadth-first walk from the local port, each switch's ports in order. A local port whose link
is down finds only itself (the Ca block, no port line: ibnetdiscover-topograph-gb200-lone-ca.txt beside the other).

Which host this is: OPSCTL_HW_NODE, else the hostname; a cluster node reads its own hardware state, the
head (the fabric's `head`) has healthy HCAs on the spines. The fabric: OPSCTL_HW_FABRIC (its state file,
opsctl_lab.fabric.FabricState). Options as the real tool's (getopt_long over ibdiag's table): -C/-P choose
the local port; an unknown option prints the usage and exits 2; -f, -p, -g, -m and the cache and diff
options, which the lab does not emulate, are refused in one line (exit 2).
"""

import getopt
import os
import socket
import sys
import time
from collections import deque
from pathlib import Path

from opsctl_lab.errors import LabError
from opsctl_lab.fabric import FabricNode, FabricState, HostHca, RailFabric, head_hcas, host_hcas, rail_fabric
from opsctl_lab.hardware import RAILS, NodeHardware
from opsctl_lab.hwtools.common import main_guard
from opsctl_lab.installed_tools import HW_FABRIC_STATE

PROG = "ibnetdiscover"
# (long name, letter or None, argument template or None, description): ibnetdiscover.c's opts, then the
# common ones of ibdiag_common.c less those it excludes ("DGKLs").
OPTIONS = [
    ("full", "f", None, "show full information (ports' speed and width, vlcap)"),
    ("show", "s", None, "show more information"),
    ("list", "l", None, "list of connected nodes"),
    ("grouping", "g", None, "show grouping"),
    ("Hca_list", "H", None, "list of connected CAs"),
    ("Switch_list", "S", None, "list of connected switches"),
    ("Router_list", "R", None, "list of connected routers"),
    ("node-name-map", None, "<file>", "node name map file"),
    ("cache", None, "<file>", "filename to cache ibnetdiscover data to"),
    ("load-cache", None, "<file>", "filename of ibnetdiscover cache to load"),
    ("diff", None, "<file>", "filename of ibnetdiscover cache to diff"),
    ("diffcheck", None, "<key(s)>", "specify checks to execute for --diff"),
    ("ports", "p", None, "obtain a ports report"),
    ("max_hops", "m", None, "report max hops discovered by the library"),
    ("outstanding_smps", "o", "<val>", "specify the number of outstanding SMP's which should be issued during "
     "the scan"),
    ("config", "z", "<config>", "use config file, default: /etc/infiniband-diags/ibdiag.conf"),
    ("Ca", "C", "<ca>", "Ca name to use"),
    ("Port", "P", "<port>", "Ca port number to use"),
    ("timeout", "t", "<ms>", "timeout in ms"),
    ("m_key", "y", "<key>", "M_Key to use in request"),
    ("pkey-idx", "Y", "<idx>", "P_Key table index for outgoing SA/GMP MADs (default 0)"),
    ("errors", "e", None, "show send and receive errors"),
    ("verbose", "v", None, "increase verbosity level"),
    ("debug", "d", None, "raise debug level"),
    ("help", "h", None, "help message"),
    ("version", "V", None, "show version"),
]
NOT_EMULATED = {"-f", "--full", "--node-name-map", "--cache", "--load-cache", "--diff", "--diffcheck", "-p", "--ports",
                "-g",                "--grouping", "-m", "--max_hops"}
LISTS = {"-l": ("switch", "ca"), "--list": ("switch", "ca"), "-H": ("ca",), "--Hca_list": ("ca",),
         "-S": ("switch",), "--Switch_list": ("switch",), "-R": (), "--Router_list": ()}
VERSION = "5.0.0"  # rdma-core 50.0, Debian 13's and DOCA-OFED's generation
LINK = "4xNDR"  # every lab link: 4 lanes of NDR


class UsageError(Exception):
    """An option getopt_long refuses: the message glibc prints, then the usage, exit 2."""


def usage() -> str:
    lines = [f"\nUsage: {PROG} [options] [topology-file]\n", "Options:"]
    for name, letter, arg, description in OPTIONS:
        head = f"  --{name}" + (f", -{letter}" if letter else "") + (f" {arg}" if arg else "")
        lines.append(f"{head}{' ' * max(0, 24 - len(head))}  {description}")
    return "\n".join(lines) + "\n\n"


def parse_args(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """getopt_long's reading of argv (options anywhere, as glibc permutes them): {option: value}, operands."""
    short = "".join(f"{letter}{':' if arg else ''}" for _, letter, arg, _ in OPTIONS if letter)
    longs = [f"{name}{'=' if arg else ''}" for name, _, arg, _ in OPTIONS]
    try:
        pairs, operands = getopt.gnu_getopt(argv, short, longs)
    except getopt.GetoptError as err:
        raise UsageError(_glibc_message(err, argv)) from err
    return {opt: value for opt, value in pairs}, operands


def _glibc_message(err: getopt.GetoptError, argv: list[str]) -> str:
    opt = err.opt
    if len(opt) == 1:  # a short option
        if "requires argument" in err.msg:
            return f"{PROG}: option requires an argument -- '{opt}'"
        return f"{PROG}: invalid option -- '{opt}'"
    if "requires argument" in err.msg:
        return f"{PROG}: option '--{opt}' requires an argument"
    given = next((a for a in argv if a.startswith(f"--{opt}")), f"--{opt}")
    return f"{PROG}: unrecognized option '{given}'"


# ---- the walk ---------------------------------------------------------------------------------------


def discovery_order(fabric: RailFabric, start: int) -> list[int]:
    """GUIDs in the order libibnetdisc finds them: breadth first from the local CA, a switch's ports in
    order; a CA other than the local one is not walked through (it answers, it does not forward)."""
    found, queue = [start], deque([start])
    while queue:
        node = fabric.nodes[queue.popleft()]
        if node.kind != "switch" and node.guid != start:
            continue
        for port in sorted(node.links):
            peer, _ = node.links[port]
            if peer not in found:
                found.append(peer)
                queue.append(peer)
    return found


def _guid16(guid: int) -> str:
    return f"{guid:016x}"


def _name(node: FabricNode) -> str:
    return f'"{"S" if node.kind == "switch" else "H"}-{_guid16(node.guid)}"'


def _ids(node: FabricNode) -> list[str]:
    return ["", f"vendid=0x{0x2c9:x}", f"devid=0x{node.devid:x}", f"sysimgguid=0x{node.sysimgguid:x}"]


def render(fabric: RailFabric, start: int, generated: float) -> str:
    """The topology file ibnetdiscover writes (dump_topology, without grouping)."""
    order = discovery_order(fabric, start)
    nodes = [fabric.nodes[guid] for guid in reversed(order)]
    lines = ["#", f"# Topology file: generated on {time.ctime(generated)}", "#",
             f"# Initiated from node {_guid16(start)} port {_guid16(start)}"]
    for node in (n for n in nodes if n.kind == "switch"):
        lines += [*_ids(node), f"switchguid=0x{node.guid:x}({node.guid:x})",
                  f'Switch\t{node.ports} {_name(node)}\t\t# "{node.desc}" enhanced port 0 lid {node.lid} lmc 0']
        for port in sorted(node.links):
            peer = fabric.nodes[node.links[port][0]]
            remote = f"{_name(peer)}[{node.links[port][1]}]" + (f"({peer.guid:x}) " if peer.kind == "ca" else "")
            lines.append(f'[{port}]\t{remote}\t\t# "{peer.desc}" lid {peer.lid} {LINK}')
    for node in (n for n in nodes if n.kind == "ca"):
        lines += [*_ids(node), f"caguid=0x{node.guid:x}", f'Ca\t{node.ports} {_name(node)}\t\t# "{node.desc}"']
        for port in sorted(node.links):
            peer = fabric.nodes[node.links[port][0]]
            remote = f"{_name(peer)}[{node.links[port][1]}]" + (f" ({peer.guid:x}) " if peer.kind == "ca" else "")
            lines.append(f'[{port}]({node.guid:x}) \t{remote}\t\t# lid {node.lid} lmc 0 "{peer.desc}" '
                         f"lid {peer.lid} {LINK}")
    return "\n".join(lines) + "\n"


def render_list(fabric: RailFabric, start: int, kinds: tuple[str, ...]) -> str:
    """`-l`, `-H`, `-S`, `-R` (list_node): CAs first, then switches."""
    order = [fabric.nodes[guid] for guid in reversed(discovery_order(fabric, start))]
    out = []
    for kind in ("ca", "switch"):
        if kind in kinds:
            for node in (n for n in order if n.kind == kind):
                out.append(f"{'Switch' if kind == 'switch' else 'Ca'}\t : 0x{_guid16(node.guid)} ports {node.ports} "
                           f'devid 0x{node.devid:x} vendid 0x2c9 "{node.desc}"')
    return "".join(line + "\n" for line in out)


# ---- this host --------------------------------------------------------------------------------------


def local_hcas(state: FabricState, host: str) -> tuple[list[HostHca], list[NodeHardware] | None]:
    """This host's rails, and the nodes' states when this host is one of them (read once)."""
    if host == state.head:
        return head_hcas(host), None
    if host not in state.nodes:
        raise LabError(f"{host} is not on the lab fabric (its hosts: {state.head}, {', '.join(state.nodes)})")
    nodes = state.node_states()
    return host_hcas(nodes[state.nodes.index(host)]), nodes


def choose_port(hcas: list[HostHca], ca: str | None, port: int) -> HostHca | None:
    """libibumad's choice: the named CA (its port 1 only: a ConnectX-7 rail has one), else the first HCA whose
    port is active, else the first whose link is up. None: no such port."""
    if ca is not None:
        match = [h for h in hcas if h.hca == ca]
        return match[0] if match and port in (0, 1) else None
    if port not in (0, 1):
        return None
    return next((h for h in hcas if h.up and h.lid), next((h for h in hcas if h.up), None))


def rail_of(hca: HostHca) -> int:
    """The rail whose fabric the HCA's cable reaches."""
    return (hca.rail + 1) % RAILS if hca.to_next_rail else hca.rail


def _cannot_open(ca: str | None, port: int) -> int:
    sys.stderr.write(f"ibwarn: [{os.getpid()}] mad_rpc_open_port2: can't open UMAD port ({ca or '(null)'}:{port})\n"
                     f"../libibnetdisc/ibnetdisc.c:799; can't open MAD port ({ca or '(null)'}:{port})\n")
    sys.stdout.write(f"{PROG}: iberror: failed: discover failed\n\n")
    return 255


def main(argv: list[str]) -> int:
    try:
        opts, operands = parse_args(argv)
    except UsageError as err:
        sys.stderr.write(f"{err}\n{usage()}")
        return 2
    if "-h" in opts or "--help" in opts:
        sys.stderr.write(usage())
        return 2
    if "-V" in opts or "--version" in opts:
        sys.stderr.write(f"{PROG} {VERSION}\n")
        return 0
    refused = sorted(NOT_EMULATED & set(opts))
    if refused:
        sys.stderr.write(f"{PROG}: {refused[0]} is not emulated by the opsctl lab\n")
        return 2
    ca = opts.get("-C", opts.get("--Ca"))
    port_text = opts.get("-P", opts.get("--Port", "0"))
    port = int(port_text, 0) if port_text.isdigit() else 0
    state = FabricState.load(Path(os.environ.get("OPSCTL_HW_FABRIC") or HW_FABRIC_STATE))
    host = os.environ.get("OPSCTL_HW_NODE") or socket.gethostname()
    hcas, nodes = local_hcas(state, host)
    local = choose_port(hcas, ca, port)
    if local is None:
        return _cannot_open(ca, port)
    fabric = rail_fabric(state, rail_of(local), nodes)
    if local.guid not in fabric.nodes:  # its link is down: the walk finds the local CA alone
        fabric.add(FabricNode("ca", local.guid, f"{local.host} {local.hca}", local.lid, 1, 0x1021, local.guid))
    kinds = next((LISTS[o] for o in opts if o in LISTS), None)
    text = render_list(fabric, local.guid, kinds) if kinds is not None else render(fabric, local.guid, time.time())
    if operands:
        Path(operands[0]).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main_guard(main))
