"""The node-local InfiniBand precheck: what the HCAs report, judged against a hardware profile.

A `Snapshot` is what one source could tell: the live sysfs tree (everything), or a capture (an
`ibstat` or `ibv_devinfo` output, a copied sysfs tree), which lacks some facts: a check whose facts
the source does not hold is listed as skipped with the reason, never passed. `judge` is pure: the
command reads the hardware (opsctl.ib.collect) and renders the report.

Check names are stable (JSON, the node-check metrics and docs/infiniband.md use them):
hca-count, link-layer, port-state, link-rate, firmware, pcie-link, error-counters, kernel-modules.
"""

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from opsctl.ib.pcie import PcieLinkStatus

CHECKS = ("hca-count", "link-layer", "port-state", "link-rate", "firmware", "pcie-link", "error-counters",
          "kernel-modules")
# The port counters that must not rise (sysfs names under ports/N/counters/).
ERROR_COUNTERS = ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors",
                  "port_rcv_remote_physical_errors", "local_link_integrity_errors",
                  "excessive_buffer_overrun_errors", "port_xmit_discards")


@dataclass(frozen=True)
class Profile:
    """What a node of one hardware design must show. `devices` is a regular expression (fully
    anchored, as PromQL's =~) naming the compute HCAs ("": none); others (storage, Ethernet) are not judged."""

    name: str
    devices: str
    hca_count: int
    rate_gbps: float
    rate_text: str  # sysfs wording, e.g. "400 Gb/sec (4X NDR)"
    pcie_speed_gts: float
    pcie_width: int
    modules: tuple[str, ...]
    firmware: str | None = None  # the pinned version, when the site sets one


def h200_ndr(devices: str = "mlx5_[0-7]", firmware: str | None = None) -> Profile:
    """An HGX H200 node: 8 ConnectX-7 NDR compute rails on PCIe Gen5 x16, GPUDirect RDMA loaded."""
    return Profile(name="h200-ndr", devices=devices, hca_count=8, rate_gbps=400.0, rate_text="400 Gb/sec (4X NDR)",
                   pcie_speed_gts=32.0, pcie_width=16, modules=("nvidia_peermem",), firmware=firmware)


PROFILES = {"h200-ndr": h200_ndr}


@dataclass
class Port:
    """One HCA port in the words every source can be mapped to. None: the source does not say."""

    device: str
    port: int
    link_layer: str | None
    state: str | None  # DOWN, INIT, ARMED, ACTIVE
    phys_state: str | None  # LinkUp, Polling, Disabled, ...
    rate_gbps: float | None
    rate_text: str | None
    firmware: str | None
    pcie: PcieLinkStatus | None = None
    counters: dict[str, int] | None = None


@dataclass
class Snapshot:
    source: str  # "sysfs /sys", "ibstat capture FILE", ...
    ports: list[Port]
    modules: set[str] | None = None  # loaded kernel modules; None: the source does not say
    has_pcie: bool = False


@dataclass(frozen=True)
class Finding:
    check: str
    device: str  # "" for a finding about the node
    detail: str


@dataclass(frozen=True)
class RailChoice:
    """The HCAs a report judges and how they were found: "pinned" (ib.rails) or "discovered"
    (opsctl.ib.rails, on what `basis`), with why each other HCA is no rail."""

    source: str
    devices: tuple[str, ...]
    not_rails: dict[str, str] = field(default_factory=dict)
    basis: str = ""
    watched: tuple[str, ...] = ()  # ib.rails: the HCAs the health rules and fabric-test use


@dataclass
class Report:
    profile: str
    source: str
    ports: list[Port]
    findings: list[Finding] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # check -> why it could not be made
    window_seconds: float = 0.0
    rails: RailChoice | None = None

    @property
    def passed(self) -> bool:
        return not self.findings

    def failed_checks(self, device: str) -> list[str]:
        return sorted({f.check for f in self.findings if f.device == device})


def compute_ports(snapshot: Snapshot, profile: Profile) -> list[Port]:
    """The ports the profile judges: named by it and not Ethernet (a storage or RoCE port)."""
    names = re.compile(profile.devices)
    return [p for p in snapshot.ports if names.fullmatch(p.device) and p.link_layer != "Ethernet"]


