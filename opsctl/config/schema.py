"""The opsctl config file: one YAML mapping, every key validated, every error names its key.

Found at `--config`, else `$OPSCTL_CONFIG`, else /etc/opsctl/config.yaml; when none of them is given
and the default file does not exist, the built-in defaults apply. docs/health.md documents each key.
"""

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from opsctl.errors import ConfigError

T = TypeVar("T")
D = TypeVar("D")
Raw = Mapping[str, Any]  # a YAML mapping, as loaded: every value is checked before use

DEFAULT_CONFIG = Path("/etc/opsctl/config.yaml")
DEFAULT_STATE_DIR = Path("/var/lib/opsctl")
DEFAULT_AUDIT_LOG = Path("/var/log/opsctl/audit.jsonl")
_DURATION = re.compile(r"^(\d+)([smhd])$")
_LABEL = re.compile(r"^[A-Za-z_]\w*$")
# An LNet NID: an address (IPv4, IPv6 since Lustre 2.16, a number on some fabrics) @ a network (o2ib, tcp1).
_NID = re.compile(r"[0-9A-Za-z.:_-]+@[a-z][a-z0-9]*")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_seconds(text: str) -> int:
    """'90s' -> 90, '5m' -> 300. The same spelling goes into PromQL range selectors unchanged."""
    match = _DURATION.match(str(text))
    if not match:
        raise ValueError(f"{text!r} is not a duration like 30s, 5m, 1h")
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


@dataclass(frozen=True)
class PrometheusConfig:
    url: str = "http://127.0.0.1:9090"
    bearer_token_file: str | None = None
    basic_auth_username: str | None = None
    basic_auth_password_file: str | None = None
    ca_bundle: str | None = None
    connect_timeout: float = 3.0
    read_timeout: float = 15.0
    dcgm_job: str = "dcgm"
    node_job: str | None = "node"  # None: the site runs no node_exporter; rules that need it are off
    stale_after: str = "2m"
    scrape_interval: str = "30s"
    parallel_queries: int = 4

    @property
    def jobs(self) -> dict[str, str]:
        """source ("dcgm", "node") -> scrape job name, for the jobs in use."""
        return {"dcgm": self.dcgm_job, **({"node": self.node_job} if self.node_job else {})}


@dataclass(frozen=True)
class SlurmConfig:
    backend: str = "cli"
    sinfo: str = "sinfo"
    scontrol: str = "scontrol"
    timeout: float = 30.0
    partitions: tuple[str, ...] | None = None  # None: every partition that has GPU nodes


@dataclass(frozen=True)
class CatalogConfig:
    files: tuple[str, ...] = ()
    disable: tuple[str, ...] = ()
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    xid_source: str = "auto"


@dataclass(frozen=True)
class MappingConfig:
    target_label: str | None = "node"  # a target label naming the Slurm node, when the scrape config sets it
    exporter_labels: tuple[str, ...] = ("Hostname", "hostname")  # what dcgm-exporter reports about its host
    strip_domain: bool = True
    names: dict[str, str] = field(default_factory=dict)

    @property
    def by(self) -> tuple[str, ...]:
        """The labels that tell a scrape target apart: every rule keeps them (the ${by} placeholder)."""
        return ((self.target_label,) if self.target_label else ()) + ("job", "instance")


@dataclass(frozen=True)
class HardwareConfig:
    gpus_per_node: int = 8
    ib_devices: str = "mlx5_[0-7]"
    ib_rate_bytes_per_second: float = 5e10


@dataclass(frozen=True)
class SafetyConfig:
    max_drains_per_run: int = 4
    max_drains_per_hour: int = 8
    max_resumes_per_run: int = 4
    max_resumes_per_hour: int = 8
    breaker_min_nodes: int = 2
    breaker_fraction: float = 0.10
    unknown_max_fraction: float = 0.5
    max_out_of_service_fraction: float = 0.2
    resume_after: str = "10m"
    reason_max_length: int = 128


@dataclass(frozen=True)
class MetricsConfig:
    listen_address: str | None = "127.0.0.1:9479"  # where `opsctl health --watch` serves /metrics
    textfile: str | None = None  # where a one-shot run writes them for node_exporter's textfile collector


@dataclass(frozen=True)
class AlertsConfig:
    run_missing_after: str = "5m"
    drained_fraction: float = 0.10
    exporter_down_for: str = "2m"


