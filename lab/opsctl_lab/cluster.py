"""`opsctl lab up|down|status|env|inject|clear`: the simulated cluster on this host.

up: munged, MariaDB and slurmdbd (the accounting), slurmctld and one slurmd per node (real Debian Slurm),
the dcgm-exporter emulator, one real node_exporter per node, the nodes' BMC (a Redfish emulator, when
sushy-tools is installed: opsctl_lab.bmc), a real Prometheus and a read-only
`opsctl health --watch` whose metrics Prometheus scrapes; then waits until every node is idle in sinfo
and every target is up. Running it again with the lab up changes nothing.
"""

import json
import os
import shutil
import time
from collections.abc import Callable

import click
import yaml

from opsctl.errors import ExitCode
from opsctl_lab import accounting, bmc, fabric_lab, processes, prometheus_lab, slurm_lab
from opsctl_lab import paths as lp
from opsctl_lab.errors import LabError
from opsctl_lab.hardware import FAULTS, MONITORING_SERVICES, NodeHardware, parse_fault, write_kernel_log
from opsctl_lab.hardware import fault_label as _fault_label
from opsctl_lab.ib_sysfs import write_tree
from opsctl_lab.storage_view import write_storage

REQUIRED_PROGRAMS = {
    "munged": "munge", "mariadbd": "mariadb-server", "slurmdbd": "slurmdbd", "slurmctld": "slurmctld",
    "slurmd": "slurmd", "sinfo": "slurm-client", "scontrol": "slurm-client", "sacct": "slurm-client",
    "prometheus": "prometheus", prometheus_lab.NODE_EXPORTER: "prometheus-node-exporter",
}
READY_TIMEOUT_S = 120
# How often the lab's read-only `opsctl health --watch` judges the cluster: twice as often as the health
# timer of a head node (each minute). Each round is some fifty queries over 64 nodes' series, about 1.3 s of
# Prometheus CPU: every 2 scrape intervals (10 s) that would be an eighth of a core for the lab's whole life,
# three times what its scrapes cost.
WATCH_INTERVAL_S = 30


def _paths() -> lp.LabPaths:
    return lp.LabPaths(lp.lab_dir())


def _lab_state(paths: lp.LabPaths) -> dict[str, int] | None:
    try:
        state: dict[str, int] = json.loads(paths.state_file.read_text())  # {nodes, scrape_interval, slot}
        return state
    except FileNotFoundError:
        return None
    except ValueError as err:
        raise LabError(f"{paths.state_file} is corrupt ({err}); run `opsctl lab down`") from err


def _expected_daemons(nodes: int, paths: lp.LabPaths) -> list[str]:
    names = ["munged", "mariadb", "slurmdbd", "slurmctld", "dcgm-emulator", "prometheus", "opsctl-watch",
             "opsctl-why"]
    for index in range(nodes):
        name = lp.node_name(index)
        names.append(f"slurmd.{name}")
        if not NodeHardware.load(paths.hardware(name), name).node_fault("exporter-down"):
            names.append(f"node_exporter.{name}")
    return names


def _preflight() -> None:
    if os.geteuid() != 0:
        raise LabError("opsctl lab needs root (munged, slurmd and the GPU device nodes); run it as root")
    missing = sorted({pkg for prog, pkg in REQUIRED_PROGRAMS.items() if shutil.which(prog) is None})
    if missing:
        raise LabError(f"missing Debian packages: {' '.join(missing)} (`make deps-lab` installs them)")


