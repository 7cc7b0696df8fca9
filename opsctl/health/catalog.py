"""The health rule catalog: shipped as opsctl/health/catalog.yaml, extended or overridden by the user.

Loading turns the YAML into Rule objects with every placeholder filled in from the config, so the
PromQL that `opsctl health` runs and the PromQL that `opsctl rules export` writes are the same text.

Every rule holds for at least two scrape intervals (`prometheus.scrape_interval`): its effective hold is
max(hold, 2 x scrape_interval), so one missed scrape of one series never drains a node.
  - A rule whose expr uses ${hold} in a range selector holds by itself: the effective hold goes there.
  - Any other rule is held by opsctl (`held_breaches`, the decision; `held`, the value that the resume
    evidence, dashboards and `opsctl why` read): a series is held when its condition was not certainly ok
    (`condition`: breaching, NaN or infinite) at every sample over the hold, the hold's first sample
    included, sampled once per `prometheus.recording_interval` (the scrape interval unless set); its
    value is the least breaching one (min_over_time for > and >=, max_over_time for < and <=). So only a
    series that existed when the hold began is held: a value that breached at one scrape only, or a
    series that appeared breaching (a new node-check finding, a GPU that went missing from one scrape),
    waits a whole hold. The recording rules (opsctl/health/precomputed.py) compute the same over the
    condition's recorded history, sampled at the same interval, so both paths decide alike.
"""

import itertools
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from string import Template
from typing import Any

import yaml

from opsctl.config.schema import COMPUTE_MODES, Config, duration_seconds
from opsctl.errors import ConfigError
from opsctl.health import firmware
from opsctl.health.units import FORMATS, fill, unknown_formats
from opsctl.health.xid import DRAIN_ACTIONS, code_regex, value_filter, xid_catalog

OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
}
RawRule = dict[str, Any]  # one catalog entry as YAML gives it; _build checks every field
RULE_KEYS = {"id", "for_each", "source", "device_label", "expr", "unhealthy", "candidates", "op", "threshold",
             "healthy", "hold", "xid", "evidence", "variants", "severity", "action", "auto_resume", "memory", "domain",
             "description", "remediation"}
SHIPPED_LABEL = "opsctl/health/catalog.yaml"
CANDIDATES_PLACEHOLDER = "${candidates}"  # in `unhealthy`: what `candidates` kept
OVERRIDABLE = {"expr", "unhealthy", "candidates", "op", "threshold", "healthy", "hold", "evidence", "severity",
               "action", "auto_resume", "memory", "description", "remediation"}
# Rule ids that changed, old -> new: catalog.overrides and catalog.disable keep working under the old id.
RENAMED = {"nvlink-errors": "nvlink-errors-rising"}
# How long an event stays "handled" once opsctl acted on it (docs/health.md, "Handled events"):
#   window: a windowed count or increase; the same or a lower value within the window is the same event.
#   level:  a lifetime counter or a latched gauge; the same or a lower value is the same event until the
#           rule reads ok again.
MEMORY_KINDS = ("window", "level", "none")
# What a failure on many nodes at once points at: the nodes themselves, or a service they share (storage),
# which the circuit breaker then names instead of the nodes.
DOMAINS = ("node", "storage", "fabric")
_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,47}$")
# A range selector, [5m], or the range of a subquery, [5m:30s].
_RANGE = re.compile(r"\[(\d+[smhd])(?::\d*[smhd]?)?\]")
# The opposite of each comparison, to select the series that are certainly ok.
_NOT_OP = {">": "<=", ">=": "<", "<": ">=", "<=": ">", "==": "!=", "!=": "=="}
# The label that marks, in a run's answer for a rule, a series whose condition holds now but whose hold has
# not yet elapsed (Rule.pending_expr). Only the circuit breaker counts them: never a failure, never a drain.
PENDING_LABEL = "opsctl_pending"