@dataclass(frozen=True)
class IbConfig:
    """`opsctl ib check`: the hardware profile, a pinned HCA firmware, where sysfs is, the counter window."""

    profile: str = "h200-ndr"
    firmware: str | None = None
    sysfs_root: str = "/sys"
    window_seconds: float = 10.0
    # `opsctl ib fabric-test`
    rails: tuple[str, ...] = tuple(f"mlx5_{i}" for i in range(8))  # HCA i of one node tests HCA i of another
    slow_gbps: float = 360.0  # a rail below this one-way bandwidth is slow (NDR: ~392 healthy)
    max_rounds: int = 4
    parallel: int = 8  # node pairs tested at once
    test_timeout_seconds: float = 60.0  # one ib_write_bw run; a hung one is killed on both ends
    max_fail_fraction: float = 0.25  # more failing nodes than this: the fabric, not the nodes; drain none


@dataclass(frozen=True)
class StorageMount:
    """A mount a node must have to take jobs (`opsctl node check`, docs/storage.md)."""

    path: str  # where it is mounted: /home, /lustre
    fstype: str  # what /proc/self/mountinfo must say: nfs4, lustre, ...
    probe_dir: str | None = None  # a directory where the check writes and reads back a probe file


@dataclass(frozen=True)
class StorageConfig:
    mounts: tuple[StorageMount, ...] = ()
    timeout_seconds: float = 10.0  # a mount whose stat (and probe) takes longer is hung
    lctl: str = "lctl"
    lfs: str = "lfs"
    lnetctl: str = "lnetctl"
    lustre_mgs_nids: tuple[str, ...] = ()  # `lctl ping` of each must answer (10.10.0.10@o2ib)
    mountinfo_path: str = "/proc/self/mountinfo"
    mountstats_path: str = "/proc/self/mountstats"


@dataclass(frozen=True)
class Config:
    prometheus: PrometheusConfig = PrometheusConfig()
    slurm: SlurmConfig = SlurmConfig()
    catalog: CatalogConfig = CatalogConfig()
    node_mapping: MappingConfig = MappingConfig()
    hardware: HardwareConfig = HardwareConfig()
    safety: SafetyConfig = SafetyConfig()
    metrics: MetricsConfig = MetricsConfig()
    alerts: AlertsConfig = AlertsConfig()
    ib: IbConfig = IbConfig()
    storage: StorageConfig = StorageConfig()
    state_dir: Path = DEFAULT_STATE_DIR
    audit_log: Path = DEFAULT_AUDIT_LOG
    source: str = "built-in defaults"


def _check(cond: bool, key: str, message: str) -> None:
    if not cond:
        raise ConfigError(f"config key {key}: {message}")


def _section(raw: Raw, name: str, allowed: list[str]) -> Raw:
    """One mapping section of the file, with every key in it checked against `allowed`."""
    value = raw.get(name, {})
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ConfigError(f"config key {name}: must be a mapping")
    for key in value:
        _check(key in allowed, f"{name}.{key}", f"unknown key (known: {', '.join(sorted(allowed))})")
    return value


def _typed(section: str, data: Raw, key: str, kind: type[T], default: D,
           check: Callable[[T], object] | None = None, hint: str = "") -> T | D:
    """data[key] if it is a `kind` (and passes `check`), `default` when absent; else ConfigError."""
    if key not in data or data[key] is None:
        return default
    value = data[key]
    name = f"{section}.{key}"
    # bool is an int in Python: refuse it where a number is meant, it is always a typo there.
    if kind in (int, float) and isinstance(value, bool):
        raise ConfigError(f"config key {name}: expected a number, got {value!r}")
    if kind is float and isinstance(value, int):
        value = float(value)
    if not isinstance(value, kind):
        raise ConfigError(f"config key {name}: expected {kind.__name__}, got {type(value).__name__} {value!r}")
    if check is not None:
        _check(bool(check(value)), name, hint or f"invalid value {value!r}")
    return value


def _duration_ok(value: str) -> bool:
    try:
        duration_seconds(value)
    except ValueError:
        return False
    return True


def _readable(path: str) -> bool:
    return os.access(path, os.R_OK)


