"""Fakes of opsctl's own Protocols (PromQuery, Slurm) for the unit tier. The component and lab tiers
prove the same behaviour against a real Prometheus, VictoriaMetrics and three Slurm releases.

FakeProm answers each query the way Prometheus would for a described cluster: every node has a dcgm
and a node target labelled node=<name>; `breach(rule, node, device, value)` makes a rule's alert
expression return that series; `pending(rule, node, device, value)` makes it breach now with its hold
not yet elapsed (the run's query for the rule returns it marked as pending, as does a recording
expression that asks for it); `value(...)` sets what the rule's own expression (positive evidence)
returns for a node, which by default is a healthy value for every node.
"""

import json
import re
import signal
from dataclasses import replace

from click.testing import CliRunner

from opsctl.cli import main
from opsctl.clients import Clients
from opsctl.config import parse_config
from opsctl.errors import SourceUnavailable
from opsctl.health import precomputed
from opsctl.health.catalog import PENDING_LABEL, Rule, load_catalog
from opsctl.health.identity import SELF_METRICS
from opsctl.prom.client import Sample
from opsctl.slurm.base import SlurmNode

DEVICE = {"gpu": "0", "device": "mlx5_0", "finding": "ib-port-state mlx5_0", "mount": "/home",
          "target": "lustre-OST0002", "nid": "10.0.0.1@o2ib",
          "firmware": "gpu0 vbios 96.00.89.00.01 (most run 96.00.A5.00.03)", "nvlink": "gpu0 link3",
          "pcie": "gpu0", "": ""}


def devices(rule: Rule) -> list[str]:
    """The devices a healthy node has a series for: every one the config expects (Rule.devices), else one."""
    return list(rule.devices) or [DEVICE[rule.device_label]]


def ok_value(rule: Rule) -> float:
    """A value the rule does not breach."""
    return {">": rule.threshold, ">=": rule.threshold - 1, "<": rule.threshold, "<=": rule.threshold + 1,
            "==": rule.threshold + 1, "!=": rule.threshold}[rule.op]