@dataclass(frozen=True)
class Rule:
    id: str
    source: str  # the scrape job whose data the rule needs: "dcgm" or "node"
    device_label: str  # "gpu", "device" (an HCA) or "" for node-wide rules
    expr: str
    op: str
    threshold: float
    hold: str
    severity: str  # "fail" or "warn"
    action: str  # "drain" or "report"
    auto_resume: bool
    evidence: str
    description: str
    remediation: str
    xid: int | None = None
    # An XID family (xid: series): the code comes from each series, its `xid` label (the windowed count)
    # or its value (the last-XID gauge); opsctl/health/xid.py says which codes the family holds.
    xid_series: bool = False
    memory: str = "none"
    domain: str = "node"
    plot_expr: str = ""  # the value before the hold wrapper (dashboards plot it); "" when expr holds by itself
    # The device label values every node is expected to have a series for, healthy or not (the resume
    # evidence needs each of them): GPUs 0..gpus_per_node-1, the configured IB rails; () when unknown.
    devices: tuple[str, ...] = ()
    # How often a held rule's condition is sampled over its hold: prometheus.recording_interval (the scrape
    # interval unless set), so that the recorded and the direct path sample it alike.
    step: str = "30s"
    # The expression, op and threshold are the shipped catalog's (no catalog file or override replaced
    # them): the recording rules may then read its XID inputs from a stage shared with the other XID rules
    # (opsctl/health/xid_inputs.py), which knows the shipped expressions' shape.
    shipped: bool = False
    # The one value every healthy device reports, certainly ok (catalog.yaml, `healthy`), or None: the
    # recording rules judge only the series with another value.
    healthy: float | None = None
    # Stage 0 as the catalog spells it (`unhealthy`): the series of `(expr) != healthy`, joined over less;
    # "" for that expression itself. ${candidates} in it reads `candidates`, recorded first.
    unhealthy: str = ""
    # A filter over the fleet that keeps every series `unhealthy` needs, recorded as a step of its own
    # (catalog.yaml, `candidates`), so that the rest of stage 0 runs over the few it keeps; "" for none.
    candidates: str = ""

    def breaches(self, value: float) -> bool:
        return OPS[self.op](value, self.threshold)

    def alert_expr(self) -> str:
        """The series that breach, and those whose value is NaN or infinite (no comparison holds for NaN,
        so `(expr) > 0` alone would hide it and read it as ok): everything but the certainly-ok series."""
        if self.plot_expr:  # held by opsctl: the hold keeps only the series whose condition held
            return held_breaches(self.plot_expr, self.op, self.threshold, self.hold, self.step)
        ok = f"({self.expr}) {_NOT_OP[self.op]} {_number(self.threshold)} > -Inf < +Inf"
        return f"({self.expr}) unless ({ok})"

    def condition_expr(self) -> str:
        """What the first recording stage records every round: the series whose value is not certainly
        ok now (`condition`): the value before the hold for a held rule, the rule's own answer for one
        whose expr holds by itself. Empty for a healthy GPU."""
        return condition(self.plot_expr or self.expr, self.op, self.threshold)

    def unheld_expr(self) -> str:
        """The value without the hold wrapper, against the threshold: the series that breach at each moment
        (`opsctl why` reads a job's window with it, where one scrape's breach is evidence)."""
        return f"({self.plot_expr or self.expr}) {self.op} {_number(self.threshold)}"

    def pending_expr(self) -> str:
        """The series of a draining rule whose value breaches now, held or not, marked PENDING_LABEL="1": a
        fault that reaches many nodes over a few scrapes shows on all of them before its hold has elapsed
        on the first, and the circuit breaker counts them. "" for a rule that reports only, and for one
        whose expr holds by itself (a ${hold} window): it has no value without its hold."""
        if self.action != "drain" or not self.plot_expr:
            return ""
        return f'label_replace({self.unheld_expr()}, "{PENDING_LABEL}", "1", "", "")'

    def judged_expr(self) -> str:
        """What `opsctl health` asks for this rule, in one query: the series that breach after the hold, or
        are NaN or infinite (alert_expr(), as the recording rules compute it: `condition` for a rule that
        holds by itself), and pending_expr()'s beside them (the marker label keeps the two apart)."""
        breaches = self.alert_expr() if self.plot_expr else self.condition_expr()
        pending = self.pending_expr()
        return f"({breaches}) or {pending}" if pending else breaches

    def format_evidence(self, device: str, value: float) -> str:
        # Evidence goes into a capped drain reason: words and three significant digits (opsctl.health.units).
        return f"{device} {fill(self.evidence, value, self.threshold)}".strip()


def _number(value: float) -> str:
    """4.0 -> '4', 5e10 -> '50000000000', 0.25 -> '0.25': short, and valid PromQL."""
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:g}"


