"""Judge a node's storage: `judge` is pure (it gets what the readers read), `storage_report` reads.

Check names are stable (the node-check metrics, the catalog's storage rules and docs/storage.md use them):

    storage-mount-missing  a required mount is not mounted, or not with the configured filesystem type
    storage-mount-hung     a stat (or the probe) of a mount did not answer within storage.timeout_seconds
    storage-probe-failed   the stat or the probe file failed: read-only, permission, I/O error
    lustre-import-down     an OST or MDT import is not FULL (or IDLE), or `lfs check servers` fails it
    lnet-ni-down           an LNet network interface (`lnetctl net show`, not the loopback) is not up
    lustre-mgs-unreachable `lctl ping` of an MGS NID (storage.lustre_mgs_nids) failed

A check that could not be made is skipped with the reason, never passed.
"""

import math
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from opsctl.config.schema import StorageConfig, StorageMount
from opsctl.errors import SourceUnavailable
from opsctl.storage.lnet import NetworkInterface, PingResult, parse_net_show, parse_ping
from opsctl.storage.lustre import Import, ServerCheck, parse_check_servers, parse_imports
from opsctl.storage.mountinfo import Mount, parse_mountinfo
from opsctl.storage.mountstats import NfsStats, parse_mountstats
from opsctl.storage.probe import ProbeResult, probe_mounts

LNET_CHECKS = ("lnet-ni-down", "lustre-mgs-unreachable")
CHECKS = ("storage-mount-missing", "storage-mount-hung", "storage-probe-failed", "lustre-import-down", *LNET_CHECKS)
LUSTRE = "lustre"
# `lctl ping` waits this share of storage.timeout_seconds for an answer (LNet's own timeout, whole seconds,
# at most lctl's 120), so that an MGS that does not answer is a failed ping, not a tool that timed out.
PING_SHARE = 0.5


@dataclass(frozen=True)
class StorageFinding:
    check: str
    device: str  # the mount point, or the Lustre target (lustre-OST0002)
    detail: str


@dataclass
class StorageReport:
    findings: list[StorageFinding] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # check -> why it could not be made
    checked: tuple[str, ...] = ()  # the checks that were made
    nfs: dict[str, NfsStats] = field(default_factory=dict)  # the configured NFS mounts' RPC totals

    @property
    def passed(self) -> bool:
        return not self.findings


@dataclass(frozen=True)
class LustreView:
    """What the Lustre client said, or why it could not be asked."""

    imports: list[Import] | None = None
    servers: list[ServerCheck] | None = None
    unavailable: str = ""


@dataclass(frozen=True)
class LnetView:
    """What LNet said: the local NIs (`lnetctl net show`) and a ping of each MGS NID; per check, why it
    could not be asked."""

    nis: list[NetworkInterface] | None = None
    pings: list[PingResult] | None = None
    unavailable: dict[str, str] = field(default_factory=dict)  # check -> why


def judge(mounts: tuple[StorageMount, ...], probes: dict[str, ProbeResult], table: dict[str, Mount],
          lustre: LustreView | None = None, nfs: dict[str, NfsStats] | None = None,
          lnet: LnetView | None = None) -> StorageReport:
    report = StorageReport(nfs={m.path: nfs[m.path] for m in mounts if nfs and m.path in nfs})
    if not mounts:
        report.skipped.update({check: "no storage.mounts configured" for check in CHECKS})
        return report
    for mount in mounts:
        found = table.get(mount.path)
        missing = found is None or found.fstype != mount.fstype
        if found is None:
            report.findings.append(StorageFinding("storage-mount-missing", mount.path, "not mounted"))
        elif missing:
            report.findings.append(StorageFinding("storage-mount-missing", mount.path,
                                                  f"{found.fstype} from {found.source}, not {mount.fstype}"))
        probe = probes.get(mount.path)
        if probe is not None and probe.status == "hung":
            report.findings.append(StorageFinding("storage-mount-hung", mount.path, probe.detail))
        elif probe is not None and probe.status == "error" and not missing:
            # Without its mount, the stat or probe of the mount point fails as a matter of course: one finding.
            report.findings.append(StorageFinding("storage-probe-failed", mount.path, probe.detail))
    checked = ["storage-mount-missing", "storage-mount-hung", "storage-probe-failed"]
    if not any(m.fstype == LUSTRE for m in mounts):
        report.skipped.update({check: "no Lustre mount configured" for check in ("lustre-import-down", *LNET_CHECKS)})
        report.checked = tuple(checked)
        return report
    if lustre is None or lustre.unavailable:
        report.skipped["lustre-import-down"] = lustre.unavailable if lustre else "the Lustre client was not asked"
    else:
        checked.append("lustre-import-down")
        report.findings += _lustre_findings(lustre)
    lnet = lnet or LnetView()
    for check, answer in (("lnet-ni-down", lnet.nis), ("lustre-mgs-unreachable", lnet.pings)):
        if answer is None or check in lnet.unavailable:
            report.skipped[check] = lnet.unavailable.get(check, "LNet was not asked")
        else:
            checked.append(check)
    report.findings += _lnet_findings(lnet)
    report.checked = tuple(checked)
    return report


