"""One node's InfiniBand report, as `opsctl ib check` and `opsctl node check` make and print it."""

import time
from pathlib import Path
from typing import Any

from opsctl.config.schema import IbConfig
from opsctl.ib.check import PROFILES, Port, Report, judge
from opsctl.ib.collect import capture_snapshot, live_snapshot


def check_report(config: IbConfig, profile_name: str | None, from_path: str | None, window: float | None,
                 sysfs_root: str | None) -> Report:
    """The report of one node (or of a capture, `from_path`): live, over the counter window when it is > 0."""
    profile = PROFILES[profile_name or config.profile](devices=config.rails_regex, firmware=config.firmware)
    if from_path is not None:
        return judge(capture_snapshot(Path(from_path)), profile)
    root = Path(sysfs_root or config.sysfs_root)
    window = config.window_seconds if window is None else window
    first = live_snapshot(root)
    if window <= 0:
        return judge(first, profile)
    time.sleep(window)
    return judge(first, profile, later=live_snapshot(root), window_seconds=window)


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
    }


def _port_dict(report: Report, port: Port) -> dict[str, Any]:
    pcie = port.pcie.current if port.pcie else None
    return {"device": port.device, "port": port.port, "link_layer": port.link_layer, "state": port.state,
            "phys_state": port.phys_state, "rate": port.rate_text, "rate_gbps": port.rate_gbps,
            "firmware": port.firmware,
            "pcie": {"address": port.pcie.address, "speed_gts": pcie.speed_gts, "width": pcie.width}
            if port.pcie and pcie else None,
            "failed": report.failed_checks(port.device)}