def _placeholders(config: Config, own_rule_xids: set[int]) -> dict[str, str]:
    jobs, by = config.prometheus.jobs, ", ".join(config.node_mapping.by)
    return {
        **_xid_placeholders(config, own_rule_xids),
        "dcgm": config.prometheus.jobs["dcgm"],
        "node": config.prometheus.jobs.get("node", ""),
        "by": ", ".join(config.node_mapping.by),
        "ib_devices": config.ib.rails_regex,
        "gpus_per_node": str(config.hardware.gpus_per_node),
        "ib_rate": _number(config.hardware.ib_rate_bytes_per_second),
        "compute_mode": str(COMPUTE_MODES.index(config.hardware.compute_mode)),
        "firmware_versions": firmware.versions(jobs["dcgm"], jobs.get("node", ""), by, config.hardware.firmware),
        "fleet_versions": firmware.versions(jobs["dcgm"], jobs.get("node", ""), by, {}, firmware.FLEET_COMPONENTS),
    }


def _xid_placeholders(config: Config, own_rule_xids: set[int]) -> dict[str, str]:
    """${xid_<family>_codes} (a label regex) for the XID families, and ${xid_<action>_gauge} (the last-XID
    gauge filtered to those codes) for those that drain: every code of NVIDIA's catalog whose action is
    <action> and that has no rule of its own (xid-79 ...); `report` holds the actions that are reported.
    ${xid_known_codes} and ${xid_unknown_gauge} select the codes the catalog does not know."""
    catalog = xid_catalog()
    gauge = f'DCGM_FI_DEV_XID_ERRORS{{job="{config.prometheus.jobs["dcgm"]}"}}'
    values = {}
    for family, codes in catalog.family_codes(own_rule_xids).items():
        values[f"xid_{family}_codes"] = code_regex(codes)
        if family in DRAIN_ACTIONS:  # the reported codes are never read from the gauge (catalog.yaml)
            values[f"xid_{family}_gauge"] = value_filter(gauge, codes)
    known = sorted(catalog.entries)
    values["xid_known_codes"] = code_regex(known)
    unknown_below = [code for code in range(1, known[-1]) if code not in catalog.entries]
    values["xid_unknown_gauge"] = f"({value_filter(gauge, unknown_below)} or {gauge} > {known[-1]})"
    return values


# libyaml's loader where PyYAML has it: the catalog is read on every run, --watch rounds included.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read(path: Path | Traversable, label: str) -> list[object]:
    try:
        text = path.read_text() if isinstance(path, Path) else path.read_text(encoding="utf-8")
        raw = yaml.load(text, Loader=_LOADER)
    except OSError as err:
        raise ConfigError(f"catalog {label}: cannot read ({err.strerror})") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"catalog {label}: not valid YAML") from err
    rules = raw.get("rules") if isinstance(raw, dict) else None
    if not isinstance(rules, list):
        raise ConfigError(f"catalog {label}: needs a top-level `rules:` list")
    return rules


def _expand(entry: object, label: str) -> list[RawRule]:
    """A `for_each: {xid: [..]}` entry becomes one rule per value, with ${xid} substituted."""
    if not isinstance(entry, dict):
        raise ConfigError(f"catalog {label}: every rule must be a mapping")
    unknown = set(entry) - RULE_KEYS
    if unknown:
        raise ConfigError(f"catalog {label}: rule {entry.get('id')!r} has unknown key {sorted(unknown)[0]!r}")
    loops = entry.get("for_each") or {}
    if not isinstance(loops, dict) or not all(isinstance(v, list) for v in loops.values()):
        raise ConfigError(f"catalog {label}: rule {entry.get('id')!r}: for_each must map names to lists")
    body = {k: v for k, v in entry.items() if k != "for_each"}
    out = []
    for combo in itertools.product(*loops.values()) if loops else [()]:
        values = {name: str(v) for name, v in zip(loops, combo, strict=True)}
        out.append(_substitute(body, values))
    return out


def _substitute(value: Any, values: dict[str, str]) -> Any:
    if isinstance(value, str):
        return Template(value).safe_substitute(values)
    if isinstance(value, dict):
        return {k: _substitute(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, values) for v in value]
    return value


