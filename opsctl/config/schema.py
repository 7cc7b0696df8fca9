"""The opsctl config file: one YAML mapping, every key validated, every error names its key.

Found at `--config`, else `$OPSCTL_CONFIG`, else /etc/opsctl/config.yaml; when none of them is given
and the default file does not exist, the built-in defaults apply. docs/health.md documents each key.

Each key is declared once, below: the field's name is the YAML key, its annotation the type, and
`key(...)` its default, check and hint (opsctl/config/fields.py loads them all alike), so that
`Config()` is the built-in defaults. Durations are `Duration`s (seconds), written in the file as a
number of seconds or as 30s, 5m, 1h, 2d.
"""

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import yaml

from opsctl.config import rails as rail_names
from opsctl.config.fields import Duration, duration, duration_seconds, fail, key, load, parse_duration
from opsctl.errors import ConfigError
from opsctl.gpu.tools import READY_TIMEOUT_MAX_S, node_step_bound_s

__all__ = ["Config", "Duration", "duration_seconds", "load_config", "parse_config", "parse_duration"]

DEFAULT_CONFIG = Path("/etc/opsctl/config.yaml")
DEFAULT_STATE_DIR = Path("/var/lib/opsctl")
DEFAULT_AUDIT_LOG = Path("/var/log/opsctl/audit.jsonl")
DEFAULTS_SOURCE = "built-in defaults"
IB_PROFILES = ("h200-ndr",)  # opsctl.ib.check.PROFILES; named here so that config needs no fabric import
FIRMWARE_COMPONENTS = ("vbios", "inforom")  # opsctl.health.firmware.COMPONENTS, named here for the same reason
# hardware.compute_mode's names, in the order of DCGM's values (DCGM_CONFIG_COMPUTEMODE_*: 0, 1, 2).
COMPUTE_MODES = ("default", "prohibited", "exclusive-process")
# The signals `opsctl job-health` may name a slow node by (opsctl.jobhealth.signals), named here so that config
# needs no feature import.
JOB_HEALTH_SIGNALS = ("sm-clock", "activity", "power", "ib", "clock-events")
# A firmware version as dcgm-exporter shows it (96.00.A5.00.03, G520.0280.02.02): it goes into PromQL verbatim.
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_LABEL = re.compile(r"^[A-Za-z_]\w*$")
_JOB = re.compile(r"^[A-Za-z0-9_-]+$")
# An LNet NID: an address (IPv4, IPv6 since Lustre 2.16, a number on some fabrics) @ a network (o2ib, tcp1).
_NID = re.compile(r"[0-9A-Za-z.:_-]+@[a-z][a-z0-9]*")
_LISTEN = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


def _readable(path: str) -> bool:
    return os.access(path, os.R_OK)


def _between(low: float, high: float) -> Any:
    return lambda v: low <= v <= high


def _not_negative(v: float) -> bool:
    return v >= 0


def _positive(v: float) -> bool:
    return v > 0


def _unit_name(v: str) -> bool:
    """A systemd unit, `dcgm-exporter` or `nvidia-dcgm.service`: no path, no space, no option."""
    return bool(re.fullmatch(r"[A-Za-z0-9:_.@\\-]+", v)) and not v.startswith("-")


def _absolute(v: str) -> bool:
    return v.startswith("/")


def _distinct(v: tuple[Any, ...] | list[Any]) -> bool:
    return len(set(v)) == len(v)


def _listen_ok(value: str) -> bool:
    match = _LISTEN.match(value)
    return match is not None and 0 < int(match.group(2)) < 65536


def _jobs(raw: object, default: dict[str, str], path: str) -> dict[str, str]:
    """prometheus.jobs: {dcgm: JOB, node: JOB or null}; the result holds the jobs in use."""
    if not isinstance(raw, dict) or not set(raw) <= {"dcgm", "node"}:
        fail(path, "must be a mapping with keys dcgm and node (the scrape job names)", raw)
    jobs = dict(default)
    for source, job in raw.items():
        # Only node_exporter's job may be null: a site without it loses the rules that need it.
        if job is None and source == "node":
            del jobs["node"]
            continue
        # Job names go into PromQL label matchers verbatim; keep them to characters that need no escaping.
        if not isinstance(job, str) or not _JOB.match(job):
            fail(f"{path}.{source}", "must be a job name of letters, digits, _ and -"
                 + (" (or null)" if source == "node" else ""), job)
        jobs[source] = job
    return jobs