def up(nodes: int = 64, scrape_interval: int = 5) -> ExitCode:
    _preflight()
    started = time.monotonic()
    paths = _paths()
    state = _lab_state(paths)
    wanted = {"nodes": nodes, "scrape_interval": scrape_interval, "slot": lp.slot()}
    if state and {**wanted, "slot": 0, **state} != wanted and processes.running(paths.run):
        raise LabError(f"the lab runs with {state['nodes']} nodes at {state['scrape_interval']} s in slot "
                       f"{state.get('slot', 0)}; run `opsctl lab down` first to change that")
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.state_file.write_text(json.dumps(wanted))
    phases: list[tuple[str, float]] = []

    def phase(name: str, func: Callable[..., object], *args: object) -> None:
        t0 = time.monotonic()
        func(*args)
        phases.append((name, time.monotonic() - t0))

    phase("slurm config", slurm_lab.render_configs, paths, nodes)
    # A training job's rank that dies when its GPU fails (opsctl_lab.hwtools.train), for `opsctl why`.
    prometheus_lab.write_node_tool(paths, "train")
    phase("munge", slurm_lab.start_munge, paths)
    phase("accounting", accounting.start, paths)
    phase("slurm", slurm_lab.start_slurm, paths, nodes)
    phase("emulated hardware", prometheus_lab.prepare_nodes, paths, nodes)
    fabric_lab.write_fabric(paths, nodes)
    phase("dcgm-exporter emulator", prometheus_lab.start_dcgm_emulator, paths, nodes)
    phase("node_exporters", _start_node_exporters, paths, nodes)
    phase("bmc", _start_bmc, paths, nodes)
    phase("prometheus", _start_prometheus, paths, nodes, scrape_interval)
    _write_opsctl_config(paths, scrape_interval)
    prometheus_lab.start_why_spool(paths)
    # opsctl refuses a Prometheus without targets of its jobs (a config error, exit 2): its --watch
    # starts once every exporter is scraped.
    phase("targets", wait_ready, paths, nodes, READY_TIMEOUT_S, False)
    phase("opsctl --watch", prometheus_lab.start_opsctl_watch, paths, WATCH_INTERVAL_S)
    phase("ready", wait_ready, paths, nodes)
    for name, seconds in phases:
        click.echo(f"  {name:24} {seconds:6.1f} s")
    states = slurm_lab.node_states(paths)
    faults = {n: [_fault_label(f) for f in NodeHardware.load(paths.hardware(n), n).active] for n in states}
    faults[fabric_lab.FABRIC] = fabric_lab.faults(paths)
    up_count = sum(1 for t in prometheus_lab.targets() if t.get("health") == "up")
    for line in ready_report(states, faults, up_count, time.monotonic() - started):
        click.echo(line)
    click.echo('use it: eval "$(opsctl lab env)"')
    return ExitCode.OK


def _start_node_exporters(paths: lp.LabPaths, nodes: int) -> None:
    for index in range(nodes):
        name = lp.node_name(index)
        if not NodeHardware.load(paths.hardware(name), name).node_fault("exporter-down"):
            prometheus_lab.start_node_exporter(paths, index)


def _start_bmc(paths: lp.LabPaths, nodes: int) -> None:
    missing = bmc.start(paths, nodes)
    if missing:
        click.echo(f"no BMC in the lab: {missing}; the remediation ladder has no power rung here")


def _start_prometheus(paths: lp.LabPaths, nodes: int, scrape_interval: int) -> None:
    prometheus_lab.write_prometheus_config(paths, nodes, scrape_interval)
    prometheus_lab.start_prometheus(paths)


def _write_opsctl_config(paths: lp.LabPaths, scrape_interval: int) -> None:
    # The lab's state directory is its config's own, as a cluster's is: OPSCTL_STATE_DIR (`opsctl lab env`)
    # names the same one, so that actions accept it (opsctl refuses a private state directory for them).
    # The lab's Prometheus loads no recording rules: its runs query every rule (recording_rules off), so
    # that a fault shows one recording interval sooner and no run notes the missing rules.
    config = {"prometheus": {"url": prometheus_lab.prometheus_url(), "scrape_interval": f"{scrape_interval}s",
                             "recording_rules": "off"},
              "slurm": {"backend": "cli"}, "metrics": {"listen_address": lp.opsctl_metrics_listen()},
              # The lab's Slurm has no PMIx library: the emulated ranks need none.
              "validate": {"job_command": prometheus_lab.validate_job_command(paths),
                           "all_reduce_perf": str(prometheus_lab.write_node_tool(paths, "all_reduce_perf")),
                           "srun_mpi": "none"},
              # The head's ibnetdiscover of each rail: the lab fabric's (opsctl_lab.fabric_lab).
              "ib": {"ibnetdiscover": str(fabric_lab.write_ibnetdiscover(paths))},
              # A job requeued once without its culprit is left ended when it fails again: the cap shows
              # within one requeue (the default, 2, would take a third failure).
              "recover": {"max_requeues": 1},
              "state_dir": str(paths.opsctl_state), "audit_log": str(paths.opsctl_state / "audit.jsonl")}
    # The nodes' BMC, for the ladder's power cycle: none (no power rung) where sushy-tools is not installed.
    bmc_config = bmc.opsctl_config(paths)
    if bmc_config:
        config["bmc"] = bmc_config
    paths.opsctl_config.write_text(yaml.safe_dump(config, sort_keys=False))
    paths.opsctl_state.mkdir(parents=True, exist_ok=True)