def judge(snapshot: Snapshot, profile: Profile, later: Snapshot | None = None, window_seconds: float = 0.0) -> Report:
    """The report of `snapshot`; with `later` (the same source after the window), rising error counters too."""
    ports = compute_ports(snapshot, profile)
    report = Report(profile=profile.name, source=snapshot.source, ports=ports, window_seconds=window_seconds)
    add = report.findings.append
    named = [p for p in snapshot.ports if re.fullmatch(profile.devices, p.device)]
    for port in named:
        if port.link_layer == "Ethernet":
            add(Finding("link-layer", port.device, "link layer Ethernet, expected InfiniBand"))
    if len(ports) != profile.hca_count:
        matching = f" matching {profile.devices}" if profile.devices else ""
        add(Finding("hca-count", "", f"{len(ports)} InfiniBand compute HCAs ({_names(ports)}), expected "
                                     f"{profile.hca_count}{matching}"))
    for port in ports:
        _judge_port(port, profile, add)
        if snapshot.has_pcie and port.pcie is None:
            add(Finding("pcie-link", port.device, "no PCI device behind the HCA in sysfs"))
    _judge_firmware(ports, profile, add)
    if not snapshot.has_pcie:
        report.skipped["pcie-link"] = f"{snapshot.source} has no PCIe link"
    if snapshot.modules is None:
        report.skipped["kernel-modules"] = f"{snapshot.source} has no module list"
    else:
        for module in profile.modules:
            if module not in snapshot.modules:
                add(Finding("kernel-modules", "", f"{module} not loaded (GPUDirect RDMA needs it)"))
    if later is None:
        report.skipped["error-counters"] = (f"{snapshot.source} is one capture, no window"
                                            if any(p.counters is None for p in ports) or not ports
                                            else "no sampling window")
    else:
        _judge_counters(ports, {(p.device, p.port): p for p in later.ports}, window_seconds, add)
    if any(p.rate_gbps is None for p in ports):
        report.skipped["link-rate"] = f"{snapshot.source} has no link rate"
    return report


def _names(ports: list[Port]) -> str:
    return ", ".join(p.device for p in ports) or "none"


def _judge_port(port: Port, profile: Profile, add: Callable[[Finding], None]) -> None:
    if port.state is not None and port.state != "ACTIVE":
        add(Finding("port-state", port.device, f"state {port.state}, expected ACTIVE"))
    if port.phys_state is not None and port.phys_state != "LinkUp":
        add(Finding("port-state", port.device, f"physical state {port.phys_state}, expected LinkUp"))
    if port.rate_gbps is not None and (port.rate_gbps != profile.rate_gbps or
                                       (port.rate_text is not None and port.rate_text != profile.rate_text)):
        add(Finding("link-rate", port.device, f"{port.rate_text or f'{port.rate_gbps:g} Gb/sec'}, "
                                              f"expected {profile.rate_text}"))
    if port.pcie is not None:
        link = port.pcie.current
        if (link.speed_gts, link.width) != (profile.pcie_speed_gts, profile.pcie_width):
            add(Finding("pcie-link", port.device, f"PCIe {link.speed_gts:g} GT/s x{link.width} at "
                                                  f"{port.pcie.address}, expected {profile.pcie_speed_gts:g} GT/s "
                                                  f"x{profile.pcie_width}"))


def _judge_firmware(ports: list[Port], profile: Profile, add: Callable[[Finding], None]) -> None:
    versions = Counter(p.firmware for p in ports if p.firmware)
    if profile.firmware is not None:
        for port in ports:
            if port.firmware and port.firmware != profile.firmware:
                add(Finding("firmware", port.device, f"firmware {port.firmware}, pinned {profile.firmware}"))
    elif len(versions) > 1:
        # The version most HCAs run is the reference; on a tie the newest-looking one is not guessed:
        # every HCA off the first most common version is named, and the detail lists them all.
        common = versions.most_common(1)[0][0]
        for port in ports:
            if port.firmware and port.firmware != common:
                add(Finding("firmware", port.device, f"firmware {port.firmware}, the other HCAs run {common}"))


def _judge_counters(ports: list[Port], later: dict[tuple[str, int], Port], window: float,
                    add: Callable[[Finding], None]) -> None:
    for port in ports:
        after = later.get((port.device, port.port))
        if after is None or port.counters is None or after.counters is None:
            add(Finding("error-counters", port.device, "the port's counters vanished during the window"))
            continue
        risen = [f"{name} +{after.counters[name] - port.counters[name]}" for name in ERROR_COUNTERS
                 if name in port.counters and name in after.counters and after.counters[name] > port.counters[name]]
        if risen:
            add(Finding("error-counters", port.device, f"{', '.join(risen)} in {window:g}s"))