def _firmware(raw: object, default: dict[str, str], path: str) -> dict[str, str]:
    """hardware.firmware: {component: version} for the components whose version a site pins."""
    if not isinstance(raw, dict):
        fail(path, f"must map components ({', '.join(FIRMWARE_COMPONENTS)}) to versions", raw)
    for component, version in raw.items():
        if component not in FIRMWARE_COMPONENTS:
            fail(f"{path}.{component}", f"is not a component opsctl compares (one of {', '.join(FIRMWARE_COMPONENTS)})")
        if not isinstance(version, str) or not _VERSION.match(version):
            fail(f"{path}.{component}", "must be a version of letters, digits, '.', '_' and '-'", version)
    return {**default, **raw}


@dataclass(frozen=True)
class BasicAuth:
    UNKNOWN_HINT: ClassVar[str] = "; put the password in a file"

    username: str | None = key(None)
    password_file: str | None = key(None, check=_readable, hint="must be a readable file")

    def check_together(self, where: str) -> None:
        if (self.username is None) != (self.password_file is None):
            fail(where, "needs both username and password_file")


@dataclass(frozen=True)
class PrometheusConfig:
    url: str = key("http://127.0.0.1:9090", check=lambda v: v.startswith(("http://", "https://")),
                   hint="must start with http:// or https://", normalize=lambda v: v.rstrip("/"))
    bearer_token_file: str | None = key(None, check=_readable, hint="must be a readable file")
    basic_auth: BasicAuth = key(factory=BasicAuth)
    ca_bundle: str | None = key(None, check=_readable, hint="must be a readable file")
    connect_timeout_seconds: Duration = key(duration("3s"), check=_positive, hint="must be > 0")
    timeout_seconds: Duration = key(duration("15s"), check=_positive, hint="must be > 0")  # read timeout per query
    # source ("dcgm", "node") -> scrape job name, for the jobs in use (node: null drops node_exporter's)
    jobs: dict[str, str] = key(factory=lambda: {"dcgm": "dcgm", "node": "node"}, parse=_jobs)
    stale_after: Duration = key(duration("2m"))
    scrape_interval: Duration = key(duration("30s"), check=_positive,
                                    hint="must be above 0 (the scrape interval of the exporters)")
    parallel_queries: int = key(4, check=_between(1, 32), hint="must be 1-32")
    # Rule results that Prometheus records (opsctl.health.precomputed): auto uses them where they are
    # fresh and the catalog's own; off always queries the rules directly.
    recording_rules: str = key("auto", check=lambda v: v in ("auto", "off"), hint="must be auto or off")
    recording_interval: Duration = key(duration("0s"), check=_not_negative,
                                       hint="must be >= 0 (0: prometheus.scrape_interval)")

    @property
    def recording_interval_seconds(self) -> float:
        return float(self.recording_interval or self.scrape_interval)

    def check_together(self, where: str) -> None:
        if self.bearer_token_file and self.basic_auth.username:
            fail(f"{where}.bearer_token_file", "use either a bearer token or basic_auth, not both")


@dataclass(frozen=True)
class SlurmConfig:
    backend: str = key("cli", check=lambda v: v in ("cli", "pyslurm"), hint="must be cli or pyslurm")
    sinfo: str = key("sinfo")
    scontrol: str = key("scontrol")
    timeout_seconds: Duration = key(duration("30s"), check=_positive, hint="must be > 0")
    partitions: tuple[str, ...] | None = key(  # None: every partition that has GPU nodes
        None, check=lambda v: v and all(v),
        hint="must be a non-empty list of partition names (or null: every partition with GPU nodes)")


@dataclass(frozen=True)
class CatalogConfig:
    files: tuple[str, ...] = key((), each=_readable, each_hint="must be a readable file",
                                 hint="must be a list of readable files")
    disable: tuple[str, ...] = key((), hint="must be a list of rule ids")
    overrides: dict[str, dict[str, Any]] = key(factory=dict)  # rule id -> fields; opsctl.health.catalog checks them
    xid_source: str = key("auto", check=lambda v: v in ("auto", "window", "gauge"),
                          hint="must be auto, window or gauge")