def wait_ready(paths: lp.LabPaths, nodes: int, timeout: float = READY_TIMEOUT_S, watch: bool = True) -> None:
    """Every node idle (or as its drains, or opsctl's remediation ladder, leave it) in sinfo, every target that
    should answer up; with `watch`, also opsctl's --watch running and scraped."""
    deadline = time.monotonic() + timeout
    problem: str | None = "not started"
    while time.monotonic() < deadline:
        problem = _not_ready(paths, nodes, watch)
        if problem is None:
            return
        time.sleep(0.25)
    raise LabError(f"lab not ready after {timeout:.0f} s: {problem} (logs in {paths.logs})")


def _not_ready(paths: lp.LabPaths, nodes: int, watch: bool = True) -> str | None:
    expected = [name for name in _expected_daemons(nodes, paths) if watch or name != "opsctl-watch"]
    dead = [name for name in expected if name not in processes.running(paths.run)]
    if dead:
        return f"not running: {', '.join(dead[:5])}"
    states = slurm_lab.node_states(paths)
    down = any(state == "down" for state in states.values())
    unsettled = slurm_lab.unsettled(states, slurm_lab.ladder_down(paths) if down else set())
    if len(states) < nodes or unsettled:
        return f"{len(states) - len(unsettled)}/{nodes} nodes settled in sinfo"
    silent = {name for name in (lp.node_name(i) for i in range(nodes))
              if NodeHardware.load(paths.hardware(name), name).node_fault("exporter-down")}
    targets = prometheus_lab.targets()
    exporters = [t for t in targets if t.get("labels", {}).get("job") in ("dcgm", "node")]
    want = 2 * nodes - 2 * len(silent)
    up_count = sum(1 for t in exporters if t.get("health") == "up")
    if len(exporters) < 2 * nodes or up_count < want:
        return f"{up_count}/{want} Prometheus targets up"
    if watch and not any(t.get("labels", {}).get("job") == "opsctl" and t.get("health") == "up" for t in targets):
        return "opsctl --watch not scraped yet"
    return None


def down() -> ExitCode:
    paths = _paths()
    stopped = processes.stop_all(paths.run)
    paths.state_file.unlink(missing_ok=True)
    click.echo(f"lab down: stopped {len(stopped)} processes")
    return ExitCode.OK


def status() -> ExitCode:
    paths = _paths()
    state = _lab_state(paths)
    running = processes.running(paths.run)
    if not state:
        click.echo(f"lab not running ({paths.root})" + (f"; {len(running)} stray processes" if running else ""))
        return ExitCode.FAILING
    nodes = state["nodes"]
    expected = _expected_daemons(nodes, paths)
    groups: dict[str, tuple[int, int]] = {}  # kind: (expected, running)
    for name in expected:
        kind = name.split(".")[0]
        total, alive = groups.get(kind, (0, 0))
        groups[kind] = (total + 1, alive + (name in running))
    click.echo(f"lab {paths.root}: {nodes} nodes, scrape interval {state['scrape_interval']} s")
    for kind, (total, alive) in groups.items():
        click.echo(f"  {kind:16} {alive}/{total} running")
    states = slurm_lab.node_states(paths)
    summary: dict[str, int] = {}
    for st in states.values():
        summary[st] = summary.get(st, 0) + 1
    click.echo("  sinfo            " + (", ".join(f"{n} {s}" for s, n in sorted(summary.items())) or "no answer"))
    targets = prometheus_lab.targets()
    click.echo(f"  prometheus       {prometheus_lab.prometheus_url()}: "
               f"{sum(t.get('health') == 'up' for t in targets)}/{len(targets)} targets up")
    faulty = [(n, hw.active) for n in states for hw in [NodeHardware.load(paths.hardware(n), n)] if hw.active]
    for node, faults in faulty:
        click.echo(f"  faults {node}: " + ", ".join(_fault_label(f) for f in faults))
    if fabric_lab.faults(paths):
        click.echo(f"  faults {fabric_lab.FABRIC}: " + ", ".join(fabric_lab.faults(paths)))
    return ExitCode.OK if all(alive == total for total, alive in groups.values()) else ExitCode.FAILING