class FakeProm:
    def __init__(self, config, nodes):
        self.config = config
        self.rules = load_catalog(config)
        self.nodes = list(nodes)
        self.up = {(n, s): 1.0 for n in self.nodes for s in config.prometheus.jobs}
        self.age = {}
        self.breaching: dict[str, list[tuple[str, str, float]]] = {}
        self.pending_now: dict[str, list[tuple[str, str, float]]] = {}  # breach now, hold not yet elapsed
        self.raw: dict[str, dict[str, list[tuple[str, float]]]] = {}  # rule -> node -> [(device, value)]
        self.reported: dict[str, str] = {}  # node -> name its dcgm target reports (Hostname)
        self.xid_metrics = set(SELF_METRICS)
        self.partial: list[str] = []
        self.fail_with: Exception | None = None
        self.queries = 0
        self.warnings: list[str] = []
        self.asked: list[str] = []
        self.asked_at: list[float | None] = []  # the `at` of each query in `asked`
        # Rule results that Prometheus recorded (opsctl.health.precomputed): rule id -> heartbeat age, or
        # "other" for a heartbeat of another expression. All rules fresh, as the Prometheus role installs them;
        # {}: no recording rules loaded.
        self.recorded: dict[str, float | str] = {}
        self.now = 1_750_000_000.0
        self.record_all()

    def breach(self, rule_id, node, device=None, value=1.0):
        rule = self.rule(rule_id)
        device = DEVICE[rule.device_label] if device is None else device
        self.breaching.setdefault(rule_id, []).append((node, device, value))
        self.value(rule_id, node, value, device)

    def pending(self, rule_id, node, device=None, value=1.0):
        rule = self.rule(rule_id)
        device = DEVICE[rule.device_label] if device is None else device
        self.pending_now.setdefault(rule_id, []).append((node, device, value))
        self.value(rule_id, node, value, device)

    def _answer(self, rule, pending: bool):
        """The held breaches, and with `pending` every series that breaches now, held or not, marked
        (Rule.pending_expr selects a held breach as well: its condition holds now too)."""
        held = [self._series(rule, n, d, v) for n, d, v in self.breaching.get(rule.id, [])]
        if not pending:
            return held
        now = self.breaching.get(rule.id, []) + self.pending_now.get(rule.id, [])
        return held + [Sample({**s.labels, PENDING_LABEL: "1"}, s.value)
                       for s in (self._series(rule, n, d, v) for n, d, v in now)]

    def value(self, rule_id, node, value, device=None):
        rule = self.rule(rule_id)
        device = DEVICE[rule.device_label] if device is None else device
        self.raw.setdefault(rule_id, {})[node] = [(device, value)]

    def vanish(self, rule_id, node):
        self.raw.setdefault(rule_id, {})[node] = []

    def rule(self, rule_id) -> Rule:
        return next(r for r in self.rules if r.id == rule_id)

    def _labels(self, node, source, extra=None):
        job = self.config.prometheus.jobs[source]
        return {"node": node, "job": job, "instance": f"{node}:{9400 if source == 'dcgm' else 9100}", **(extra or {})}

    def _series(self, rule, node, device, value):
        extra = {rule.device_label: device} if rule.device_label else {}
        if rule.xid is not None:
            extra["window_size_in_ms"] = "300000"
        return Sample(self._labels(node, rule.source, extra), value)

    def query_many(self, exprs, at=None):
        return [self.query(e, at) for e in exprs]

    def query(self, expr, at=None):
        self.queries += 1
        self.asked.append(expr)
        self.asked_at.append(at)
        if self.fail_with is not None:
            raise self.fail_with
        self.warnings.extend(f"{expr[:20]!r}: {w}" for w in self.partial)
        if expr.startswith(("up{", "min_over_time(up{")):
            return [Sample(self._labels(n, s), v, at if at is not None else self.now) for (n, s), v in self.up.items()]
        if expr.startswith("time() - timestamp("):
            return [Sample(self._labels(n, s), self.age.get((n, s), 3.0)) for (n, s) in self.up]
        if expr.startswith("group by (job, instance"):
            return [Sample(self._labels(n, "dcgm", {"__name__": m, "Hostname": self.reported.get(n, n)}), 1.0)
                    for n in self.nodes if (n, "dcgm") in self.up for m in sorted(self.xid_metrics)]
        if expr == precomputed.QUERY:
            return self._recorded()
        if expr == "count by (job) (up)":
            return [Sample({"job": job}, 1.0) for job in ("dcgm", "node", "other")]
        for rule in self.rules:
            if expr in (rule.alert_expr(), rule.judged_expr()):
                return self._answer(rule, pending=bool(rule.pending_expr()) and rule.pending_expr() in expr)
            if expr == rule.expr:
                raw = self.raw.get(rule.id, {})
                return [self._series(rule, n, d, v) for n in self.nodes
                        for d, v in raw.get(n, [(d, ok_value(rule)) for d in devices(rule)])]
        raise AssertionError(f"FakeProm: unexpected query {expr!r}")

    def record_all(self, age: float = 1.0) -> None:
        self.recorded = {rule.id: age for rule in self.rules}

    def _recorded(self):
        out = []
        for rule in self.rules:
            age = self.recorded.get(rule.id)
            if age is None:
                continue
            tags = {precomputed.RULE_LABEL: rule.id,
                    precomputed.EXPR_LABEL: "0" * 16 if age == "other" else precomputed.expr_hash(rule)}
            beat = self.now - (0.0 if age == "other" else float(age))
            out.append(Sample({**tags, precomputed.HEARTBEAT_LABEL: "1"}, beat, at=self.now))
            # Prometheus records what the recording expression selects: the pending series where it asks.
            pending = bool(rule.pending_expr())  # stage 2 records the pending series of every draining rule
            out += [Sample({**s.labels, **tags, "__name__": precomputed.RECORD}, s.value, at=self.now)
                    for s in self._answer(rule, pending)]
        return out


def expand(hostlist: str) -> list[str]:
    """gpu[001-003,007],gpu010 -> names (Slurm's own syntax, enough of it for the tests)."""
    names = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", hostlist):
        match = re.match(r"^(.*)\[(.*)\]$", part)
        if not match:
            names.append(part)
            continue
        prefix, ranges = match.groups()
        for item in ranges.split(","):
            lo, _, hi = item.partition("-")
            names += [f"{prefix}{i:0{len(lo)}d}" for i in range(int(lo), int(hi or lo) + 1)]
    return names


