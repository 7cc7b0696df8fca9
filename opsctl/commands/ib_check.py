"""`opsctl ib check`: the node-local InfiniBand precheck, as a table or JSON, with its exit code.

Exit codes: 0 pass, 1 fail, 2 usage or config error, 3 the hardware (or the capture) could not be read.
"""

import json

import click

from opsctl.clients import Clients
from opsctl.commands.render import JSON_SCHEMA, table
from opsctl.errors import ExitCode
from opsctl.ib.check import RailChoice, Report
from opsctl.ib.report import check_report, report_dict


def ib_check(clients: Clients, profile_name: str | None, as_json: bool, from_path: str | None,
             window: float | None, sysfs_root: str | None) -> ExitCode:
    report = check_report(clients.config().ib, profile_name, from_path, window, sysfs_root)
    click.echo(_json(report) if as_json else _table(report))
    return ExitCode.OK if report.passed else ExitCode.FAILING


def _json(report: Report) -> str:
    return json.dumps({"schema": JSON_SCHEMA, **report_dict(report)}, indent=1)


def _table(report: Report) -> str:
    rows = [("HCA", "PORT", "STATE", "PHYS", "RATE", "FIRMWARE", "PCIE", "FAILED")]
    for port in report.ports:
        pcie = f"{port.pcie.current.speed_gts:g}GT/s x{port.pcie.current.width}" if port.pcie else "-"
        rate = port.rate_text or (f"{port.rate_gbps:g} Gb/sec" if port.rate_gbps is not None else "-")
        rows.append((port.device, str(port.port), port.state or "-", port.phys_state or "-", rate,
                     port.firmware or "-", pcie, ",".join(report.failed_checks(port.device)) or "-"))
    lines = [table(rows)]
    if report.rails is not None:
        lines += _rails_lines(report.rails)
    lines += [f"{f.check}: {f.device + ': ' if f.device else ''}{f.detail}" for f in report.findings]
    lines += [f"not checked: {check}: {why}" for check, why in sorted(report.skipped.items())]
    window = f", counters over {report.window_seconds:g}s" if report.window_seconds else ""
    verdict = "pass" if report.passed else f"FAIL ({len(report.findings)} finding(s))"
    lines.append(f"verdict: {verdict}, profile {report.profile}, {len(report.ports)} compute HCAs, "
                 f"{report.source}{window}")
    return "\n".join(lines)


def _rails_lines(rails: RailChoice) -> list[str]:
    how = "pinned by ib.rails" if rails.source == "pinned" else f"discovered by {rails.basis}"
    lines = [f"rails: {', '.join(rails.devices) or 'none'} ({how})"]
    if rails.not_rails:
        lines.append("not rails: " + ", ".join(f"{hca} ({why})" for hca, why in rails.not_rails.items()))
    if rails.source == "discovered" and set(rails.devices) != set(rails.watched):
        # The health rules and fabric-test cannot discover: they judge the names of ib.rails.
        lines.append(f"note: the health rules and fabric-test use ib.rails ({', '.join(rails.watched)}); "
                     "pin ib.rails to the rails above")
    return lines