def _build(raw: RawRule, config: Config, label: str, placeholders: dict[str, str], shipped: bool = False) -> Rule:
    rid = raw.get("id")
    where = f"catalog {label}: rule {rid!r}"
    if not isinstance(rid, str) or not _ID.match(rid):
        raise ConfigError(f"{where}: id must be lowercase letters, digits and dashes")
    variant = (raw.get("variants") or {}).get(config.catalog.xid_source) if raw.get("xid") is not None else None
    merged = {**raw, **(variant or {})}
    merged = _substitute(merged, placeholders)
    for key in ("expr", "op", "threshold", "severity", "action", "description", "remediation"):
        if merged.get(key) in (None, ""):
            raise ConfigError(f"{where}: missing key {key!r}")
    if merged["op"] not in OPS:
        raise ConfigError(f"{where}: op must be one of {' '.join(OPS)}")
    if merged["severity"] not in ("fail", "warn"):
        raise ConfigError(f"{where}: severity must be fail or warn")
    if merged["action"] not in ("drain", "report"):
        raise ConfigError(f"{where}: action must be drain or report")
    if merged["action"] == "drain" and merged["severity"] != "fail":
        raise ConfigError(f"{where}: only severity fail may drain")
    source = merged.get("source", "dcgm")
    if source not in ("dcgm", "node"):
        raise ConfigError(f"{where}: source must be dcgm or node")
    try:
        hold = effective_hold(str(merged.get("hold", "0s")), config)
        threshold = float(merged["threshold"])
        xid_series = merged.get("xid") == "series"
        xid = int(merged["xid"]) if merged.get("xid") is not None and not xid_series else None
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: {err}") from None
    raw_expr = " ".join(str(merged["expr"]).split())
    expr = Template(raw_expr).safe_substitute(hold=hold)
    if "${" in expr:
        raise ConfigError(f"{where}: unknown placeholder in expr: {expr[expr.index('${'):][:30]}")
    plot_expr = ""
    if "${hold}" not in raw_expr:
        plot_expr, expr = expr, held(expr, merged["op"], threshold, hold, str(config.prometheus.scrape_interval))
    healthy, unhealthy, candidates = _stage_zero(merged, threshold, hold, where)
    auto_resume = merged.get("auto_resume", True)
    if not isinstance(auto_resume, bool):
        raise ConfigError(f"{where}: auto_resume must be true or false")
    memory = merged.get("memory", "none")
    if memory not in MEMORY_KINDS:
        raise ConfigError(f"{where}: memory must be one of {', '.join(MEMORY_KINDS)}")
    domain = merged.get("domain", "node")
    if domain not in DOMAINS:
        raise ConfigError(f"{where}: domain must be one of {', '.join(DOMAINS)}")
    _check_windows(expr, config, where)
    evidence = str(merged.get("evidence", "value=${value}"))
    if unknown_formats(evidence):
        raise ConfigError(f"{where}: evidence: unknown format {unknown_formats(evidence)[0]} (one of "
                          f"{', '.join(FORMATS)})")
    return Rule(id=rid, source=source, device_label=str(merged.get("device_label", "")), expr=expr,
                op=merged["op"], threshold=threshold, hold=hold, severity=merged["severity"],
                action=merged["action"], auto_resume=auto_resume,
                evidence=evidence,
                description=" ".join(str(merged["description"]).split()),
                remediation=" ".join(str(merged["remediation"]).split()), xid=xid, xid_series=xid_series,
                memory=memory,
                domain=domain, plot_expr=plot_expr, devices=_devices(str(merged.get("device_label", "")), config),
                step=_duration(max(1, round(config.prometheus.recording_interval_seconds))), shipped=shipped,
                healthy=healthy, unhealthy=unhealthy, candidates=candidates)


def _stage_zero(merged: RawRule, threshold: float, hold: str, where: str) -> tuple[float | None, str, str]:
    """`healthy`, `unhealthy` and `candidates` (catalog.yaml): (None, "", "") where the rule has no healthy
    value, or where its op and threshold (an override) would call the healthy value a breach: the recording
    rules then judge every series."""
    try:
        healthy = None if merged.get("healthy") in (None, "") else float(merged["healthy"])
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: healthy: {err}") from None
    if healthy is None or healthy != healthy or OPS[merged["op"]](healthy, threshold):
        return None, "", ""
    unhealthy, candidates = (Template(" ".join(str(merged.get(key) or "").split())).safe_substitute(hold=hold)
                             for key in ("unhealthy", "candidates"))
    for key, text in (("unhealthy", unhealthy.replace(CANDIDATES_PLACEHOLDER, "")), ("candidates", candidates)):
        if "${" in text:
            raise ConfigError(f"{where}: unknown placeholder in {key}: {text[text.index('${'):][:30]}")
    if (CANDIDATES_PLACEHOLDER in unhealthy) != bool(candidates):
        raise ConfigError(f"{where}: candidates and {CANDIDATES_PLACEHOLDER} in unhealthy go together")
    return healthy, unhealthy, candidates


