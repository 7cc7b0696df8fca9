"""`opsctl ib check`: the node-local InfiniBand precheck, as a table or JSON, with its exit code.

Exit codes: 0 pass, 1 fail, 2 usage or config error, 3 the hardware (or the capture) could not be read.
"""

import json
import time
from pathlib import Path
from typing import Any

import click

from opsctl.commands.context import Clients
from opsctl.commands.render import JSON_SCHEMA, table
from opsctl.errors import ExitCode
from opsctl.fabric.check import PROFILES, Port, Report, judge
from opsctl.fabric.collect import capture_snapshot, live_snapshot


def ib_check(clients: Clients, profile_name: str | None, as_json: bool, from_path: str | None,
             window: float | None, sysfs_root: str | None) -> ExitCode:
    report = check_report(clients, profile_name, from_path, window, sysfs_root)
    click.echo(_json(report) if as_json else _table(report))
    return ExitCode.OK if report.passed else ExitCode.FAILING


def check_report(clients: Clients, profile_name: str | None, from_path: str | None, window: float | None,
                 sysfs_root: str | None) -> Report:
    config = clients.config()
    profile = PROFILES[profile_name or config.ib.profile](devices=config.ib.rails_regex,
                                                          firmware=config.ib.firmware)
    if from_path is not None:
        return judge(capture_snapshot(Path(from_path)), profile)
    root = Path(sysfs_root or config.ib.sysfs_root)
    window = config.ib.window_seconds if window is None else window
    first = live_snapshot(root)
    if window <= 0:
        return judge(first, profile)
    time.sleep(window)
    return judge(first, profile, later=live_snapshot(root), window_seconds=window)


def report_dict(report: Report) -> dict[str, Any]:
    return {
        "schema": JSON_SCHEMA,
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


def _json(report: Report) -> str:
    return json.dumps(report_dict(report), indent=1)


def _table(report: Report) -> str:
    rows = [("HCA", "PORT", "STATE", "PHYS", "RATE", "FIRMWARE", "PCIE", "FAILED")]
    for port in report.ports:
        pcie = f"{port.pcie.current.speed_gts:g}GT/s x{port.pcie.current.width}" if port.pcie else "-"
        rate = port.rate_text or (f"{port.rate_gbps:g} Gb/sec" if port.rate_gbps is not None else "-")
        rows.append((port.device, str(port.port), port.state or "-", port.phys_state or "-", rate,
                     port.firmware or "-", pcie, ",".join(report.failed_checks(port.device)) or "-"))
    lines = [table(rows)]
    lines += [f"{f.check}: {f.device + ': ' if f.device else ''}{f.detail}" for f in report.findings]
    lines += [f"not checked: {check}: {why}" for check, why in sorted(report.skipped.items())]
    window = f", counters over {report.window_seconds:g}s" if report.window_seconds else ""
    verdict = "pass" if report.passed else f"FAIL ({len(report.findings)} finding(s))"
    lines.append(f"verdict: {verdict}, profile {report.profile}, {len(report.ports)} compute HCAs, "
                 f"{report.source}{window}")
    return "\n".join(lines)