def ready_report(states: dict[str, str], faults: dict[str, list[str]], targets_up: int, seconds: float) -> list[str]:
    """What `lab up` found, as it is: nodes by their sinfo state (never "idle" for one that is not), each
    node that is not idle, and each fault still injected (a lab keeps both across `down` and `up`)."""
    by_state: dict[str, list[str]] = {}
    for node, state in sorted(states.items()):
        by_state.setdefault(state, []).append(node)
    most_first = sorted(by_state.items(), key=lambda item: (-len(item[1]), item[0]))
    counts = ", ".join(f"{len(names)} {state}" for state, names in most_first)
    lines = [f"lab ready: {len(states)} nodes ({counts}), {targets_up} targets up, in {seconds:.1f} s"]
    lines += [f"  {state:8} {', '.join(names)}" for state, names in sorted(by_state.items()) if state != "idle"]
    lines += [f"  faults {node}: {', '.join(labels)}" for node, labels in sorted(faults.items()) if labels]
    return lines


def reset() -> ExitCode:
    """Back to a clean lab: every fault cleared and the emulated hardware as new (counters that past
    faults raised back at their base), every node back in service (drained or down, by whoever), no job
    and no reservation left, the lab's opsctl state and audit log emptied, and, when the hardware had a
    past, Prometheus' history of it too (a rule over a window would still see it). Says what it cleared."""
    paths = _paths()
    state = _lab_state(paths)
    if not state:
        raise LabError("the lab is not running; start it with `opsctl lab up`")
    names = [lp.node_name(i) for i in range(state["nodes"])]
    lines = []
    worn = []
    for index, node in enumerate(names):
        hw = NodeHardware.load(paths.hardware(node), node)
        if hw.active:
            lines.append(f"cleared {node}: " + ", ".join(_fault_label(f) for f in hw.active))
        running = dict.fromkeys(MONITORING_SERVICES, True)  # as prometheus_lab.prepare_nodes starts them
        if hw.active or hw.accum or hw.last_xid or hw.monitoring != running:
            worn.append(node)
            fresh = NodeHardware(node=node, minors=hw.minors, monitoring=running)
            fresh.save(paths.hardware(node))
            write_tree(paths.sysfs(node), fresh)
            write_storage(paths.storage(node), prometheus_lab.mount_base(paths, node), fresh)
        if hw.active:
            prometheus_lab.start_node_exporter(paths, index)  # an exporter-down fault had stopped it
    cleared_fabric = fabric_lab.clear(paths)
    if cleared_fabric:
        lines.append(f"cleared {fabric_lab.FABRIC}: " + ", ".join(cleared_fabric))
    # What `opsctl node check` wrote for a node's textfile collector describes the past now, and so does
    # Prometheus' record of it: a series last scraped before a restart reads as current for the lookback
    # (5 minutes), as no staleness marker ends it.
    checked = sorted(node for node in names if any(paths.textfile(node).glob("*.prom")))
    for node in checked:
        for result in paths.textfile(node).glob("*.prom"):
            result.unlink()
    if checked:
        lines.append(f"removed the node check results of {len(checked)} node(s): {', '.join(checked)}")
    worn = sorted(set(worn) | set(checked) | prometheus_lab.nodes_with("opsctl_node_check"))
    # Only a node out of service (drain, drng, down*, fail, ...) is resumed.
    out = {n: s for n, s in slurm_lab.node_states(paths).items() if slurm_lab.is_out_of_service(s)}
    if out:
        slurm_lab.resume(paths, sorted(out))
        lines.append("resumed " + ", ".join(f"{n} ({s})" for n, s in sorted(out.items())))
    # A job or a reservation outlives its maker when that stopped halfway (a preflight's reservation holds
    # its nodes for hours; a held or pending job starts on the next idle nodes).
    left = slurm_lab.jobs(paths)
    if left:
        slurm_lab.cancel(paths, left)
        lines.append(f"cancelled {len(left)} job(s): {', '.join(left)}")
    for name, nodes in sorted(slurm_lab.reservations(paths).items()):
        slurm_lab.delete_reservation(paths, name)
        lines.append(f"deleted reservation {name} ({nodes})")
    emptied = sorted(p.name for p in paths.opsctl_state.iterdir()) if paths.opsctl_state.is_dir() else []
    if emptied:
        shutil.rmtree(paths.opsctl_state)
        paths.opsctl_state.mkdir(parents=True)
        lines.append(f"emptied the opsctl state and audit log in {paths.opsctl_state}: {', '.join(emptied)}")
    if worn:
        # As `up` starts them: opsctl's --watch ends when Prometheus goes away, and starts again once
        # every exporter is scraped.
        processes.stop("opsctl-watch", paths.run)
        prometheus_lab.forget_history(paths)
        wait_ready(paths, state["nodes"], READY_TIMEOUT_S, False)
        prometheus_lab.start_opsctl_watch(paths, WATCH_INTERVAL_S)
        wait_ready(paths, state["nodes"])
        lines.append(f"emptied Prometheus' history of past faults on {len(worn)} node(s): {', '.join(worn)}")
    for line in lines or ["the lab was clean"]:
        click.echo(line)
    return ExitCode.OK