def _devices(label: str, config: Config) -> tuple[str, ...]:
    if label == "gpu":
        return tuple(str(gpu) for gpu in range(config.hardware.gpus_per_node))
    if label == "device":  # the rails that the rules see: hardware.ib_devices is PromQL-anchored
        return tuple(rail for rail in config.ib.rails if re.fullmatch(config.ib.rails_regex, rail))
    return ()


def effective_hold(hold: str, config: Config) -> str:
    """max(hold, 2 x prometheus.scrape_interval), in the rule's own spelling when that is longer."""
    floor = 2 * duration_seconds(config.prometheus.scrape_interval)
    return hold if duration_seconds(hold) >= floor else _duration(floor)


def _duration(seconds: int) -> str:
    """120 -> '2m', 90 -> '90s', 7200 -> '2h': a PromQL duration."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def condition(expr: str, op: str, threshold: float) -> str:
    """The series of `expr` whose value is not certainly ok: those that breach, and those whose value is
    NaN or infinite (no comparison holds for NaN, so `(expr) > t` alone would read it as ok), each with its
    own value, infinities included (MetricsQL drops NaN from answers, so an infinity must stay one).
    `expr` is evaluated twice for > and <, and never joined with itself over the fleet: the clamp keeps
    every value on the breaching side as it is and NaN as NaN (clamp_min(NaN, t) is NaN) and folds every
    ok value into the threshold, which `!= t` drops; the one infinity it would fold too is selected beside."""
    t = _number(threshold)
    if op == ">":
        return f"clamp_min({expr}, {t}) != {t} or ({expr}) == -Inf"
    if op == "<":
        return f"clamp_max({expr}, {t}) != {t} or ({expr}) == +Inf"
    if op == "!=":  # NaN != t and inf != t hold already
        return f"({expr}) != {t}"
    infinite = {">=": "== -Inf", "<=": "== +Inf", "==": "== -Inf or ({e}) == +Inf"}[op].format(e=expr)
    return f"({expr}) {op} {t} or ({expr}) {infinite} or ({expr}) * 0 != 0"


def least_breaching(window: str, op: str, threshold: float) -> str:
    """Over a window of values that are all not certainly ok, the one that breaches least. For == it is
    the maximum unless that is the threshold, then the minimum (the threshold only when every sample was).
    For != any: none equals the threshold."""
    if op in (">", ">="):
        return f"min_over_time({window})"
    if op in ("<", "<="):
        return f"max_over_time({window})"
    if op == "==":
        return f"(max_over_time({window}) != {_number(threshold)}) or min_over_time({window})"
    return f"max_over_time({window})"


def hold_samples(hold: str, step: str) -> int:
    """How many samples a held series needs: one every `step` over the hold, the first one included."""
    return -(-duration_seconds(hold) // duration_seconds(step)) + 1


def held(expr: str, op: str, threshold: float, hold: str, step: str) -> str:
    """`expr` held for `hold`, as a value of every series (the resume evidence, dashboards and `opsctl why`
    read it): per series, the value that breaches least over the hold (sampled every `step`, the scrape
    interval), so the value breaches only when every sample in the hold does; and only series that
    existed before the hold began. NaN stays NaN. The decision reads held_breaches(), the same hold as
    a filter that keeps only the series that are not certainly ok.
    For == the value is the maximum unless that is the threshold, then the minimum: it equals the
    threshold only when every sample did. For != it is the threshold when any sample equalled it."""
    window = f"({expr})[{hold}:{step}]"
    t = _number(threshold)
    if op in (">", ">="):
        value = f"min_over_time({window})"
    elif op in ("<", "<="):
        value = f"max_over_time({window})"
    elif op == "==":
        value = f"(max_over_time({window}) != {t}) or min_over_time({window})"
    else:
        value = f"min_over_time((({expr}) == {t})[{hold}:{step}]) or max_over_time({window})"
    return f"({value}) and count_over_time({window} offset {hold})"


def held_breaches(expr: str, op: str, threshold: float, hold: str, step: str) -> str:
    """`expr` held for `hold`: the series whose condition (`condition`: breaching, NaN or infinite) held at
    every one of the hold_samples() samples, `step` apart, that end now (the hold's first sample included,
    so a series that appeared breaching has held for no time at all), with its least breaching value.
    A sample of the subquery's own clock that is missing (the series did not exist, or was ok) fails the
    count. The recording rules compute the same from the condition they record at every `step`."""
    span = (hold_samples(hold, step) - 1) * duration_seconds(step) + duration_seconds(step)
    window = f"({condition(expr, op, threshold)})[{_duration(span)}:{step}]"
    every = f"scalar(count_over_time(vector(1)[{_duration(span)}:{step}]))"
    return f"({least_breaching(window, op, threshold)}) and (count_over_time({window}) >= {every})"


def _check_windows(expr: str, config: Config, where: str) -> None:
    """A range window shorter than two scrape intervals may hold no sample at all, and then the rule
    returns nothing for the node: it reads as ok. Refuse such a rule before it can. (${hold} is never
    that short: it is the effective hold. This catches a window written into the expr.)"""
    scrape = duration_seconds(config.prometheus.scrape_interval)
    for window in _RANGE.findall(expr):
        if duration_seconds(window) < 2 * scrape:
            raise ConfigError(f"{where}: its range window [{window}] is shorter than two scrape intervals "
                              f"(prometheus.scrape_interval {config.prometheus.scrape_interval}), so it may hold no "
                              f"sample and read as ok; make it at least {2 * scrape}s, or write [${{hold}}]")


def load_catalog(config: Config) -> list[Rule]:
    """Shipped rules, then each of catalog.files (same id replaces), then overrides and disable."""
    shipped = resources.files("opsctl.health").joinpath("catalog.yaml")
    sources: list[tuple[Path | Traversable, str]] = [(shipped, SHIPPED_LABEL)]
    sources += [(Path(f), f) for f in config.catalog.files]
    entries: dict[str, tuple[RawRule, str]] = {}
    for path, label in sources:
        for entry in _read(path, label):
            for raw in _expand(entry, label):
                entries[str(raw.get("id"))] = (raw, label)
    # Codes with a rule of their own, counted before catalog.disable: a disabled xid-79 must not come
    # back through the xid-reboot family.
    own_rule_xids = {int(raw["xid"]) for raw, _ in entries.values() if str(raw.get("xid", "")).isdigit()}
    replaced: set[str] = set()  # rules whose expression, op or threshold an override replaced
    if config.hardware.firmware and firmware.RULE in entries:  # a pinned version is what every GPU must run
        raw, label = entries[firmware.RULE]
        entries[firmware.RULE] = ({**raw, **firmware.PINNED}, label)
    for rid, fields in config.catalog.overrides.items():
        rid = RENAMED.get(rid, rid)
        if rid not in entries:
            raise ConfigError(f"config key catalog.overrides.{rid}: no such rule")
        if not isinstance(fields, dict) or not set(fields) <= OVERRIDABLE:
            bad = sorted(set(fields) - OVERRIDABLE)[0] if isinstance(fields, dict) else ""
            raise ConfigError(f"config key catalog.overrides.{rid}.{bad}: not overridable "
                              f"(allowed: {', '.join(sorted(OVERRIDABLE))})")
        raw, label = entries[rid]
        # An override of expr/op/threshold must win over the gauge variant as well.
        variants = {name: {f: v for f, v in var.items() if f not in fields}
                    for name, var in (raw.get("variants") or {}).items()}
        # A shipped `unhealthy` is spelled after the shipped expr: an override of expr drops it, and
        # `candidates` goes with the `unhealthy` it was spelled for.
        dropped = {"unhealthy": "", "candidates": ""} if "expr" in fields else {}
        if "unhealthy" in fields and "candidates" not in fields:
            dropped["candidates"] = ""
        entries[rid] = ({**raw, **dropped, **fields, "variants": variants}, label)
        if set(fields) & {"expr", "op", "threshold"}:
            replaced.add(rid)
    for rid in (RENAMED.get(r, r) for r in config.catalog.disable):
        if rid not in entries:
            raise ConfigError(f"config key catalog.disable: no such rule {rid!r}")
        del entries[rid]
    if "node" not in config.prometheus.jobs:
        # A site without node_exporter (prometheus.jobs.node: null): the rules that read it are off.
        entries = {rid: entry for rid, entry in entries.items() if entry[0].get("source", "dcgm") != "node"}
    placeholders = _placeholders(config, own_rule_xids)
    rules = [_build(raw, config, label, placeholders, shipped=label == SHIPPED_LABEL and rid not in replaced)
             for rid, (raw, label) in entries.items()]
    return rules


promql_number = _number  # for the recording rules (opsctl.health.precomputed): the same spelling
promql_duration = _duration