def parse_config(raw: object, source: str, env: Mapping[str, str] | None = None) -> Config:
    """Turn the loaded YAML into a Config; raises ConfigError naming the first bad key."""
    env = os.environ if env is None else env
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config {source}: the top level must be a mapping")
    top = {"prometheus", "slurm", "catalog", "node_mapping", "hardware", "safety", "metrics", "alerts", "ib", "storage",
           "state_dir", "audit_log"}
    for key in raw:
        _check(key in top, str(key), f"unknown key (known: {', '.join(sorted(top))})")

    p = _section(raw, "prometheus",
                 ["url", "bearer_token_file", "basic_auth", "ca_bundle", "timeout_seconds", "connect_timeout_seconds",
                  "jobs", "stale_after", "scrape_interval", "parallel_queries"])
    url = _typed("prometheus", p, "url", str, PrometheusConfig.url,
                 lambda v: v.startswith(("http://", "https://")), "must start with http:// or https://")
    token = _typed("prometheus", p, "bearer_token_file", str, None, _readable, "file is not readable")
    auth = p.get("basic_auth") or {}
    _check(isinstance(auth, dict), "prometheus.basic_auth", "must be a mapping with username, password_file")
    for key in auth:
        _check(key in ("username", "password_file"), f"prometheus.basic_auth.{key}",
               "unknown key (known: password_file, username); put the password in a file")
    user = _typed("prometheus.basic_auth", auth, "username", str, None)
    pw_file = _typed("prometheus.basic_auth", auth, "password_file", str, None, _readable, "file is not readable")
    _check((user is None) == (pw_file is None), "prometheus.basic_auth", "needs both username and password_file")
    _check(not (token and user), "prometheus.bearer_token_file", "use either a bearer token or basic_auth, not both")
    ca = _typed("prometheus", p, "ca_bundle", str, None, _readable, "file is not readable")
    jobs = p.get("jobs") or {}
    _check(isinstance(jobs, dict) and set(jobs) <= {"dcgm", "node"}, "prometheus.jobs",
           "must be a mapping with keys dcgm and node (the scrape job names)")
    for key, job in jobs.items():
        # Job names go into PromQL label matchers verbatim; keep them to characters that need no escaping.
        # Only node_exporter's job may be null: a site without it loses the rules that need it.
        if job is None and key == "node":
            continue
        _check(isinstance(job, str) and re.match(r"^[A-Za-z0-9_-]+$", job) is not None, f"prometheus.jobs.{key}",
               "must be a job name of letters, digits, _ and -" + (" (or null)" if key == "node" else ""))
    prom = PrometheusConfig(
        url=url.rstrip("/"), bearer_token_file=token, basic_auth_username=user, basic_auth_password_file=pw_file,
        ca_bundle=ca,
        read_timeout=_typed("prometheus", p, "timeout_seconds", float, 15.0, lambda v: v > 0, "must be > 0"),
        connect_timeout=_typed("prometheus", p, "connect_timeout_seconds", float, 3.0, lambda v: v > 0,
                               "must be > 0"),
        dcgm_job=_typed("prometheus.jobs", jobs, "dcgm", str, "dcgm"),
        node_job=None if "node" in jobs and jobs["node"] is None else _typed("prometheus.jobs", jobs, "node", str,
                                                                             "node"),
        stale_after=_typed("prometheus", p, "stale_after", str, "2m", _duration_ok,
                           "must be a duration like 30s, 2m"),
        scrape_interval=_typed("prometheus", p, "scrape_interval", str, "30s",
                               lambda v: _duration_ok(v) and duration_seconds(v) > 0,
                               "must be a duration like 15s, 1m (the scrape interval of the exporters)"),
        parallel_queries=_typed("prometheus", p, "parallel_queries", int, 4, lambda v: 1 <= v <= 32,
                                "must be 1-32"),
    )

    s = _section(raw, "slurm", ["backend", "sinfo", "scontrol", "timeout_seconds", "partitions"])
    partitions = _typed("slurm", s, "partitions", list, None,
                        lambda v: bool(v) and all(isinstance(x, str) and x for x in v),
                        "must be a non-empty list of partition names (or null: every partition with GPU nodes)")
    slurm = SlurmConfig(
        backend=_typed("slurm", s, "backend", str, "cli", lambda v: v in ("cli", "pyslurm"),
                       "must be cli or pyslurm"),
        sinfo=_typed("slurm", s, "sinfo", str, "sinfo"),
        scontrol=_typed("slurm", s, "scontrol", str, "scontrol"),
        timeout=_typed("slurm", s, "timeout_seconds", float, 30.0, lambda v: v > 0, "must be > 0"),
        partitions=tuple(partitions) if partitions is not None else None,
    )

    c = _section(raw, "catalog", ["files", "disable", "overrides", "xid_source"])
    files = _typed("catalog", c, "files", list, [])
    for i, f in enumerate(files):
        _check(isinstance(f, str) and _readable(f), f"catalog.files[{i}]", f"not a readable file: {f!r}")
    disable = _typed("catalog", c, "disable", list, [])
    _check(all(isinstance(d, str) for d in disable), "catalog.disable", "must be a list of rule ids")
    overrides = _typed("catalog", c, "overrides", dict, {})
    catalog = CatalogConfig(
        files=tuple(files), disable=tuple(disable), overrides=dict(overrides),
        xid_source=_typed("catalog", c, "xid_source", str, "auto", lambda v: v in ("auto", "window", "gauge"),
                          "must be auto, window or gauge"),
    )

    if isinstance(raw.get("node_mapping"), dict) and "labels" in raw["node_mapping"]:
        raise ConfigError("config key node_mapping.labels: replaced by node_mapping.target_label (a target label "
                          "such as node) and node_mapping.exporter_labels (such as Hostname); see docs/health.md")
    m = _section(raw, "node_mapping", ["target_label", "exporter_labels", "strip_domain", "names"])
    target_label = m.get("target_label", MappingConfig.target_label)
    _check(target_label is None or isinstance(target_label, str) and _LABEL.match(target_label) is not None,
           "node_mapping.target_label", "must be a label name (or null)")
    exporter_labels = _typed("node_mapping", m, "exporter_labels", list, list(MappingConfig.exporter_labels),
                             lambda v: all(isinstance(x, str) and _LABEL.match(x) for x in v),
                             "must be a list of label names")
    names = _typed("node_mapping", m, "names", dict, {},
                   lambda v: all(isinstance(a, str) and isinstance(b, str) for a, b in v.items()),
                   "must map instances or host names (strings) to Slurm node names")
    mapping = MappingConfig(target_label=target_label, exporter_labels=tuple(exporter_labels),
                            strip_domain=_typed("node_mapping", m, "strip_domain", bool, True), names=dict(names))

    h = _section(raw, "hardware", ["gpus_per_node", "ib_devices", "ib_rate_bytes_per_second"])
    ib_devices = _typed("hardware", h, "ib_devices", str, HardwareConfig.ib_devices, _regex_ok,
                        "must be a valid regular expression (RE2, anchored by PromQL)")
    hardware = HardwareConfig(
        gpus_per_node=_typed("hardware", h, "gpus_per_node", int, 8, lambda v: 1 <= v <= 64, "must be 1-64"),
        ib_devices=ib_devices,
        ib_rate_bytes_per_second=_typed("hardware", h, "ib_rate_bytes_per_second", float, 5e10,
                                        lambda v: v > 0, "must be > 0"),
    )

    sf = _section(raw, "safety",
                  ["max_drains_per_run", "max_drains_per_hour", "max_resumes_per_run", "max_resumes_per_hour",
                   "breaker_min_nodes", "breaker_fraction", "unknown_max_fraction", "max_out_of_service_fraction",
                   "resume_after", "reason_max_length"])
    safety = SafetyConfig(
        max_drains_per_run=_typed("safety", sf, "max_drains_per_run", int, 4, lambda v: v >= 0, "must be >= 0"),
        max_drains_per_hour=_typed("safety", sf, "max_drains_per_hour", int, 8, lambda v: v >= 0, "must be >= 0"),
        max_resumes_per_run=_typed("safety", sf, "max_resumes_per_run", int, 4, lambda v: v >= 0, "must be >= 0"),
        max_resumes_per_hour=_typed("safety", sf, "max_resumes_per_hour", int, 8, lambda v: v >= 0,
                                    "must be >= 0"),
        breaker_min_nodes=_typed("safety", sf, "breaker_min_nodes", int, 2, lambda v: v >= 0, "must be >= 0"),
        breaker_fraction=_typed("safety", sf, "breaker_fraction", float, 0.10, lambda v: 0 <= v <= 1,
                                "must be between 0 and 1"),
        unknown_max_fraction=_typed("safety", sf, "unknown_max_fraction", float, 0.5, lambda v: 0 <= v <= 1,
                                    "must be between 0 and 1"),
        max_out_of_service_fraction=_typed("safety", sf, "max_out_of_service_fraction", float, 0.2,
                                           lambda v: 0 <= v <= 1, "must be between 0 and 1"),
        resume_after=_typed("safety", sf, "resume_after", str, "10m", _duration_ok,
                            "must be a duration like 30s, 10m, 1h"),
        reason_max_length=_typed("safety", sf, "reason_max_length", int, 128, lambda v: 32 <= v <= 1024,
                                 "must be 32-1024"),
    )

    state_dir = Path(_typed("", raw, "state_dir", str, str(DEFAULT_STATE_DIR)))
    audit_log = Path(_typed("", raw, "audit_log", str, str(DEFAULT_AUDIT_LOG)))
    # OPSCTL_STATE_DIR moves both the state and the audit log: one directory per cluster or test.
    if env.get("OPSCTL_STATE_DIR"):
        state_dir = Path(env["OPSCTL_STATE_DIR"])
        audit_log = state_dir / "audit.jsonl"
    return Config(prometheus=prom, slurm=slurm, catalog=catalog, node_mapping=mapping, hardware=hardware,
                  safety=safety, metrics=_metrics(raw), alerts=_alerts(raw), ib=_ib(raw), storage=_storage(raw),
                  state_dir=state_dir, audit_log=audit_log, source=source)