@dataclass(frozen=True)
class MappingConfig:
    RETIRED: ClassVar[dict[str, str]] = {
        "labels": "replaced by node_mapping.target_label (a target label such as node) and "
                  "node_mapping.exporter_labels (such as Hostname); see docs/health.md"}

    # a target label naming the Slurm node, when the scrape config sets it
    target_label: str | None = key("node", check=_LABEL.match, hint="must be a label name (or null)")
    exporter_labels: tuple[str, ...] = key(  # what dcgm-exporter reports about its host
        ("Hostname", "hostname"), each=_LABEL.match, each_hint="must be a label name",
        hint="must be a list of label names")
    strip_domain: bool = key(True)
    names: dict[str, str] = key(factory=dict, hint="must map instances or host names (strings) to Slurm node names")

    @property
    def by(self) -> tuple[str, ...]:
        """The labels that tell a scrape target apart: every rule keeps them (the ${by} placeholder)."""
        return ((self.target_label,) if self.target_label else ()) + ("job", "instance")


@dataclass(frozen=True)
class HardwareConfig:
    # hardware.ib_devices, a regular expression of the compute rails, is read into ib.rails (parse_config).
    YAML_ONLY: ClassVar[tuple[str, ...]] = ("ib_devices",)

    gpus_per_node: int = key(8, check=_between(1, 64), hint="must be 1-64")
    ib_rate_bytes_per_second: float = key(5e10, check=_positive, hint="must be > 0")
    # an NVLink's full speed as `nvidia-smi nvlink -s` prints it: 26.562 GB/s on H100 and H200 (NVLink 4)
    nvlink_bytes_per_second: float = key(26.562e9, check=_positive, hint="must be > 0")
    # component -> the version every GPU must run (firmware-drift then drains); unpinned: the fleet's majority
    firmware: dict[str, str] = key(factory=dict, parse=_firmware)
    # the compute mode every GPU must be in (compute-mode drains the others): default lets a job's processes
    # share a GPU; a site that runs one process per GPU on purpose says exclusive-process
    compute_mode: str = key("default", check=lambda v: v in COMPUTE_MODES,
                            hint=f"must be one of {', '.join(COMPUTE_MODES)}")


@dataclass(frozen=True)
class SafetyConfig:
    max_drains_per_run: int = key(4, check=_not_negative, hint="must be >= 0")
    max_drains_per_hour: int = key(8, check=_not_negative, hint="must be >= 0")
    max_resumes_per_run: int = key(4, check=_not_negative, hint="must be >= 0")
    max_resumes_per_hour: int = key(8, check=_not_negative, hint="must be >= 0")
    breaker_min_nodes: int = key(2, check=_not_negative, hint="must be >= 0")
    breaker_fraction: float = key(0.10, check=_between(0, 1), hint="must be between 0 and 1")
    unknown_max_fraction: float = key(0.5, check=_between(0, 1), hint="must be between 0 and 1")
    max_out_of_service_fraction: float = key(0.2, check=_between(0, 1), hint="must be between 0 and 1")
    resume_after: Duration = key(duration("10m"))
    reason_max_length: int = key(128, check=_between(32, 1024), hint="must be 32-1024")


@dataclass(frozen=True)
class MetricsConfig:
    # where `opsctl health --watch` serves /metrics; null: not served
    listen_address: str | None = key("127.0.0.1:9479", check=_listen_ok, hint="must be HOST:PORT, e.g. 127.0.0.1:9479")
    # where a one-shot run writes them; node_exporter's textfile collector reads only files named *.prom
    textfile: str | None = key(None, check=lambda v: v.startswith("/") and v.endswith(".prom"),
                               hint="must be an absolute path ending in .prom")


@dataclass(frozen=True)
class AlertsConfig:
    run_missing_after: Duration = key(duration("5m"))
    drained_fraction: float = key(0.10, check=lambda v: 0 < v <= 1, hint="must be above 0 and at most 1")
    exporter_down_for: Duration = key(duration("2m"))


HGX_RAILS = tuple(f"mlx5_{i}" for i in range(8))
RAILS_AUTO = "auto"


def _rails(raw: object, default: tuple[str, ...], path: str) -> tuple[str, ...]:
    """ib.rails: `auto` (the default names; the nodes' own are discovered) or a list of HCA names."""
    if raw == RAILS_AUTO:
        return default
    if not isinstance(raw, list) or not all(isinstance(name, str) for name in raw):
        fail(path, "must be auto or a list of distinct HCA names", raw)
    return tuple(raw)