class FakeSlurm:
    """Slurm state in memory; records every change. `fail_change` makes the n-th change fail as scontrol
    would, `raise_on_change` makes the second and later changes raise it (a bug, a full disk), and
    `sigterm_on_read` sends SIGTERM on that read of the nodes (as systemd stops a --watch unit)."""

    def __init__(self, nodes: dict[str, SlurmNode]):
        self.state = dict(nodes)
        self.calls: list[tuple] = []
        self.reads = 0
        self.fail_change: int | None = None
        self.raise_on_change: Exception | None = None
        self.sigterm_on_read: int | None = None
        self.return_to_service_value = 1  # slurm.conf's ReturnToService (the slurm_common role's)
        self.config_reads = 0

    def nodes(self):
        self.reads += 1
        if self.sigterm_on_read == self.reads:
            signal.raise_signal(signal.SIGTERM)
        return dict(self.state)

    def _change(self, call, names, fields):
        self.calls.append(call)
        if self.fail_change is not None and len(self.calls) == self.fail_change:
            raise SourceUnavailable("Slurm: scontrol update failed: Invalid node state specified")
        if self.raise_on_change is not None and len(self.calls) >= 2:
            raise self.raise_on_change
        for name in names:
            self.state[name] = replace(self.state[name], **fields(self.state[name]))

    def drain(self, names, reason):
        self._change(("drain", tuple(names), reason), names,
                     fields=lambda n: {"flags": tuple(dict.fromkeys((*n.flags, "DRAIN"))), "reason": reason})

    def resume(self, names):
        self._change(("resume", tuple(names)), names,
                     fields=lambda n: {"flags": tuple(f for f in n.flags if f != "DRAIN"), "reason": ""})

    def set_reason(self, names, reason):
        self._change(("reason", tuple(names), reason), names, fields=lambda n: {"reason": reason})

    def reboot(self, names, reason):
        self._change(("reboot", tuple(names), reason), names,
                     fields=lambda n: {"flags": tuple(dict.fromkeys((*n.flags, "REBOOT_REQUESTED"))), "reason": reason})

    def return_to_service(self):
        self.config_reads += 1
        return self.return_to_service_value

    def expand(self, hostlist):
        return expand(hostlist)


def gpu_nodes(n=64, **over):
    """n idle GPU nodes gpu001..; over: {name: SlurmNode} replaces some."""
    nodes = {f"gpu{i:03d}": SlurmNode(f"gpu{i:03d}", "idle", partitions=("gpu",), gres="gpu:h200:8")
             for i in range(1, n + 1)}
    nodes.update(over)
    return nodes


def node(name, state="idle", flags=(), reason="", partitions=("gpu",)):
    return SlurmNode(name, state, tuple(flags), reason, partitions=partitions, gres="gpu:h200:8")


def run_with_results(tmp_path, command: list[str], results, slurm, *args):
    """`opsctl <command> --results FILE *args`, FILE holding `results` as JSON, with a state directory and an
    audit log of its own under tmp_path: (click's result, the config)."""
    config = parse_config({}, "t", env={"OPSCTL_STATE_DIR": str(tmp_path / "state"),
                                        "OPSCTL_AUDIT_LOG": str(tmp_path / "audit.jsonl")})
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    result = CliRunner().invoke(main, [*command, "--results", str(path), *args],
                                obj=Clients(config=config, slurm=slurm))
    return result, config


IB_REASON = "opsctl:ib-down mlx5_0 state_id=1"
ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


class World:
    """A 64-node cluster, its Prometheus and Slurm, and a state directory."""

    def __init__(self, tmp_path, n=64, raw=None, **slurm_over):
        self.tmp = tmp_path
        # No metrics address: a unit test opens no socket (a --watch would serve /metrics by default).
        raw = {"metrics": {"listen_address": None}, **(raw or {})}
        self.config = parse_config(raw, "t", {"OPSCTL_STATE_DIR": str(tmp_path / "state")})
        self.slurm = FakeSlurm(gpu_nodes(n, **slurm_over))
        self.prom = FakeProm(self.config, list(self.slurm.state))
        self.power = None  # the nodes' BMCs, where a test hands a fake

    def run(self, *args):
        res = CliRunner().invoke(main, list(args), obj=Clients(self.config, self.prom, self.slurm, power=self.power))
        self.stdout, self.stderr = res.stdout, res.stderr
        return res.exit_code

    def json(self, *args):
        code = self.run("health", "--json", *args)
        doc = json.loads(self.stdout)
        return code, {n["node"]: n for n in doc["nodes"]}, doc["summary"]

    def audit(self):
        path = self.tmp / "state" / "audit.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class RecordedPower:
    """What the lab BMC's listener did to the nodes (opsctl_lab.bmc.LabNodes), recorded."""

    def __init__(self) -> None:
        self.actions: list[tuple[str, str]] = []

    def power_off(self, node: str) -> None:
        self.actions.append(("Off", node))

    def power_on(self, node: str) -> None:
        self.actions.append(("On", node))