_LISTEN = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


def _listen_ok(value: str) -> bool:
    match = _LISTEN.match(value)
    return match is not None and 0 < int(match.group(2)) < 65536


def _metrics(raw: Raw) -> MetricsConfig:
    m = _section(raw, "metrics", ["listen_address", "textfile"])
    # An explicit null switches the endpoint off; an absent key keeps the loopback default.
    listen = MetricsConfig.listen_address if "listen_address" not in m else m["listen_address"]
    if listen is not None:
        listen = _typed("metrics", m, "listen_address", str, listen, _listen_ok,
                        "must be HOST:PORT, e.g. 127.0.0.1:9479")
    return MetricsConfig(
        listen_address=listen,
        # node_exporter's textfile collector reads only files named *.prom.
        textfile=_typed("metrics", m, "textfile", str, None, lambda v: v.startswith("/") and v.endswith(".prom"),
                        "must be an absolute path ending in .prom"),
    )


def _alerts(raw: Raw) -> AlertsConfig:
    a = _section(raw, "alerts", ["run_missing_after", "drained_fraction", "exporter_down_for"])
    return AlertsConfig(
        run_missing_after=_typed("alerts", a, "run_missing_after", str, AlertsConfig.run_missing_after, _duration_ok,
                                 "must be a duration like 5m"),
        drained_fraction=_typed("alerts", a, "drained_fraction", float, AlertsConfig.drained_fraction,
                                lambda v: 0 < v <= 1, "must be above 0 and at most 1"),
        exporter_down_for=_typed("alerts", a, "exporter_down_for", str, AlertsConfig.exporter_down_for, _duration_ok,
                                 "must be a duration like 2m"),
    )