@dataclass(frozen=True)
class IbConfig:
    """`opsctl ib check`: the hardware profile, a pinned HCA firmware, where sysfs is, the counter window;
    `opsctl ib fabric-test`; and the compute rails, which the health rules read as well."""

    profile: str = key("h200-ndr", check=lambda v: v in IB_PROFILES,
                       hint=f"unknown profile (known: {', '.join(IB_PROFILES)})")
    firmware: str | None = key(None, check=lambda v: re.fullmatch(r"\d+(\.\d+)+", v),
                               hint="must be a version like 28.41.1000")
    sysfs_root: str = key("/sys", check=_absolute, hint="must be an absolute path")
    window_seconds: Duration = key(duration("10s"), check=_between(0, 600), hint="must be 0-600 seconds")
    # The compute HCAs of a node, rail i first: HCA i of one node tests HCA i of another. A list pins
    # them (hardware.ib_devices is read into it); `auto`, the default, has `opsctl ib check` discover
    # each node's (opsctl.ib.rails), while what runs away from the nodes (the health rules, fabric-test)
    # keeps the HGX naming below, which a site with other names pins.
    rails: tuple[str, ...] = key(HGX_RAILS, parse=_rails, check=lambda v: v and _distinct(v),
                                 hint="must be a list of distinct HCA names",
                                 each=rail_names.HCA_NAME.fullmatch,
                                 each_hint="must be an HCA name (letters, digits, _ . -)")
    slow_gbps: float = key(360.0, check=_positive, hint="must be above 0")  # NDR: ~392 healthy
    max_rounds: int = key(4, check=_between(2, 20), hint="must be 2-20")
    parallel: int = key(8, check=_between(1, 256), hint="must be 1-256")  # node pairs tested at once
    # one ib_write_bw run; a hung one is killed on both ends
    test_timeout_seconds: Duration = key(duration("60s"), check=_between(5, 3600), hint="must be 5-3600 seconds")
    # more failing nodes than this: the fabric, not the nodes; drain none
    max_fail_fraction: float = key(0.25, check=lambda v: 0 < v <= 1, hint="must be above 0 and at most 1")
    # `opsctl ib topology` runs `<ibnetdiscover> -C <rail> -P 1` once per rail (the lab points it at its emulation)
    ibnetdiscover: str = key("ibnetdiscover", check=bool, hint="must not be empty")
    # `opsctl node check` reads the node's MLNX_OFED or DOCA-OFED version with `<ofed_info> -s` (version-drift)
    ofed_info: str = key("ofed_info", check=bool, hint="must not be empty")
    # Whether the file lists ib.rails (or hardware.ib_devices): set by parse_config, not a key.
    rails_pinned: bool = field(default=False, metadata={"internal": True})

    @property
    def rails_regex(self) -> str:
        """The rails as a regular expression, fully anchored as PromQL's =~ is (mlx5_[0-7])."""
        return rail_names.regex_of(self.rails)


@dataclass(frozen=True)
class StorageMount:
    """A mount a node must have to take jobs (`opsctl node check`, docs/storage.md)."""

    UNKNOWN_HINT: ClassVar[str] = "; a mount is {path, fstype, probe_dir}"

    path: str = key(check=lambda v: v.startswith("/") and v == os.path.normpath(v),
                    hint="must be an absolute, normalised path")  # where it is mounted: /home, /lustre
    fstype: str = key(check=re.compile(r"[\w.-]+").fullmatch,  # what /proc/self/mountinfo must say: nfs4, lustre
                      hint="must be a filesystem type such as nfs4 or lustre")
    probe_dir: str | None = key(None)  # a directory where the check writes and reads back a probe file

    def check_together(self, where: str) -> None:
        if self.probe_dir is not None and not (self.probe_dir.startswith("/")
                                               and (self.probe_dir + "/").startswith(self.path.rstrip("/") + "/")):
            fail(f"{where}.probe_dir", f"must be an absolute path under {self.path}", self.probe_dir)


@dataclass(frozen=True)
class StorageConfig:
    mounts: tuple[StorageMount, ...] = key((), check=lambda v: _distinct([m.path for m in v]),
                                           hint="a path is listed twice")
    # a mount whose stat (and probe) takes longer is hung
    timeout_seconds: Duration = key(duration("10s"), check=_between(0.1, 600), hint="must be 0.1-600 seconds")
    lctl: str = key("lctl", check=bool, hint="must not be empty")
    lfs: str = key("lfs", check=bool, hint="must not be empty")
    lnetctl: str = key("lnetctl", check=bool, hint="must not be empty")
    lustre_mgs_nids: tuple[str, ...] = key(  # `lctl ping` of each must answer (10.10.0.10@o2ib)
        (), check=lambda v: all(_NID.fullmatch(nid) for nid in v) and _distinct(v),
        hint="must be a list of distinct LNet NIDs such as 10.10.0.10@o2ib")
    mountinfo_path: str = key("/proc/self/mountinfo", check=_absolute, hint="must be an absolute path")
    mountstats_path: str = key("/proc/self/mountstats", check=_absolute, hint="must be an absolute path")


