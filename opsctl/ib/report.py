"""One node's InfiniBand report, as `opsctl ib check` and `opsctl node check` make and print it."""

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from opsctl.config.rails import regex_of
from opsctl.config.schema import IbConfig
from opsctl.ib.check import PROFILES, Port, RailChoice, Report, Snapshot, judge
from opsctl.ib.collect import capture_snapshot, live_snapshot
from opsctl.ib.rails import discover_rails, read_pci_tree


def check_report(config: IbConfig, profile_name: str | None, from_path: str | None, window: float | None,
                 sysfs_root: str | None) -> Report:
    """The report of one node (or of a capture, `from_path`): live, over the counter window when it is > 0.
    The rails judged are ib.rails when the site pins them, else the ones found on the node (or in the capture)."""
    if from_path is not None:
        first = capture_snapshot(Path(from_path))
        rails = _rails(config, first, None)
        return _judged(config, profile_name, rails, first)
    root = Path(sysfs_root or config.sysfs_root)
    window = config.window_seconds if window is None else window
    first = live_snapshot(root)
    rails = _rails(config, first, root)
    if window <= 0:
        return _judged(config, profile_name, rails, first)
    time.sleep(window)
    return _judged(config, profile_name, rails, first, later=live_snapshot(root), window_seconds=window)


def _rails(config: IbConfig, snapshot: Snapshot, sysfs_root: Path | None) -> RailChoice:
    if config.rails_pinned:
        return RailChoice(source="pinned", devices=config.rails, watched=config.rails)
    found = discover_rails(snapshot.ports, read_pci_tree(sysfs_root) if sysfs_root is not None else None)
    return replace(found, watched=config.rails)


def _judged(config: IbConfig, profile_name: str | None, rails: RailChoice, first: Snapshot,
            later: Snapshot | None = None, window_seconds: float = 0.0) -> Report:
    devices = regex_of(rails.devices) if rails.devices else ""  # "": names no HCA, hca-count says none
    profile = PROFILES[profile_name or config.profile](devices=devices, firmware=config.firmware)
    report = judge(first, profile, later, window_seconds)
    report.rails = rails
    return report


def rails_dict(rails: RailChoice) -> dict[str, Any]:
    """How the report chose its rails (the `rails` of --json)."""
    return {"source": rails.source, "devices": list(rails.devices), "basis": rails.basis or None,
            "not_rails": [{"device": device, "why": why} for device, why in rails.not_rails.items()],
            "watched": list(rails.watched)}


def report_dict(report: Report) -> dict[str, Any]:
    """The report as `opsctl ib check --json` prints it (the command adds the schema version)."""
    return {
        "profile": report.profile,
        "source": report.source,
        "verdict": "pass" if report.passed else "fail",
        "window_seconds": report.window_seconds,
        "hcas": [_port_dict(report, port) for port in report.ports],
        "findings": [{"check": f.check, "device": f.device, "detail": f.detail} for f in report.findings],
        "skipped": [{"check": check, "why": why} for check, why in sorted(report.skipped.items())],
        **({"rails": rails_dict(report.rails)} if report.rails is not None else {}),
    }


def _port_dict(report: Report, port: Port) -> dict[str, Any]:
    pcie = port.pcie.current if port.pcie else None
    return {"device": port.device, "port": port.port, "link_layer": port.link_layer, "state": port.state,
            "phys_state": port.phys_state, "rate": port.rate_text, "rate_gbps": port.rate_gbps,
            "firmware": port.firmware,
            "pcie": {"address": port.pcie.address, "speed_gts": pcie.speed_gts, "width": pcie.width}
            if port.pcie and pcie else None,
            "failed": report.failed_checks(port.device)}