IB_PROFILES = ("h200-ndr",)  # opsctl.fabric.check.PROFILES; named here so that config needs no fabric import


def _ib(raw: Raw) -> IbConfig:
    i = _section(raw, "ib", ["profile", "firmware", "sysfs_root", "window_seconds", "rails", "slow_gbps",
                             "max_rounds", "parallel", "test_timeout_seconds", "max_fail_fraction"])
    rails = _typed("ib", i, "rails", list, list(IbConfig.rails),
                   lambda v: bool(v) and all(isinstance(r, str) and re.fullmatch(r"[\w.-]+", r) for r in v)
                   and len(set(v)) == len(v), "must be a list of distinct HCA names")
    return IbConfig(
        rails=tuple(rails),
        slow_gbps=_typed("ib", i, "slow_gbps", float, IbConfig.slow_gbps, lambda v: v > 0, "must be above 0"),
        max_rounds=_typed("ib", i, "max_rounds", int, IbConfig.max_rounds, lambda v: 2 <= v <= 20, "must be 2-20"),
        parallel=_typed("ib", i, "parallel", int, IbConfig.parallel, lambda v: 1 <= v <= 256, "must be 1-256"),
        test_timeout_seconds=_typed("ib", i, "test_timeout_seconds", float, IbConfig.test_timeout_seconds,
                                    lambda v: 5 <= v <= 3600, "must be 5-3600 seconds"),
        max_fail_fraction=_typed("ib", i, "max_fail_fraction", float, IbConfig.max_fail_fraction,
                                 lambda v: 0 < v <= 1, "must be above 0 and at most 1"),
        profile=_typed("ib", i, "profile", str, IbConfig.profile, lambda v: v in IB_PROFILES,
                       f"unknown profile (known: {', '.join(IB_PROFILES)})"),
        firmware=_typed("ib", i, "firmware", str, None, lambda v: bool(re.fullmatch(r"\d+(\.\d+)+", v)),
                        "must be a version like 28.41.1000"),
        sysfs_root=_typed("ib", i, "sysfs_root", str, IbConfig.sysfs_root, lambda v: v.startswith("/"),
                          "must be an absolute path"),
        window_seconds=_typed("ib", i, "window_seconds", float, IbConfig.window_seconds, lambda v: 0 <= v <= 600,
                              "must be 0-600 seconds"),
    )


