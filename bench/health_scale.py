"""How `opsctl health` scales: 64, 4096 and 16384 simulated H200 nodes of 8 GPUs.

For each size this backfills a real Prometheus with 11 minutes of the series the health rules read
(`promtool tsdb create-blocks-from openmetrics`) and with the results of the catalog's recording rules
(opsctl.health.precomputed, as `opsctl rules export` writes them), starts a real slurmctld
that knows the nodes (and a real slurmd for the first RESUMABLE nodes, which opsctl drained for ib-down
and which are healthy again), runs `opsctl health --json --resume --dry-run` end to end on both paths,
and times the same PromQL queries sent directly, one after the other. One node in a hundred carries a
composite fault, and one node each carries a fault of the lab's list (lab/opsctl_lab/hardware.py
FAULTS, FAULT_KINDS here: XIDs from DCGM and from the kernel log, a DBE, an SBE storm, row remaps,
a missing GPU, heat, NVLink and PCIe errors, a port down, the subnet manager gone, a degraded port,
InfiniBand error counters, an exporter down, failed node checks, validations and mounts, a NaN, a clock
slowdown, a downtrained PCIe link, a stuck fabric, MIG on, ECC off, another VBIOS, an inactive NVLink, NVLink
CRC errors, PCIe AER errors, an exclusive compute mode, another driver, an HCA on other firmware, fatal and
non-fatal NVSwitch SXids), so the
verdict path does real work, and the resume candidates make opsctl ask for positive evidence. Both paths
must decide the same for every node, or the bench stops.

Columns: e2e_s is the whole `opsctl health` process (start, Slurm, queries, verdicts, JSON) reading the
recorded rule results, the median of E2E_RUNS runs (e2e_max_s the slowest: on two cores one run may meet
slurmctld pinging the thousands of nodes that no slurmd answers for here, every 100 s), e2e_direct_s
one run with `prometheus.recording_rules: off` (every rule
queried, the fallback); in_opsctl_s and direct_q_s their time in queries (sent
`prometheus.parallel_queries` at a time); promql_s the direct path's queries sent one by one; plain_s the
rules' held values as a bare `(expr) op threshold`, one by one; queries and queries_d the number of
queries of each path, which does not grow with the node count; resumes the nodes it would resume; load
the machine's one-minute load average when the size ended (the machine may be shared).

What moved into Prometheus, one round of every recording group, paid once per recording interval
however many runs read the results:
  - rules_s: one round of every group through the query API, each group's rules in their order at one
    moment, the groups one after the other (the same queries a group runs, with the HTTP round trips),
    on a Prometheus that has run a round before, as every round but the first after a restart does;
    rules_cpu_s the Prometheus process' CPU seconds (user and system) over that round; rules_cold_s the
    round before it, the first after Prometheus started;
  - live_s: the sum over the groups of prometheus_rule_group_last_duration_seconds, as Prometheus reports
    it in its second round of the exported rule file (measure_live; the groups run side by side, so on
    two cores each one's duration includes waiting for a core), and alerts_s the alert group's;
    live_cpu_s the CPU seconds Prometheus spent over one recording interval of that live evaluation, in
    which every group runs once: what the rules cost the head node's cores.
Both are printed per group after the table.

How the results get there. A live Prometheus cannot both write the groups' results here and serve the
timings: the raw samples are written as blocks that run AHEAD_S into the future (so that every query of
a size reads whole windows however long the size takes), and Prometheus refuses to append a sample older
than its newest block. So the recorded results are written as blocks too (record): each group's first
rule is evaluated by this Prometheus at one moment and its answer written at every recording interval
from HISTORY_S before it to AHEAD_S after it (the raw samples do not change over time, counters rise at
steady rates, so neither would the answers); a restart loads them, and the second rules, which read that
history, follow the same way. The timings then run on this machine's cores alone. Last, the exported
file is loaded (SIGHUP) and Prometheus evaluates every group live: its queries run in full over the same
data (stage 2 reads stage 1's history from the blocks), only their results' appends are refused as out of
bounds, which is what live_s measures without.

Run: .venv/bin/python bench/health_scale.py [--sizes 64,4096,16384] [--keep DIR]
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import requests
import yaml

from opsctl.config import parse_config
from opsctl.health import precomputed
from opsctl.health.catalog import load_catalog
from opsctl.health.evaluate import presence_queries
from opsctl.health.identity import identity_query

GPU_METRICS = ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
               "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
               "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
               "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
               "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
               "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_PCIE_LINK_GEN",
               "DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "DCGM_FI_DEV_PCIE_LINK_WIDTH", "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
               "DCGM_FI_DEV_FABRIC_MANAGER_STATUS", "DCGM_FI_DEV_ECC_CURRENT", "DCGM_FI_DEV_MIG_MODE",
               "DCGM_FI_DEV_PERSISTENCE_MODE", "DCGM_FI_DEV_COMPUTE_MODE"]
# What a healthy H200 reads where it is not 0 (Gen5 x16, fabric Success, ECC and persistence on).
HEALTHY = {"DCGM_FI_DEV_PCIE_LINK_GEN": 5.0, "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": 5.0, "DCGM_FI_DEV_PCIE_LINK_WIDTH": 16.0,
           "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": 16.0, "DCGM_FI_DEV_FABRIC_MANAGER_STATUS": 3.0,
           "DCGM_FI_DEV_ECC_CURRENT": 1.0, "DCGM_FI_DEV_PERSISTENCE_MODE": 1.0}
# The faults of the GPU's own settings and state, on GPU 2: metric -> value.
GPU_STATE_FAULTS = {"clock-slowdown": {"DCGM_FI_DEV_GPU_UTIL": 100.0, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 136.0},
                    "pcie-downtrain": {"DCGM_FI_DEV_PCIE_LINK_WIDTH": 8.0},
                    "fabric-stuck": {"DCGM_FI_DEV_FABRIC_MANAGER_STATUS": 2.0},
                    "mig-on": {"DCGM_FI_DEV_MIG_MODE": 1.0}, "ecc-off": {"DCGM_FI_DEV_ECC_CURRENT": 0.0},
                    "compute-exclusive": {"DCGM_FI_DEV_COMPUTE_MODE": 2.0}}
VBIOS, OTHER_VBIOS, INFOROM = "96.00.A5.00.03", "96.00.89.00.01", "G520.0280.02.02"
DRIVER, OTHER_DRIVER, OFED = "570.133.20", "570.172.08", "24.10-1.1.4.0"
# node_infiniband_info's labels: board_id, hca_type and firmware_version, per HCA (the lab's, ib_sysfs.py)
HCA_INFO = {"compute": ("MT_0000000838", "MT4129", "28.41.1000"), "storage": ("MT_0000000884", "MT41692", "32.41.1000")}
OTHER_HCA_FW = "28.39.1002"
SXIDS = {"sxid-fatal": ("00000000:06:00.0", 20034, "true"), "sxid-nonfatal": ("00000000:05:00.0", 12028, "false")}
IB_METRICS = ["node_infiniband_state_id", "node_infiniband_rate_bytes_per_second",
              "node_infiniband_link_error_recovery_total", "node_infiniband_link_downed_total",
              "node_infiniband_port_errors_received_total"]
HCAS = [f"mlx5_{i}" for i in range(8)] + ["mlx5_bond_0"]
SPAN_S, STEP_S = 660, 60
# Samples also run this far past the time of writing, so that every query of a size (the last come
# after the preparation, the recording, both opsctl runs and the query timings: about 11 minutes at
# 16,384 nodes on 2 cores) reads whole windows. With 600 s, the direct run at 16,384 came after the
# end of the samples and decided differently from the recorded one.
AHEAD_S = 1500
# How often the recording groups are evaluated here: as often as the samples come.
RECORDING_INTERVAL_S = STEP_S
# The recorded history written before `at`: more than any hold of the bench's rules (2m here) needs.
HISTORY_S = 600
LIVE_METRIC = re.compile(r'@stamp\{rule_group="[^;]*;([^"]+)"\} (\S+)')
RESUMABLE = 4  # nodes drained by opsctl for ib-down whose ports are fine again


# `opsctl health` runs on the recorded path per size: e2e_s is their median.
E2E_RUNS = 3
# Samples are a minute apart here (a real scrape is seconds): windows must span two of them.
SHORT_HOLDS = ("ib-down", "ib-degraded")


def node_names(n: int) -> list[str]:
    return [f"sim{i:04d}" for i in range(1, n + 1)]


# One node per fault of the lab's list (lab/opsctl_lab/hardware.py FAULTS) that the bench's metrics can
# show, beside the one node in a hundred with a composite fault: each carries it on one device. Faults
# the metrics cannot show (nvlink-slow, ib-slow: only moving data finds them; the recabling faults and
# the firmware mismatch: `opsctl node check` and the fabric test find them) are represented by what
# their finder exports: a failed node check or validation. "nan" is an exporter that reports NaN.
FAULT_KINDS = ("xid", "xid-kernel", "dbe", "sbe-storm", "row-remap-failure", "row-remap-pending", "remapped-rows",
               "gpu-missing", "thermal", "nvlink-errors", "pcie-replays", "ib-down", "sm-down", "ib-degraded",
               "ib-counters", "exporter-down", "node-check", "validate", "storage", "nan", "clock-slowdown",
               "pcie-downtrain", "fabric-stuck", "mig-on", "ecc-off", "vbios-drift", "nvlink-down", "nvlink-crc",
               "pcie-aer", "compute-exclusive", "driver-drift", "ib-fw-mismatch", "sxid-fatal", "sxid-nonfatal")
FIRST_FAULT_NODE = 10  # after the resume candidates; the kinds take one node each from here


def faults_of(nodes: list[str]) -> dict[str, str]:
    """node -> fault kind: one node per kind, and one node in a hundred with the composite fault."""
    kinds = {node: "composite" for node in nodes[50::100]}
    for node, kind in zip(nodes[FIRST_FAULT_NODE:], FAULT_KINDS, strict=False):
        kinds.setdefault(node, kind)
    return kinds


# Per-second rises of the counters a fault makes climb (steady, so every query of a size decides alike).
RATES = {("dbe", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"): 1 / 60, ("sbe-storm", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"): 50.0,
         ("nvlink-errors", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"): 20.0,
         ("nvlink-errors", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"): 5.0,
         ("nvlink-crc", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"): 5.0,
         ("pcie-replays", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"): 10.0,
         ("ib-counters", "node_infiniband_link_error_recovery_total"): 0.5,
         ("ib-counters", "node_infiniband_port_errors_received_total"): 5.0}


def gpu_value(metric: str, fault: str, gpu: int) -> float | tuple[float, float]:
    """The value, or (value at the start, rise per second) for a counter that climbs."""
    if fault in GPU_STATE_FAULTS and gpu == 2 and metric in GPU_STATE_FAULTS[fault]:
        return GPU_STATE_FAULTS[fault][metric]
    if fault in ("dbe", "sbe-storm", "nvlink-errors", "nvlink-crc", "pcie-replays") and gpu == 1:
        rate = RATES.get((fault, metric))
        if rate:
            return (100.0, rate)
    if metric == "DCGM_FI_DEV_GPU_TEMP":
        return {"thermal": 92.0, "nan": float("nan")}.get(fault, 41.0 + gpu) if gpu == 4 else 41.0 + gpu
    if metric == "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" and fault == "thermal" and gpu == 4:
        return 72.0  # HW_SLOWDOWN and HW_THERMAL
    if gpu == 0 and (metric, fault) in (("DCGM_FI_DEV_ROW_REMAP_PENDING", "composite"),
                                        ("DCGM_FI_DEV_ROW_REMAP_PENDING", "row-remap-pending"),
                                        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "row-remap-failure")):
        return 1.0
    if metric == "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS" and gpu == 0:
        return {"remapped-rows": 9.0, "row-remap-failure": 1.0, "row-remap-pending": 1.0}.get(fault, 0.0)
    return HEALTHY.get(metric, 0.0)


def ib_value(metric: str, fault: str, hca: str) -> float | tuple[float, float]:
    if metric == "node_infiniband_state_id":
        if fault == "sm-down":
            return 2.0  # INIT on every port
        return 1.0 if fault in ("composite", "ib-down") and hca == "mlx5_3" else 4.0
    if metric == "node_infiniband_rate_bytes_per_second":
        return 2.5e10 if hca == "mlx5_bond_0" or (fault == "ib-degraded" and hca == "mlx5_5") else 5e10
    rate = RATES.get((fault, metric))
    return (0.0, rate) if rate and hca == "mlx5_6" else 0.0


def write_openmetrics(path: Path, nodes: list[str], end: int) -> int:
    """Every series with a sample each STEP_S up to `end`. Returns the number of series."""
    stamps = list(range(end - SPAN_S, end + AHEAD_S + 1, STEP_S))
    series = 0
    fault = faults_of(nodes)
    with path.open("w") as out:
        def family(name, rows):
            nonlocal series
            out.write(f"# TYPE {name} gauge\n")
            for labels, value in rows:
                series += 1
                if isinstance(value, tuple):
                    start, rate = value
                    out.write("".join(f"{name}{{{labels}}} {start + rate * (t - stamps[0])!r} {t}\n" for t in stamps))
                else:
                    out.write("".join(f"{name}{{{labels}}} {value} {t}\n" for t in stamps))
        family("up", [(f'job="{job}",instance="{n}:{port}",node="{n}"', 0 if fault.get(n) == "exporter-down" else 1)
                      for job, port in (("dcgm", 9400), ("node", 9100)) for n in nodes])
        dcgm = 'job="dcgm",instance="{n}:9400",node="{n}",Hostname="{n}"'

        def gpus(n: str) -> range:
            return range(7) if fault.get(n) == "gpu-missing" else range(8)

        def versions(n: str, g: int) -> str:  # the label fields of the role's counters file
            vbios = OTHER_VBIOS if fault.get(n) == "vbios-drift" and g == 4 else VBIOS
            driver = OTHER_DRIVER if fault.get(n) == "driver-drift" else DRIVER
            return (f',modelName="NVIDIA H200",DCGM_FI_DEV_INFOROM_IMAGE_VER="{INFOROM}",'
                    f'DCGM_FI_DEV_VBIOS_VERSION="{vbios}",DCGM_FI_DRIVER_VERSION="{driver}"')

        for metric in GPU_METRICS:
            family(metric, [(dcgm.format(n=n) + f',gpu="{g}"' + versions(n, g),
                             gpu_value(metric, fault.get(n, ""), g)) for n in nodes for g in gpus(n)])
        # dcgm-exporter with the windowed count exports it for every GPU: 0, or one series per XID seen.
        def xid(n: str, g: int) -> bool:
            return fault.get(n) in ("composite", "xid") and g == 2

        family("DCGM_EXP_XID_ERRORS_COUNT",
               [(dcgm.format(n=n) + f',gpu="{g}",window_size_in_ms="300000"' + (',xid="79"' if xid(n, g) else ""),
                 int(xid(n, g))) for n in nodes for g in gpus(n)])
        for metric in IB_METRICS:
            family(metric, [(f'job="node",instance="{n}:9100",node="{n}",device="{h}",port="1"',
                             ib_value(metric, fault.get(n, ""), h)) for n in nodes for h in HCAS])
        def hca_info(n: str, h: str) -> str:
            board, kind, firmware = HCA_INFO["storage" if h == "mlx5_bond_0" else "compute"]
            firmware = OTHER_HCA_FW if fault.get(n) == "ib-fw-mismatch" and h == "mlx5_2" else firmware
            return f'board_id="{board}",hca_type="{kind}",firmware_version="{firmware}"'

        family("node_infiniband_info", [(f'job="node",instance="{n}:9100",node="{n}",device="{h}",' + hca_info(n, h), 1)
                                        for n in nodes for h in HCAS])
        node = 'job="node",instance="{n}:9100",node="{n}"'
        family("opsctl_node_ofed_info", [(node.format(n=n) + f',distribution="MLNX_OFED_LINUX",version="{OFED}"', 1)
                                         for n in nodes])
        def sxid(kind: str) -> str:
            pci, code, fatal = SXIDS[kind]
            return f',nvswitch_pci="{pci}",sxid="{code}",fatal="{fatal}",window_size_in_ms="900000"'

        family("opsctl_node_kernel_sxid_count", [(node.format(n=n) + sxid(kind), 1)
                                                 for n, kind in fault.items() if kind in SXIDS])
        kernel = [n for n, kind in fault.items() if kind == "xid-kernel"]
        family("opsctl_node_kernel_xid_count", [(node.format(n=n) + ',gpu="3",xid="62",window_size_in_ms="900000"', 1)
                                                for n in kernel])
        checks = {"node-check": ("ib-fw-version", "mlx5_2"), "storage": ("storage-mount-missing", "/scratch")}
        family("opsctl_node_check", [(node.format(n=n) + f',check="{checks[kind][0]}",device="{checks[kind][1]}"', 1)
                                     for n, kind in fault.items() if kind in checks])
        family("opsctl_node_check_timestamp_seconds",
               [(node.format(n=n), (float(stamps[0]), 1.0)) for n, kind in fault.items() if kind in checks])
        # What `opsctl node check` writes on every node: per GPU its inactive NVLinks and its slowest link's share
        # of full speed (each naming the links), and each GPU's and HCA's AER totals.
        def down(n: str, g: int) -> bool:
            return fault.get(n) == "nvlink-down" and g == 1

        family("opsctl_node_nvlink_inactive", [(node.format(n=n) + f',gpu="{g}",nvlink="gpu{g}' +
                                                (' link3"' if down(n, g) else '"'), float(down(n, g)))
                                               for n in nodes for g in gpus(n)])
        family("opsctl_node_nvlink_speed_ratio", [(node.format(n=n) + f',gpu="{g}",nvlink="gpu{g}"', 1.0)
                                                  for n in nodes for g in gpus(n)])

        def aer(n: str, device: str, severity: str) -> float | tuple[float, float]:
            return (0.0, 5.0) if fault.get(n) == "pcie-aer" and (device, severity) == ("gpu3", "correctable") else 0.0

        family("opsctl_node_pcie_aer_errors_total",
               [(node.format(n=n) + f',pcie="{d}",severity="{sev}"', aer(n, d, sev)) for n in nodes
                for d in [f"gpu{g}" for g in gpus(n)] + HCAS for sev in ("correctable", "nonfatal", "fatal")])
        family("opsctl_node_validate", [(node.format(n=n) + ',test="nccl",device="node"', float(end))
                                        for n, kind in fault.items() if kind == "validate"])
        out.write("# EOF\n")
    return series


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"bench: timed out waiting for {what}")


class Slurm:
    """A real slurmctld (and munged) that knows the simulated nodes; no slurmd is needed to list them,
    but the RESUMABLE nodes run one each, so that they answer as a drained node that may be resumed."""

    def __init__(self, root: Path, nodes: int):
        self.root = root
        self.slurmds: list[subprocess.Popen] = []
        (root / "state").mkdir(parents=True)
        for index in range(1, RESUMABLE + 1):
            (root / "spool" / f"sim{index:04d}").mkdir(parents=True)
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.ctld = None
        self.munged = subprocess.Popen(["munged", "--foreground", "--force", f"--socket={root}/munge.socket",
                                        f"--key-file={key}", f"--pid-file={root}/munged.pid",
                                        f"--log-file={root}/munged.log", f"--seed-file={root}/munged.seed"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait(lambda: (root / "munge.socket").exists(), 10, "munged")
        self.conf = root / "slurm.conf"
        first = free_port()
        node = "NodeAddr=127.0.0.1 NodeHostname=localhost CPUs=224 RealMemory=2000000 State=UNKNOWN"
        self.conf.write_text(
            f"ClusterName=bench\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort={free_port()}\n"
            f"SlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\nAuthInfo=socket={root}/munge.socket\n"
            f"CredType=cred/munge\nStateSaveLocation={root}/state\nSlurmctldPidFile={root}/slurmctld.pid\n"
            f"SlurmctldLogFile={root}/slurmctld.log\nSlurmdSpoolDir={root}/spool/%n\n"
            f"SlurmdPidFile={root}/slurmd.%n.pid\nSlurmdLogFile={root}/slurmd.%n.log\n"
            f"SlurmdParameters=config_overrides\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            f"ReturnToService=2\nSelectType=select/cons_tres\n"
            f"NodeName=sim[0001-{RESUMABLE:04d}] Port=[{first}-{first + RESUMABLE - 1}] {node}\n"
            f"NodeName=sim[{RESUMABLE + 1:04d}-{nodes:04d}] Port=1 {node}\n"
            f"PartitionName=gpu Nodes=ALL Default=YES State=UP\n")
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.ctld = subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(self.conf)], env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait(lambda: subprocess.run(["sinfo", "-h"], env=self.env, capture_output=True).returncode == 0, 30,
                 "slurmctld")
            for index in range(1, RESUMABLE + 1):
                self.slurmds.append(subprocess.Popen(["slurmd", "-D", "-N", f"sim{index:04d}", "-f", str(self.conf)],
                                                     env=self.env, stdout=subprocess.DEVNULL,
                                                     stderr=subprocess.DEVNULL))
            resumable = f"sim[0001-{RESUMABLE:04d}]"
            wait(lambda: self.states(resumable) == {"idle"}, 60, "the slurmd nodes idle")
            subprocess.run(["scontrol", "update", f"nodename={resumable}", "state=drain",
                            "reason=opsctl:ib-down mlx5_3 state_id=1"], env=self.env, check=True)
        except BaseException:
            self.stop()
            raise

    def states(self, hostlist: str) -> set[str]:
        out = subprocess.run(["sinfo", "-h", "-N", "-n", hostlist, "-o", "%t"], env=self.env, capture_output=True,
                             text=True).stdout
        return set(out.split())

    def stop(self) -> None:
        for proc in (*self.slurmds, self.ctld, self.munged):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(20)


class Prometheus:
    def __init__(self, root: Path, blocks: Path):
        self.root = root
        shutil.copytree(blocks, root / "data")
        (root / "prometheus.yml").write_text("global:\n  scrape_interval: 1m\n")
        self.url = f"http://127.0.0.1:{free_port()}"
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(["prometheus", f"--config.file={self.root / 'prometheus.yml'}",
                                      f"--storage.tsdb.path={self.root / 'data'}",
                                      f"--web.listen-address={self.url[7:]}",
                                      "--storage.tsdb.retention.time=30d", "--log.level=error"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait(lambda: urllib.request.urlopen(f"{self.url}/-/ready", timeout=2).status == 200, 300, "prometheus")

    def record(self, groups: list[dict], at: int) -> None:
        """What the recording groups write, as a Prometheus evaluating them every RECORDING_INTERVAL_S would.
        Each group's rules are evaluated by this Prometheus at `at`, in their order, one stage at a time: the
        answers of every group's first rule are written as blocks (labelled as the group labels them) at
        every interval from HISTORY_S before `at` until AHEAD_S after it, the heartbeat's value the time
        of each (the raw samples do not change, so neither would the answers), loaded by a restart; then
        the second rules, which read that history, the same way, and so on. rounds() times the groups once
        the whole history is there, and measure_live lets Prometheus run them itself; these blocks let
        opsctl read what a Prometheus evaluating them all along had written, without the evaluations sharing
        this machine's cores with the timings."""
        for stage in range(max(len(g["rules"]) for g in groups)):
            session = requests.Session()
            lines: dict[str, list[str]] = {}
            for group in groups:
                if stage >= len(group["rules"]):
                    continue
                rule = group["rules"][stage]
                resp = session.post(f"{self.url}/api/v1/query", data={"query": rule["expr"], "time": at},
                                    timeout=600)
                resp.raise_for_status()
                for item in resp.json()["data"]["result"]:
                    labels = {k: v for k, v in item["metric"].items() if k != "__name__"} | rule.get("labels", {})
                    text = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
                    beat = labels.get(precomputed.HEARTBEAT_LABEL) == "1"
                    lines.setdefault(rule["record"], []).extend(
                        f"{rule['record']}{{{text}}} {t if beat else item['value'][1]} {t}\n"
                        for t in range(at - HISTORY_S, at + AHEAD_S + 1, RECORDING_INTERVAL_S))
            text = "".join(f"# TYPE {name} gauge\n" + "".join(rows) for name, rows in lines.items())
            (self.root / "recorded.om").write_text(text + "# EOF\n")
            subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(self.root / "recorded.om"),
                            str(self.root / "data")], check=True, capture_output=True)
            self.stop()
            self.start()

    def compacted(self) -> bool:
        """Whether Prometheus has merged the blocks that record() wrote over the raw ones' time. It merges
        overlapping blocks on its own a minute or so after it starts, for a minute or more at 16,384 nodes
        on both cores: whatever ran then would be timed against it (a live Prometheus has no such blocks)."""
        spans = sorted((meta["minTime"], meta["maxTime"]) for meta in
                       (json.loads(path.read_text()) for path in (self.root / "data").glob("*/meta.json")))
        return all(before[1] <= after[0] for before, after in zip(spans, spans[1:], strict=False))

    def rounds(self, groups: list[dict], at: int) -> tuple[dict[str, float], dict[str, float], float]:
        """Two rounds of every group, as Prometheus runs them: each group's rules in order at one time `at`,
        the groups one after the other. The first is the first queries of this Prometheus process (record()
        restarted it), on cold caches; the second is what every later round of a running Prometheus costs.
        Returns each group's seconds in the first and in the second round, and this Prometheus' CPU
        seconds (user and system, /proc) over the second."""
        session = requests.Session()
        took: list[dict[str, float]] = [{}, {}]
        cpu = 0.0
        for index in range(2):
            cpu = -self.cpu_seconds()
            for group in groups:
                started = time.monotonic()
                for rule in group["rules"]:
                    resp = session.post(f"{self.url}/api/v1/query", data={"query": rule["expr"], "time": at},
                                        timeout=600)
                    resp.raise_for_status()
                took[index][group["name"]] = time.monotonic() - started
            cpu += self.cpu_seconds()
        return took[0], took[1], cpu

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def measure_live(self, rules_file: str, interval_s: int) -> tuple[dict[str, float], float]:
        """Load the exported rule file and let Prometheus evaluate every group: each group's
        prometheus_rule_group_last_duration_seconds once every group has run twice, the groups' own cost as
        Prometheus reports it, and the CPU seconds this Prometheus spent over one recording interval after
        the first round (every group runs once in it; nothing else runs here but the rules and this
        reading). The raw samples here run past now, so a live evaluation's results cannot be appended
        (Prometheus refuses samples older than its newest block: out of bounds) and are dropped; the
        queries, what a round costs, run in full over the same data, and stage 2 reads stage 1's history
        from the blocks."""
        (self.root / "opsctl.rules.yml").write_text(rules_file)
        (self.root / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1m\nrule_files:\n  - opsctl.rules.yml\n")
        loaded = time.time()
        self.proc.send_signal(signal.SIGHUP)
        names = {g["name"] for g in yaml.safe_load(rules_file)["groups"]}

        seen: dict[str, dict[str, float]] = {}  # "stamps" and "durations" of the round last waited for

        def evaluated(after: dict[str, float]) -> bool:
            """Whether every group has evaluated since the time `after` gives it (or since the load)."""
            text = requests.get(f"{self.url}/metrics", timeout=30).text
            stamps = {k: float(v) for k, v in LIVE_METRIC.findall(text.replace(
                "prometheus_rule_group_last_evaluation_timestamp_seconds", "@stamp"))}
            durations = re.findall(r'prometheus_rule_group_last_duration_seconds\{rule_group="[^;]*;([^"]+)"\} (\S+)',
                                   text)
            if any(stamps.get(name, 0.0) <= after.get(name, loaded) for name in names):
                return False
            seen.update(stamps=stamps, durations={k: float(v) for k, v in durations if k in names})
            return True

        wait(lambda: evaluated({}), 3 * interval_s + 60, "every rule group evaluated once")
        first, cpu = seen["stamps"], -self.cpu_seconds()
        time.sleep(interval_s)
        cpu += self.cpu_seconds()
        wait(lambda: evaluated(first), 3 * interval_s + 60, "every rule group evaluated twice")
        return seen["durations"], cpu

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def raw_promql_seconds(url: str, exprs: list[str]) -> float:
    session = requests.Session()
    started = time.monotonic()
    for expr in exprs:
        resp = session.post(f"{url}/api/v1/query", data={"query": expr}, timeout=120)
        resp.raise_for_status()
    return time.monotonic() - started


def bench_size(n: int, work: Path) -> dict:
    root = work / f"n{n}"
    root.mkdir(parents=True)
    end = int(time.time()) - 5
    started = time.monotonic()
    series = write_openmetrics(root / "data.om", node_names(n), end)
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(root / "data.om"),
                    str(root / "blocks")],
                   check=True, capture_output=True)
    (root / "data.om").unlink()
    prep = time.monotonic() - started
    prom = Prometheus(root, root / "blocks")
    slurm = None
    try:
        slurm = Slurm(root / "slurm", n)
        # Samples are up to a minute apart here (scrapes would be seconds), so staleness allows more.
        raw_config = {"prometheus": {"url": prom.url, "stale_after": "5m", "timeout_seconds": 300,
                                     "scrape_interval": "1m",
                                     "recording_interval": f"{RECORDING_INTERVAL_S}s"},
                      "slurm": {"backend": "cli", "partitions": ["gpu"]},
                      "catalog": {"overrides": {rule: {"hold": "2m"} for rule in SHORT_HOLDS}},
                      "safety": {"resume_after": "0s", "unknown_max_fraction": 1.0}}
        env = {**slurm.env, "OPSCTL_STATE_DIR": str(root / "state")}
        parsed = parse_config(raw_config, "bench", env)
        rules = load_catalog(parsed)
        exprs = [*presence_queries(parsed), identity_query(parsed), *(rule.alert_expr() for rule in rules),
                 *(rule.expr for rule in rules if rule.id == "ib-down")]  # ib-down: the resume evidence
        groups = precomputed.recording_groups(rules, parsed)
        at = int(time.time())
        prom.record(groups, at)
        wait(prom.compacted, 1200, "Prometheus to merge the recorded blocks with the raw ones")
        cold_s, round_s, round_cpu_s = prom.rounds(groups, at)
        raw_promql_seconds(prom.url, exprs)  # warm the caches once, as a long-running cluster has them
        e2e_runs = [opsctl_health(root / "recorded.yaml", raw_config, env) for _ in range(E2E_RUNS)]
        recorded, e2e = e2e_runs[0][0], statistics.median(took for _, took in e2e_runs)
        direct_raw = {**raw_config, "prometheus": {**raw_config["prometheus"], "recording_rules": "off"}}
        direct, e2e_direct = opsctl_health(root / "direct.yaml", direct_raw, env)
        summary = recorded["summary"]
        if summary["rule_results"] != "precomputed":
            raise SystemExit(f"bench: the recorded rule results were not used: {summary['rule_results_note']}")
        if any(decisions(doc) != decisions(recorded) for doc, _ in e2e_runs):
            raise SystemExit("bench: two runs of the recorded path decided differently")
        if decisions(recorded) != decisions(direct):
            differ = [(a, b) for a, b in zip(decisions(recorded), decisions(direct), strict=False) if a != b]
            raise SystemExit(f"bench: the recorded and the direct path decided differently "
                             f"({len(recorded['nodes'])} and {len(direct['nodes'])} nodes; first difference: "
                             f"{json.dumps(differ[:1])[:600]})")
        raw = raw_promql_seconds(prom.url, exprs)
        plain = raw_promql_seconds(prom.url, [f"({rule.expr}) {rule.op} {rule.threshold:g}" for rule in rules])
        exported = subprocess.run([sys.executable, "-m", "opsctl", "rules", "export", "--format", "prometheus"],
                                  env={**env, "OPSCTL_CONFIG": str(root / "recorded.yaml")}, capture_output=True,
                                  text=True, check=True).stdout
        live, live_cpu = prom.measure_live(exported, RECORDING_INTERVAL_S)
    finally:
        if slurm is not None:
            slurm.stop()
        prom.stop()
    return {"nodes": n, "gpus": 8 * n, "series": series, "e2e_s": e2e,
            "e2e_max_s": max(took for _, took in e2e_runs), "e2e_direct_s": e2e_direct,
            "opsctl_query_s": summary["query_seconds"], "direct_query_s": direct["summary"]["query_seconds"],
            "promql_s": raw, "plain_s": plain, "rules_s": sum(round_s.values()), "rules_cpu_s": round_cpu_s,
            "rules_cold_s": sum(cold_s.values()),
            "live_s": sum(v for k, v in live.items() if k.startswith(precomputed.GROUP_PREFIX)), "live_cpu_s": live_cpu,
            "alerts_s": live.get("opsctl-health", 0.0), "load": os.getloadavg()[0],
            "groups": {name: (took, live.get(name, float("nan"))) for name, took in round_s.items()},
            "queries": summary["queries"], "queries_direct": direct["summary"]["queries"], "fail": summary["fail"],
            "unknown": summary["unknown"], "resumes": summary["would_resume"], "prep_s": prep}


