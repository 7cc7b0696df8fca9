"""The lab's exporters and Prometheus: the dcgm-exporter emulator for every node, the real
node_exporter per node reading that node's emulated sysfs tree, and a real Prometheus scraping each
node as its own target with the label node="<Slurm node name>"."""

import json
import os
import shutil
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import jinja2
import yaml

import opsctl
import opsctl_lab
from opsctl_lab import paths as lp
from opsctl_lab import processes
from opsctl_lab.hardware import MONITORING_SERVICES, NodeHardware, write_kernel_log
from opsctl_lab.ib_sysfs import write_tree
from opsctl_lab.storage_view import MGS_NID, MOUNTS, mount_dir, probe_dir, write_storage

_TEMPLATES = jinja2.Environment(loader=jinja2.PackageLoader("opsctl_lab", "templates"),
                                undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
NODE_EXPORTER = "prometheus-node-exporter"


def prometheus_url() -> str:
    return f"http://{lp.prometheus_listen()}"


def prepare_nodes(paths: lp.LabPaths, nodes: int) -> None:
    """Each node's hardware state (kept across restarts), its sysfs tree, its storage, its kernel log and what
    `opsctl node check` of it needs: the Lustre tools, a config, the textfile collector's directory."""
    for index in range(nodes):
        name = lp.node_name(index)
        hw = NodeHardware.load(paths.hardware(name), name)
        running = dict.fromkeys(MONITORING_SERVICES, True)
        if not paths.hardware(name).exists() or hw.monitoring != running:
            # Each node runs DCGM's host engine and dcgm-exporter, as a provisioned one does, from its start (one
            # that a ladder step stopped and never started again starts with the lab): they hold its GPUs.
            hw.monitoring = running
            hw.save(paths.hardware(name))
        write_tree(paths.sysfs(name), hw)
        write_storage(paths.storage(name), mount_base(paths, name), hw)
        write_kernel_log(paths.kernel_log(name), hw)
        write_node_check_config(paths, name)
        paths.textfile(name).mkdir(parents=True, exist_ok=True)


def mount_base(paths: lp.LabPaths, name: str) -> Path:
    return paths.storage(name) / "mnt"


def write_node_check_config(paths: lp.LabPaths, name: str) -> None:
    """The node's tools (the emulated lctl, lfs, lnetctl, nvidia-smi and dcgmi, reading its hardware state) and an
    opsctl config that points `opsctl node check` at its sysfs tree, its mounts, those tools and its kernel log."""
    bin_dir = paths.storage(name) / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    env = " ".join(f"{k}={v}" for k, v in {**python_env(), "OPSCTL_HW_STATE": paths.hardware(name)}.items())
    tools = {"lctl": "lctl", "lfs": "lfs", "lnetctl": "lnetctl", "nvidia-smi": "nvidia_smi", "dcgmi": "dcgmi",
             "all_reduce_perf": "all_reduce_perf", "systemctl": "systemctl"}
    for tool, module in tools.items():
        (bin_dir / tool).write_text(f"#!/bin/sh\n{env} exec {sys.executable} -m opsctl_lab.hwtools.{module} \"$@\"\n")
        (bin_dir / tool).chmod(0o755)
    base = mount_base(paths, name)
    storage = paths.storage(name)
    mounts = [{"path": str(mount_dir(base, m.point)), "fstype": m.fstype,
               **({"probe_dir": str(probe_dir(base, m))} if m.probe else {})} for m in MOUNTS]
    config = {"ib": {"sysfs_root": str(paths.sysfs(name)), "window_seconds": 0},
              "storage": {"mounts": mounts, "timeout_seconds": 6, "lctl": str(bin_dir / "lctl"),
                          "lfs": str(bin_dir / "lfs"), "lnetctl": str(bin_dir / "lnetctl"),
                          "lustre_mgs_nids": [MGS_NID], "mountinfo_path": str(storage / "mountinfo"),
                          "mountstats_path": str(storage / "mountstats")},
              # The node's own kernel log, where its xid-kernel faults write, never the host's /dev/kmsg.
              "gpu": {"kernel_log_path": str(paths.kernel_log(name)), "nvidia_smi": str(bin_dir / "nvidia-smi"),
                      "dcgmi": str(bin_dir / "dcgmi"), "systemctl": str(bin_dir / "systemctl")},
              "validate": {"all_reduce_perf": str(bin_dir / "all_reduce_perf")}}
    text = yaml.safe_dump(config, sort_keys=False)
    if not paths.node_check_config(name).exists() or paths.node_check_config(name).read_text() != text:
        paths.node_check_config(name).write_text(text)


def start_dcgm_emulator(paths: lp.LabPaths, nodes: int) -> None:
    spec = [{"node": lp.node_name(i), "listen": f"{lp.node_address(i)}:{lp.DCGM_PORT}",
             "state": str(paths.hardware(lp.node_name(i))), "sysfs_root": str(paths.sysfs(lp.node_name(i))),
             "storage_root": str(paths.storage(lp.node_name(i))), "mount_base": str(mount_base(paths, lp.node_name(i)))}
            for i in range(nodes)]
    nodes_file = paths.root / "dcgm-emulator-nodes.json"
    nodes_file.write_text(json.dumps(spec, indent=1))
    processes.start("dcgm-emulator", [sys.executable, "-m", "opsctl_lab.dcgm_emulator", "--nodes-file",
                                      str(nodes_file)], paths.run, paths.logs, env=python_env())


def validate_job_command(paths: lp.LabPaths) -> str:
    """What a validation job runs on its lab node (slurmd sets SLURMD_NODENAME): `opsctl node validate` with
    the node's own config (its emulated dcgmi and all_reduce_perf), writing to its textfile directory."""
    node = "$SLURMD_NODENAME"
    env = " ".join(f"{k}={v}" for k, v in python_env().items())
    return (f"env {env} {sys.executable} -m opsctl node validate --config {paths.node_check_config(node)} "
            f"--textfile {paths.textfile(node) / 'opsctl-validate.prom'}")


def write_node_tool(paths: lp.LabPaths, name: str) -> Path:
    """<lab>/bin/<name>: the emulated tool opsctl_lab.hwtools.<name> (all_reduce_perf, train), one for every
    lab node, as a cluster installs it at one path: a job step runs it on each node of the step (slurmd sets
    SLURMD_NODENAME) with that node's hardware state, and every node's through the pattern (rank 0 of a
    multi-node all_reduce_perf reads the others')."""
    tool = paths.root / "bin" / name
    tool.parent.mkdir(parents=True, exist_ok=True)
    env = " ".join(f"{k}={v}" for k, v in {**python_env(), "OPSCTL_HW_STATE": paths.hardware("$SLURMD_NODENAME"),
                                           "OPSCTL_HW_STATE_PATTERN": paths.hardware("{node}")}.items())
    tool.write_text(f"#!/bin/sh\n{env} exec {sys.executable} -m opsctl_lab.hwtools.{name} \"$@\"\n")
    tool.chmod(0o755)
    return tool


def python_env() -> dict[str, str]:
    """The emulator runs from these very packages, with the interpreter that runs opsctl."""
    parents = dict.fromkeys(os.path.dirname(os.path.abspath(p.__path__[0])) for p in (opsctl, opsctl_lab))
    return {"PYTHONPATH": os.pathsep.join(parents)}


def start_node_exporter(paths: lp.LabPaths, index: int) -> None:
    name = lp.node_name(index)
    processes.start(f"node_exporter.{name}", [
        NODE_EXPORTER, f"--path.sysfs={paths.sysfs(name)}", "--collector.disable-defaults",
        "--collector.infiniband", "--collector.textfile", f"--collector.textfile.directory={paths.textfile(name)}",
        f"--web.listen-address={lp.node_address(index)}:{lp.NODE_EXPORTER_PORT}",
        "--log.level=warn",
    ], paths.run, paths.logs)


def write_prometheus_config(paths: lp.LabPaths, nodes: int, scrape_interval: int) -> None:
    sd_dir = paths.prometheus / "file_sd"
    sd_dir.mkdir(parents=True, exist_ok=True)
    for job, port in (("dcgm", lp.DCGM_PORT), ("node", lp.NODE_EXPORTER_PORT)):
        groups = [{"targets": [f"{lp.node_address(i)}:{port}"], "labels": {"node": lp.node_name(i)}}
                  for i in range(nodes)]
        (sd_dir / f"{job}.json").write_text(json.dumps(groups, indent=1))
    config = _TEMPLATES.get_template("prometheus.yml.j2").render(
        scrape_interval=scrape_interval, scrape_timeout=min(scrape_interval, 4), sd_dir=sd_dir,
        opsctl_target=lp.opsctl_metrics_listen())
    (paths.prometheus / "prometheus.yml").write_text(config)


def start_opsctl_watch(paths: lp.LabPaths, interval: int) -> None:
    """A read-only `opsctl health --watch`, as a head node may run it: its metrics feed the dashboards."""
    env = {**python_env(), "OPSCTL_CONFIG": str(paths.opsctl_config), "SLURM_CONF": str(paths.slurm_conf),
           "OPSCTL_STATE_DIR": str(paths.opsctl_state)}
    processes.start("opsctl-watch", [sys.executable, "-m", "opsctl", "health", "--watch", str(interval)],
                    paths.run, paths.logs, env=env)


def start_why_spool(paths: lp.LabPaths) -> None:
    """The head's opsctl-why.path and .service, as the opsctl role installs them: `opsctl why --spool` for the
    jobs that EpilogSlurmctld leaves (opsctl_lab.why_spool)."""
    env = {**python_env(), "OPSCTL_CONFIG": str(paths.opsctl_config), "SLURM_CONF": str(paths.slurm_conf),
           "OPSCTL_STATE_DIR": str(paths.opsctl_state)}
    processes.start("opsctl-why", [sys.executable, "-m", "opsctl_lab.why_spool", "--spool", str(paths.why_spool)],
                    paths.run, paths.logs, env=env)


def start_prometheus(paths: lp.LabPaths) -> None:
    processes.start("prometheus", [
        "prometheus", f"--config.file={paths.prometheus / 'prometheus.yml'}",
        f"--storage.tsdb.path={paths.prometheus / 'data'}", f"--web.listen-address={lp.prometheus_listen()}",
        "--web.enable-lifecycle", "--storage.tsdb.retention.time=2d", "--log.level=warn",
    ], paths.run, paths.logs)


def forget_history(paths: lp.LabPaths) -> None:
    """Prometheus again with an empty TSDB, as in a new lab (`opsctl lab reset`)."""
    processes.stop("prometheus", paths.run)
    shutil.rmtree(paths.prometheus / "data", ignore_errors=True)
    start_prometheus(paths)


def _api(path: str) -> Any:
    """The `data` of a Prometheus API answer, or None if Prometheus does not answer."""
    try:
        with urllib.request.urlopen(f"{prometheus_url()}/api/v1/{path}", timeout=5) as resp:
            return json.load(resp)["data"]
    except (OSError, ValueError, KeyError, urllib.error.URLError):
        return None


def nodes_with(expr: str) -> set[str]:
    """The nodes (label node) of the series an instant query returns; none if Prometheus does not answer."""
    data = _api("query?" + urllib.parse.urlencode({"query": expr}))
    return {r["metric"].get("node", "") for r in data.get("result", [])} - {""} if data else set()


def targets() -> list[dict[str, Any]]:
    """Prometheus' active targets, or [] if it does not answer."""
    data = _api("targets?state=active")
    return data.get("activeTargets", []) if data else []