def _distinct_nids(value: list[object]) -> bool:
    return all(isinstance(n, str) and _NID.fullmatch(n) for n in value) and len(set(value)) == len(value)


def _storage(raw: Raw) -> StorageConfig:
    s = _section(raw, "storage", ["mounts", "timeout_seconds", "lctl", "lfs", "lnetctl", "lustre_mgs_nids",
                                  "mountinfo_path", "mountstats_path"])
    mounts = []
    for index, entry in enumerate(_typed("storage", s, "mounts", list, [])):
        key = f"storage.mounts[{index}]"
        _check(isinstance(entry, dict), key, "must be a mapping with path and fstype")
        for name in entry:
            _check(name in ("path", "fstype", "probe_dir"), f"{key}.{name}", "unknown key (known: fstype, path, "
                   "probe_dir)")
        path, fstype, probe_dir = entry.get("path"), entry.get("fstype"), entry.get("probe_dir")
        _check(isinstance(path, str) and path.startswith("/") and path == os.path.normpath(path), f"{key}.path",
               "must be an absolute, normalised path")
        _check(isinstance(fstype, str) and re.fullmatch(r"[\w.-]+", fstype) is not None, f"{key}.fstype",
               "must be a filesystem type such as nfs4 or lustre")
        _check(probe_dir is None or isinstance(probe_dir, str) and probe_dir.startswith("/")
               and (probe_dir + "/").startswith(path.rstrip("/") + "/"), f"{key}.probe_dir",
               f"must be an absolute path under {path}")
        mounts.append(StorageMount(path=path, fstype=fstype, probe_dir=probe_dir))
    _check(len({m.path for m in mounts}) == len(mounts), "storage.mounts", "a path is listed twice")
    absolute = (lambda v: v.startswith("/")), "must be an absolute path"
    nids: list[object] = _typed("storage", s, "lustre_mgs_nids", list, [], _distinct_nids,
                                "must be a list of distinct LNet NIDs such as 10.10.0.10@o2ib")
    return StorageConfig(
        mounts=tuple(mounts),
        timeout_seconds=_typed("storage", s, "timeout_seconds", float, StorageConfig.timeout_seconds,
                               lambda v: 0.1 <= v <= 600, "must be 0.1-600 seconds"),
        lctl=_typed("storage", s, "lctl", str, StorageConfig.lctl, bool, "must not be empty"),
        lfs=_typed("storage", s, "lfs", str, StorageConfig.lfs, bool, "must not be empty"),
        lnetctl=_typed("storage", s, "lnetctl", str, StorageConfig.lnetctl, bool, "must not be empty"),
        lustre_mgs_nids=tuple(str(nid) for nid in nids),
        mountinfo_path=_typed("storage", s, "mountinfo_path", str, StorageConfig.mountinfo_path, *absolute),
        mountstats_path=_typed("storage", s, "mountstats_path", str, StorageConfig.mountstats_path, *absolute),
    )


def _regex_ok(value: str) -> bool:
    try:
        re.compile(value)
    except re.error:
        return False
    return True


def load_config(path: str | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Read the config from --config, $OPSCTL_CONFIG or /etc/opsctl/config.yaml."""
    env = os.environ if env is None else env
    explicit = path or env.get("OPSCTL_CONFIG")
    target = Path(explicit) if explicit else DEFAULT_CONFIG
    if not target.exists():
        if explicit:
            raise ConfigError(f"config file {target} does not exist")
        return parse_config({}, "built-in defaults", env)
    try:
        raw = yaml.safe_load(target.read_text())
    except OSError as err:
        raise ConfigError(f"cannot read config {target}: {err.strerror}") from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"config {target}{where}: not valid YAML") from err
    return parse_config(raw, str(target), env)