def _lustre_findings(lustre: LustreView) -> list[StorageFinding]:
    down: dict[str, list[str]] = {}
    for imp in lustre.imports or []:
        if not imp.healthy:
            down.setdefault(imp.target, []).append(f"import {imp.state}")
    for server in lustre.servers or []:
        if not server.active:
            down.setdefault(server.target, []).append(f"lfs check servers: {server.detail}")
    return [StorageFinding("lustre-import-down", target, "; ".join(why)) for target, why in sorted(down.items())]


def _lnet_findings(lnet: LnetView) -> list[StorageFinding]:
    """An NI that is not up, by its NID (the interfaces say which port to look at); an MGS NID that did not
    answer `lctl ping`."""
    nis = [] if "lnet-ni-down" in lnet.unavailable else lnet.nis or []
    pings = [] if "lustre-mgs-unreachable" in lnet.unavailable else lnet.pings or []
    return [StorageFinding("lnet-ni-down", ni.nid, f"{ni.net_type} NI {ni.status}; interfaces "
                           f"{', '.join(ni.interfaces) or 'none'}") for ni in nis if not ni.up] + \
        [StorageFinding("lustre-mgs-unreachable", ping.nid, f"lctl ping: {ping.detail}")
         for ping in pings if not ping.reachable]


def storage_report(config: StorageConfig) -> StorageReport:
    """Probe first: an automounted path is mounted by the stat, so mountinfo is read after it."""
    probes = probe_mounts({m.path: m.probe_dir for m in config.mounts}, config.timeout_seconds)
    table = parse_mountinfo(_read(config.mountinfo_path), config.mountinfo_path)
    lustre = lnet = None
    if any(m.fstype == LUSTRE for m in config.mounts):
        mounted = [m for m in config.mounts if m.fstype == LUSTRE
                   and getattr(table.get(m.path), "fstype", None) == LUSTRE]
        # The client's tools hang with the mount, and answer nothing useful without one.
        usable = [m for m in mounted if probes[m.path].status != "hung"]
        lustre = ask_lustre(config) if usable else LustreView(
            unavailable="no Lustre mount is mounted and answering; the client was not asked")
        # lnetctl and lctl ping talk to LNet, not to the filesystem: they answer under a hung mount too,
        # and say why it hung when the network is the cause.
        lnet = ask_lnet(config) if mounted else LnetView(unavailable={
            check: "no Lustre mount is mounted; LNet was not asked" for check in LNET_CHECKS})
    nfs = None
    if any(m.fstype.startswith("nfs") for m in config.mounts):
        nfs = parse_mountstats(_read(config.mountstats_path), config.mountstats_path)
    return judge(config.mounts, probes, table, lustre, nfs, lnet)


def ask_lustre(config: StorageConfig) -> LustreView:
    try:
        imports = parse_imports(_run([config.lctl, "get_param", "osc.*.import", "mdc.*.import"], config))
        servers = parse_check_servers(_run([config.lfs, "check", "servers"], config, errors_are_output=True))
    except _NotAsked as why:
        return LustreView(unavailable=str(why))
    return LustreView(imports=imports, servers=servers)


def ask_lnet(config: StorageConfig) -> LnetView:
    nis = pings = None
    unavailable = {}
    try:
        nis = parse_net_show(_run([config.lnetctl, "net", "show"], config))
    except _NotAsked as why:
        unavailable["lnet-ni-down"] = str(why)
    if not config.lustre_mgs_nids:
        unavailable["lustre-mgs-unreachable"] = "no storage.lustre_mgs_nids configured"
    else:
        seconds = str(max(1, min(120, math.floor(config.timeout_seconds * PING_SHARE))))
        try:
            # A failed ping prints its error (stderr before Lustre 2.17, stdout since) and exits non-zero.
            pings = [parse_ping(nid, _run([config.lctl, "ping", nid, seconds], config, errors_are_output=True))
                     for nid in config.lustre_mgs_nids]
        except _NotAsked as why:
            unavailable["lustre-mgs-unreachable"] = str(why)
    return LnetView(nis=nis, pings=pings, unavailable=unavailable)


class _NotAsked(Exception):
    pass


def _run(argv: list[str], config: StorageConfig, errors_are_output: bool = False) -> str:
    """A Lustre tool's output. `lfs check servers` and `lctl ping` print a failure on stderr and exit
    non-zero, so for them stderr is part of the answer."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=config.timeout_seconds, check=False)
    except FileNotFoundError:
        raise _NotAsked(f"{argv[0]} not found") from None
    except subprocess.TimeoutExpired:
        raise _NotAsked(f"{' '.join(argv)} did not answer within {config.timeout_seconds:g}s") from None
    if errors_are_output:
        return out.stdout + out.stderr
    if out.returncode != 0:
        raise _NotAsked(f"{' '.join(argv)} exited {out.returncode}: {out.stderr.strip()[:200]}")
    return out.stdout


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as err:
        raise SourceUnavailable(f"cannot read {path}: {err.strerror}") from err