@dataclass(frozen=True)
class GpuConfig:
    """What `opsctl node check` reads of the GPUs: the kernel log, for the XIDs and SXids that never reach
    DCGM (docs/gpu-kernel-log.md), and nvidia-smi, for each GPU's index."""

    # /dev/kmsg, or a regular file of its records, one per line (the lab's)
    kernel_log_path: str = key("/dev/kmsg", check=_absolute, hint="must be an absolute path")
    nvidia_smi: str = key("nvidia-smi", check=bool, hint="must not be empty")
    # runs the diagnostics after a reset or reboot of the remediation ladder (docs/remediation.md)
    dcgmi: str = key("dcgmi", check=bool, hint="must not be empty")
    # after a failed validation that follows a reboot, for the RMA's evidence; skipped where not installed
    nvidia_bug_report: str = key("nvidia-bug-report.sh", check=bool, hint="must not be empty")
    # stops and starts remediation.reset_stops around a GPU reset (docs/remediation.md)
    systemctl: str = key("systemctl", check=bool, hint="must not be empty")


@dataclass(frozen=True)
class RemediationConfig:
    """`opsctl remediate`, the ladder after a drain: reset, reboot, validate, resume or RMA
    (docs/remediation.md)."""

    max_resets_per_run: int = key(2, check=_not_negative, hint="must be >= 0")
    max_resets_per_hour: int = key(8, check=_not_negative, hint="must be >= 0")
    max_reboots_per_run: int = key(2, check=_not_negative, hint="must be >= 0")
    max_reboots_per_hour: int = key(4, check=_not_negative, hint="must be >= 0")
    # the same node, GPU and rule drained this many times within rma_window: RMA, not another round
    rma_after: int = key(3, check=lambda v: v >= 1, hint="must be >= 1")
    rma_window: Duration = key(duration("24h"))
    # a reset or reboot with no validation this long after it: the next step (reboot; after a reboot, a person)
    step_timeout: Duration = key(duration("1h"))
    # dcgmi diag -r <level> on the node after a reset or reboot (1 quick, 2 medium, 3-4 long)
    validate_level: int = key(2, check=_between(1, 4), hint="must be 1-4")
    # after a reset or reboot, how long the node waits for every GPU's NVSwitch fabric to be trained and
    # persistence mode on before its checks (docs/remediation.md); not ready by then: unchecked, never failed
    ready_timeout: Duration = key(duration("5m"), check=lambda v: 0 < v <= READY_TIMEOUT_MAX_S,
                                  hint=f"must be more than 0 and at most {READY_TIMEOUT_MAX_S // 60}m")
    # the NVIDIA services that must be active before the node's checks (a board without NVSwitches: leave out
    # nvidia-fabricmanager)
    ready_services: tuple[str, ...] = key(("nvidia-persistenced", "nvidia-fabricmanager"), each=_unit_name,
                                          each_hint="must be a systemd unit name")
    # the node's services that hold every GPU while they run (DCGM's host engine, dcgm-exporter): stopped around a
    # GPU reset, which nvidia-smi refuses while anything holds the GPU, and started again after it
    reset_stops: tuple[str, ...] = key(("dcgm-exporter", "nvidia-dcgm"), each=_unit_name,
                                       each_hint="must be a systemd unit name")

    def check_together(self, where: str) -> None:
        """An unanswered step counts as failed after step_timeout: never before the node's step over a GPU at
        validate_level could have answered (the head would reboot a node whose diag still runs)."""
        least = node_step_bound_s(self.validate_level)
        if self.step_timeout < least:
            fail(f"{where}.step_timeout", f"must be at least {Duration(least)} at validate_level {self.validate_level} "
                                          "(the node's dcgmi diag and its other tools may take that long)",
                 str(self.step_timeout))


# What the node's side of the ladder (ladder/node_step.py, on every GPU node) reads of the head's settings: the
# node_check role renders the head's values of these into the node's own config (node-check.yaml), so that
# both sides run one ladder. A section stands for all its keys: the node's config checks remediation as the
# head's does (step_timeout against validate_level). tests/unit/test_node_config_reaches_node.py derives the
# keys the node's step reads from its code and keeps the role's list the same as this one. The node draining itself
# (`node check --drain-self`, its HealthCheckProgram) keeps to the head's out-of-service limit too: the limit is the
# cluster's, whoever drains.
NODE_LADDER_SETTINGS = ("remediation", "safety.reason_max_length", "safety.max_out_of_service_fraction")