def decisions(report: dict) -> list[dict]:
    """The nodes of a health report with each check's value to 9 significant digits: the recorded path's
    values were computed at the moment of recording, the direct path's later, and a rate over windows
    that end at other moments may differ in its last bits (50 and 49.999999999999986)."""
    def rounded(check: dict) -> dict:
        value = check.get("value")
        return {**check, "value": float(f"{value:.9g}")} if isinstance(value, float) else check
    return [{**node, "checks": [rounded(c) for c in node.get("checks", [])]} for node in report["nodes"]]


def opsctl_health(config: Path, raw_config: dict, env: dict) -> tuple[dict, float]:
    """One `opsctl health --json --resume --dry-run` process: its JSON and its wall time."""
    config.write_text(json.dumps(raw_config))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "opsctl", "health", "--json", "--resume", "--dry-run"],
                          env={**env, "OPSCTL_CONFIG": str(config)}, capture_output=True, text=True, timeout=900)
    took = time.monotonic() - started
    if proc.returncode not in (0, 1, 4):
        raise SystemExit(f"bench: opsctl health exited {proc.returncode}: {proc.stderr.strip()}")
    return json.loads(proc.stdout), took


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,4096,16384")
    parser.add_argument("--keep", default=None, help="Work directory to keep (default: a temporary one).")
    args = parser.parse_args(argv)
    for tool in ("prometheus", "promtool", "slurmctld", "munged", "sinfo"):
        if shutil.which(tool) is None:
            raise SystemExit(f"bench: {tool} is not installed (make deps-lab)")
    work = Path(args.keep or tempfile.mkdtemp(prefix="opsctl-bench-"))
    columns = [("nodes", "nodes", "d"), ("gpus", "gpus", "d"), ("series", "series", "d"), ("e2e_s", "e2e_s", ".2f"),
               ("e2e_max_s", "e2e_max_s", ".2f"), ("e2e_direct_s", "e2e_direct_s", ".2f"),
               ("in_opsctl_s", "opsctl_query_s", ".2f"),
               ("direct_q_s", "direct_query_s", ".2f"), ("promql_s", "promql_s", ".2f"), ("plain_s", "plain_s", ".2f"),
               ("rules_s", "rules_s", ".2f"), ("rules_cpu_s", "rules_cpu_s", ".2f"),
               ("rules_cold_s", "rules_cold_s", ".2f"), ("live_s", "live_s", ".2f"),
               ("live_cpu_s", "live_cpu_s", ".2f"), ("alerts_s", "alerts_s", ".3f"),
               ("queries", "queries", "d"),
               ("queries_d", "queries_direct", "d"), ("fail", "fail", "d"), ("resumes", "resumes", "d"),
               ("prep_s", "prep_s", ".1f"), ("load", "load", ".2f")]
    sys.stdout.write(" ".join(f"{title:>{max(len(title), 6)}}" for title, _, _ in columns) + "\n")
    rows: list[dict] = []
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            row = bench_size(n, work)
            sys.stdout.write(" ".join(f"{row[key]:>{max(len(title), 6)}{fmt}}" for title, key, fmt in columns) + "\n")
            rows.append(row)
            sys.stdout.flush()
        sys.stdout.write("\nper group (seconds): rules_s (query API, its rules one after the other, a warm round) / "
                         "live_s (prometheus_rule_group_last_duration_seconds)\n")
        for name in rows[0]["groups"] if rows else []:
            cells = "  ".join(f"{row['groups'][name][0]:8.3f} {row['groups'][name][1]:8.3f}" for row in rows)
            sys.stdout.write(f"{name.removeprefix(precomputed.GROUP_PREFIX):24} {cells}\n")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