def env() -> ExitCode:
    paths = _paths()
    exports: dict[str, object] = {
        "OPSCTL_LAB_DIR": paths.root,
        "OPSCTL_CONFIG": paths.opsctl_config,
        "SLURM_CONF": paths.slurm_conf,
        "OPSCTL_STATE_DIR": paths.opsctl_state,
    }
    if lp.slot():
        exports["OPSCTL_LAB_SLOT"] = lp.slot()
    for key, value in exports.items():
        click.echo(f"export {key}={value}")
    return ExitCode.OK


def _names(paths: lp.LabPaths) -> list[str]:
    state = _lab_state(paths)
    if not state:
        raise LabError("the lab is not running; start it with `opsctl lab up`")
    return [lp.node_name(i) for i in range(state["nodes"])]


def _node_index(paths: lp.LabPaths, node: str) -> int:
    names = _names(paths)
    if node not in names:
        raise LabError(f"no lab node {node!r}: the lab has {names[0]}..{names[-1]}")
    return names.index(node)


ALL_NODES = "all"


def inject(node: str, fault: str, gpu: int | None = None, hca: str | None = None) -> ExitCode:
    """NODE `all`: every node at once, as a shared service failing does (a Lustre OST down for all); NODE
    `fabric`: a fault of the InfiniBand fabric itself (uplink-down:<leaf>)."""
    spec, _ = parse_fault(fault)
    if (node == fabric_lab.FABRIC) != (spec.target == "fabric"):
        raise LabError(f"{fault} is a fault of the fabric: `opsctl lab inject {fabric_lab.FABRIC} {fault}`"
                       if spec.target == "fabric" else f"the fabric takes only its own faults (uplink-down:<leaf>), "
                       f"not {fault}")
    if node == fabric_lab.FABRIC:
        _names(_paths())  # the lab runs
        click.echo(f"injected {fabric_lab.inject(_paths(), fault)} on the {fabric_lab.FABRIC}")
        return ExitCode.OK
    if node == ALL_NODES:
        for name in _names(_paths()):
            inject(name, fault, gpu, hca)
        return ExitCode.OK
    paths = _paths()
    index = _node_index(paths, node)
    if spec.machines_only:
        raise LabError(f"{fault} is a fault of the lab machines: `opsctl lab machines inject`")
    if spec.target != "gpu" and gpu is not None or spec.target != "hca" and hca is not None:
        takes = {"gpu": "--gpu", "hca": "--hca"}.get(spec.target, "no device")
        raise LabError(f"{fault} takes {takes}")
    hw = NodeHardware.load(paths.hardware(node), node)
    injected = hw.inject(fault, gpu=gpu, hca=hca)
    hw.save(paths.hardware(node))
    write_kernel_log(paths.kernel_log(node), hw)  # the XID line of an xid-kernel fault
    if FAULTS[injected.fault].name == "exporter-down":
        processes.stop(f"node_exporter.{node}", paths.run)
    click.echo(f"injected {_fault_label(injected)} on {node} (lab node {lp.node_address(index)})")
    return ExitCode.OK


def clear(node: str) -> ExitCode:
    """NODE `all`: every node and the fabric; NODE `fabric`: the fabric's own faults."""
    if node in (ALL_NODES, fabric_lab.FABRIC):
        names = _names(_paths())
        cleared = fabric_lab.clear(_paths())
        click.echo(f"cleared {fabric_lab.FABRIC}: " + (", ".join(cleared) or "no faults"))
        for name in names if node == ALL_NODES else []:
            clear(name)
        return ExitCode.OK
    paths = _paths()
    index = _node_index(paths, node)
    hw = NodeHardware.load(paths.hardware(node), node)
    cleared = [_fault_label(f) for f in hw.active]
    hw.clear()
    hw.save(paths.hardware(node))
    prometheus_lab.start_node_exporter(paths, index)
    click.echo(f"cleared {node}: " + (", ".join(cleared) or "no faults"))
    return ExitCode.OK