@dataclass(frozen=True)
class ValidateConfig:
    """`opsctl validate` and `opsctl node validate`: active checks that run as Slurm jobs on idle nodes
    (docs/validate.md). The floor's default is Azure's for its 8-H200 VMs (Azure/azurehpc-health-checks
    conf/nd96isr_h200_v5.conf: `check_nccl_allreduce 431.0 1 16G`)."""

    # the partition of the validation jobs: the slurm_common role makes it low priority, hidden, root only
    partition: str = key("validate", check=bool, hint="must not be empty")
    # a node is validated again once its last validation is this old (and it is idle)
    interval: Duration = key(duration("7d"), check=_positive, hint="must be above 0")
    max_nodes_per_sweep: int = key(16, check=lambda v: v >= 1, hint="must be >= 1")
    # a job not started (the node became busy) or not ended this long after its submission is cancelled
    job_timeout: Duration = key(duration("20m"), check=_positive, hint="must be above 0")
    # what a job runs on its node; it must write the results where node_exporter reads them
    job_command: str = key("/opt/opsctl/bin/opsctl node validate --textfile "
                           "/var/lib/prometheus/node-exporter/opsctl-validate.prom", check=bool,
                           hint="must not be empty")
    # dcgmi diag -r <level> (2: software, memory and pcie, minutes)
    diag_level: int = key(2, check=_between(1, 4), hint="must be 1-4")
    # nccl-tests' all_reduce_perf over the node's GPUs at one message size, against a bus-bandwidth floor
    all_reduce_perf: str = key("/opt/nccl-tests/build/all_reduce_perf", check=bool, hint="must not be empty")
    nccl_bytes: str = key("16G", check=lambda v: re.fullmatch(r"[1-9][0-9]*[KMG]?", str(v)) is not None,
                          hint="must be a size as all_reduce_perf takes it: 16G, 512M")
    nccl_busbw_floor_gbps: float = key(431.0, check=_positive, hint="must be above 0 (GB/s)")
    # opsctl validate --preflight: nccl-tests between two nodes, one rail at a time (one GPU per node, its
    # HCA alone): the floor per NDR rail. nccl-tests' maintainers give 46-48 GB/s per NDR NIC
    # (NVIDIA/nccl-tests issue 290); 40 leaves room for a busy fabric and names a rail at half rate.
    nccl_rail_busbw_floor_gbps: float = key(40.0, check=_positive, hint="must be above 0 (GB/s)")
    # srun --mpi for the multi-node steps: nccl-tests built with MPI=1 start their ranks through PMIx
    srun_mpi: str = key("pmix", check=bool, hint="must not be empty (pmix, pmi2, none)")
    # how long the caller's reservation holds the good nodes after a preflight
    preflight_hold: Duration = key(duration("1h"), check=_positive, hint="must be above 0")


@dataclass(frozen=True)
class WhyConfig:
    """`opsctl why JOB` and `opsctl suspects` (docs/why.md)."""

    # how far past a job's end its evidence is read: the scrape that sees an event lands up to one scrape
    # interval after it, and a job often dies first (0: two prometheus.scrape_interval)
    after_end: Duration = key(duration("0s"), check=_not_negative, hint="must be >= 0 (0: two scrape intervals)")
    # opsctl suspects: the failed jobs of this long ago and since count
    suspect_lookback: Duration = key(duration("7d"), check=_positive, hint="must be above 0")
    # a node is a suspect once it was in at least this many failed jobs that no evidence explains ...
    suspect_min_failed_jobs: int = key(5, check=lambda v: v >= 1, hint="must be >= 1")
    # ... and they were at least this share of the jobs it ran
    suspect_failed_fraction: float = key(0.5, check=_between(0.0, 1.0), hint="must be between 0 and 1")


@dataclass(frozen=True)
class JobHealthConfig:
    """`opsctl job-health` and `opsctl why` of a running job (docs/job-health.md): each running multi-node job's
    nodes against each other over the last `window`."""

    # what each signal is averaged (or its counters' rate taken) over; a job younger than this gets no verdict
    window: Duration = key(duration("1m"), check=_positive, hint="must be a duration above 0, such as 1m")
    # a node is an outlier of its job on a signal at this robust score, |x - median| / (1.4826 * MAD), and above
    min_score: float = key(3.5, check=_positive, hint="must be above 0")
    # ... and only when it is at least this share of the job's median away from it
    min_deviation: float = key(0.10, check=_between(0.0, 1.0), hint="must be between 0 and 1")
    # the MAD is taken as at least this share of the median: identical healthy nodes have a MAD of ~0
    mad_floor: float = key(0.02, check=_between(0.0, 1.0), hint="must be between 0 and 1")
    # a node whose NVLink and InfiniBand counters together rise less than this per second moves nothing
    traffic_floor: float = key(65536.0, check=_not_negative, hint="must be >= 0 (per second)")
    # a node with a GPU at or below this utilisation is idle; its peers spin at or above busy_util
    idle_util: float = key(5.0, check=_between(0.0, 100.0), hint="must be 0-100 (%)")
    busy_util: float = key(50.0, check=_between(0.0, 100.0), hint="must be 0-100 (%)")
    # the signals a node may be named slow by (a subset of the default); hung is judged by traffic and util
    signals: tuple[str, ...] = key(JOB_HEALTH_SIGNALS, each=lambda v: v in JOB_HEALTH_SIGNALS,
                                   each_hint=f"must be one of {', '.join(JOB_HEALTH_SIGNALS)}",
                                   hint=f"must be a list of {', '.join(JOB_HEALTH_SIGNALS)}")
    # where the verdicts are written for node_exporter's textfile collector (null: opsctl-job-health.prom
    # beside metrics.textfile, not written when that is null too)
    textfile: str | None = key(None, check=lambda v: v.startswith("/") and v.endswith(".prom"),
                               hint="must be an absolute path ending in .prom")

    def check_together(self, where: str) -> None:
        if self.idle_util >= self.busy_util:
            fail(f"{where}.idle_util", f"must be below {where}.busy_util ({self.busy_util:g})", self.idle_util)


def _slurm_name(name: str) -> bool:
    return bool(re.fullmatch(r"[^\s,]+", name))


@dataclass(frozen=True)
class RecoverConfig:
    """Requeue a job that a node's fault ended, without that node (docs/recover.md). A job opts in by
    Slurm's requeue flag plus either `--comment=opsctl:recover` or this policy."""

    # false: no job is ever requeued, opted in or not
    enabled: bool = key(True)
    # every requeueable batch job opts in (as if each said --comment=opsctl:recover)
    all_jobs: bool = key(False)
    # ... or the jobs of these partitions, or of these QOS
    partitions: tuple[str, ...] = key((), each=_slurm_name, each_hint="must be a Slurm name (no spaces or commas)")
    qos: tuple[str, ...] = key((), each=_slurm_name, each_hint="must be a Slurm name (no spaces or commas)")
    # times opsctl requeues one job; the next failure of that job is left ended
    max_requeues: int = key(2, check=_not_negative, hint="must be >= 0")
    # requeues per hour across the cluster (the budget, as safety.max_drains_per_hour is for drains)
    max_requeues_per_hour: int = key(10, check=_not_negative, hint="must be >= 0")


BMC_PROTOCOLS = ("", "redfish", "ipmi")


@dataclass(frozen=True)
class BmcConfig:
    """The nodes' BMCs, for the remediation ladder's power cycle (docs/remediation.md, "Power cycle"): a node whose
    reboot never came back. `url` and `system` take `{node}`, the Slurm node name. No protocol: no power rung, and a
    hung reboot goes to a person."""

    protocol: str = key("", check=lambda v: v in BMC_PROTOCOLS, hint="must be redfish, ipmi or empty (none)")
    # redfish: the BMC's base URL (https://{node}-bmc.example.com); ipmi: the BMC's host name ({node}-bmc)
    url: str = key("", check=lambda v: v == "" or "{node}" in v or v.startswith(("http://", "https://")),
                   hint="must be a URL or host name, with {node} for the node's own")
    # redfish: the ComputerSystem's id under /redfish/v1/Systems ("" : the BMC's only system)
    system: str = key("")
    user: str = key("")
    password_file: str | None = key(None, check=_readable, hint="must be a readable file")
    verify_tls: bool = key(True)
    ca_bundle: str | None = key(None, check=_readable, hint="must be a readable file")
    # one request, and then the whole wait for the power state to change (off, then on)
    timeout: Duration = key(duration("10s"), check=_positive, hint="must be > 0")
    power_wait: Duration = key(duration("2m"), check=_positive, hint="must be > 0")

    def check_together(self, where: str) -> None:
        if self.protocol and not (self.url and self.user and self.password_file):
            fail(where, f"protocol {self.protocol} needs url, user and password_file")


@dataclass(frozen=True)
class Config:
    prometheus: PrometheusConfig = key(factory=PrometheusConfig)
    slurm: SlurmConfig = key(factory=SlurmConfig)
    catalog: CatalogConfig = key(factory=CatalogConfig)
    node_mapping: MappingConfig = key(factory=MappingConfig)
    hardware: HardwareConfig = key(factory=HardwareConfig)
    safety: SafetyConfig = key(factory=SafetyConfig)
    metrics: MetricsConfig = key(factory=MetricsConfig)
    alerts: AlertsConfig = key(factory=AlertsConfig)
    ib: IbConfig = key(factory=IbConfig)
    storage: StorageConfig = key(factory=StorageConfig)
    gpu: GpuConfig = key(factory=GpuConfig)
    remediation: RemediationConfig = key(factory=RemediationConfig)
    validate: ValidateConfig = key(factory=ValidateConfig)
    why: WhyConfig = key(factory=WhyConfig)
    recover: RecoverConfig = key(factory=RecoverConfig)
    job_health: JobHealthConfig = key(factory=JobHealthConfig)
    bmc: BmcConfig = key(factory=BmcConfig)
    state_dir: Path = key(DEFAULT_STATE_DIR)
    audit_log: Path = key(DEFAULT_AUDIT_LOG)
    # Where it came from, for messages: not a key of the file, and no part of what a config is.
    source: str = field(default=DEFAULTS_SOURCE, compare=False, metadata={"internal": True})


def _one_rail_list(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` with hardware.ib_devices, the older spelling of the compute rails, read into ib.rails.
    Both given: they must name the same HCAs (ib.rails gives the order)."""
    hardware, ib = raw.get("hardware"), raw.get("ib")
    if not isinstance(hardware, dict) or hardware.get("ib_devices") is None or not isinstance(ib, dict | None):
        return raw  # nothing to read, or a section that the loader refuses with its own message
    path, pattern = "hardware.ib_devices", hardware["ib_devices"]
    if not isinstance(pattern, str):
        fail(path, "expected a regular expression such as mlx5_[0-7]", pattern)
    try:
        re.compile(pattern)
        names = rail_names.names_of(pattern)
    except re.error:
        fail(path, "must be a valid regular expression (RE2, anchored by PromQL)", pattern)
    except ValueError as err:
        fail(path, f"must name a fixed list of HCAs such as mlx5_[0-7], or give them as ib.rails (here {err})",
             pattern)
    odd = [name for name in names if not rail_names.HCA_NAME.fullmatch(name)]
    if odd:
        fail(path, f"names {odd[0]!r}, not an HCA name (letters, digits, _ . -)", pattern)
    given = (ib or {}).get("rails")
    if given is None:
        return {**raw, "ib": {**(ib or {}), "rails": names}}
    if isinstance(given, list) and set(given) != set(names):
        fail(path, f"names {', '.join(names)} but ib.rails lists {', '.join(map(str, given))}; "
                   "give the compute rails once, as ib.rails", pattern)
    return raw


def parse_config(raw: object, source: str = DEFAULTS_SOURCE, env: Mapping[str, str] | None = None) -> Config:
    """Turn the loaded YAML into a Config; raises ConfigError naming the first bad key."""
    env = os.environ if env is None else env
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config {source}: the top level must be a mapping")
    raw = _one_rail_list(raw)
    config = replace(load(Config, raw, ""), source=source)
    rails = raw["ib"].get("rails") if isinstance(raw.get("ib"), dict) else None
    if isinstance(rails, list):
        config = replace(config, ib=replace(config.ib, rails_pinned=True))
    # OPSCTL_STATE_DIR moves both the state and the audit log: one directory per cluster or test.
    if env.get("OPSCTL_STATE_DIR"):
        state_dir = Path(env["OPSCTL_STATE_DIR"])
        config = replace(config, state_dir=state_dir, audit_log=state_dir / "audit.jsonl")
    return config


def load_config(path: str | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Read the config from --config, $OPSCTL_CONFIG or /etc/opsctl/config.yaml."""
    env = os.environ if env is None else env
    explicit = path or env.get("OPSCTL_CONFIG")
    target = Path(explicit) if explicit else DEFAULT_CONFIG
    if not target.exists():
        if explicit:
            raise ConfigError(f"config file {target} does not exist")
        return parse_config({}, DEFAULTS_SOURCE, env)
    try:
        raw = yaml.safe_load(target.read_text())
    except OSError as err:
        raise ConfigError(f"cannot read config {target}: {err.strerror}") from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"config {target}{where}: not valid YAML") from err
    return parse_config(raw, str(target), env)
