"""The PromQL of each signal `opsctl job-health` reads: one query per signal, for every node of every running
job at once, so that a run costs the same number of queries for one job as for a hundred.

Each query keeps the labels that tell a scrape target apart (node_mapping.by, the health rules' ${by}), and
opsctl.health.identity maps a target to its Slurm node as `opsctl health` does: a Prometheus that scrapes by
IP address without opsctl's labels is read alike. Values are over the last `job_health.window`:

  gpu-util      DCGM_FI_DEV_GPU_UTIL, the mean of the node's GPUs (%)            ) idle while peers spin: hung
  gpu-util-min  the same, its least busy GPU (one stuck rank of eight shows here) )
  sm-clock      DCGM_FI_DEV_SM_CLOCK, its slowest GPU (MHz)                        low: slow
  power         DCGM_FI_DEV_POWER_USAGE, the mean of its GPUs (W)                  high: slow (it computes while
                                                                                   its peers wait for it)
  activity      DCGM_FI_PROF_GR_ENGINE_ACTIVE, the mean of its GPUs (a ratio)      low: slow
  clock-events  DCGM_FI_DEV_CLOCKS_EVENT_REASONS as last scraped, per GPU, only the GPUs with a bit other
                than GPU_IDLE (0x1) set; the node's bits are those of its GPUs     a bit peers lack: slow
  nvlink        rate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL), summed over its GPUs     ) none on any node: hung
  ib            rate of node_infiniband_port_data_{transmitted,received}_bytes_total over the compute rails
                (ib.rails), summed                                                 ) low: slow

dcgm-exporter types DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL as a counter, though some releases fill it with the
current rate: either way its rate() is 0 exactly when nothing moves over NVLink, which is all the hang asks.
"""

from collections.abc import Callable
from dataclasses import dataclass

from opsctl.config.schema import Config

# PromQL has no bitwise AND; every bit but GPU_IDLE (0x1), the lowest, is floor(mask / 2) * 2.
IDLE_BIT = 0x1


@dataclass(frozen=True)
class Signal:
    name: str
    words: str  # as a person reads it: "sm clock"
    source: str  # dcgm | node: the scrape job it reads
    aggregate: str  # how a node's targets (and a node's GPUs, for bits) combine: min, avg, sum or bits (OR)
    bad: str  # low | high: the side of the job's median that slows a job; "" when no score is taken
    show: Callable[[float], str]  # a value in words, with its unit
    template: str  # the PromQL; {by}, {job}, {w} and {rails} filled in by expr()

    def expr(self, config: Config) -> str:
        jobs = config.prometheus.jobs
        return self.template.format(by=", ".join(config.node_mapping.by), job=jobs.get(self.source, ""),
                                    w=config.job_health.window, rails=config.ib.rails_regex)


def _percent(value: float) -> str:
    return f"{value:.0f} %"


def _rate(value: float) -> str:
    return f"{value / 1e9:.2f} GB/s" if value >= 1e7 else f"{value:.0f} B/s"


GPU_UTIL = Signal("gpu-util", "gpu util", "dcgm", "avg", "", _percent,
                  'avg by ({by}) (avg_over_time(DCGM_FI_DEV_GPU_UTIL{{job="{job}"}}[{w}]))')
GPU_UTIL_MIN = Signal("gpu-util-min", "least busy gpu util", "dcgm", "min", "", _percent,
                      'min by ({by}) (avg_over_time(DCGM_FI_DEV_GPU_UTIL{{job="{job}"}}[{w}]))')
SM_CLOCK = Signal("sm-clock", "sm clock", "dcgm", "min", "low", lambda v: f"{v:.0f} MHz",
                  'min by ({by}) (avg_over_time(DCGM_FI_DEV_SM_CLOCK{{job="{job}"}}[{w}]))')
POWER = Signal("power", "gpu power", "dcgm", "avg", "high", lambda v: f"{v:.0f} W",
               'avg by ({by}) (avg_over_time(DCGM_FI_DEV_POWER_USAGE{{job="{job}"}}[{w}]))')
ACTIVITY = Signal("activity", "graphics engine activity", "dcgm", "avg", "low", lambda v: f"{v * 100:.0f} %",
                  'avg by ({by}) (avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{job="{job}"}}[{w}]))')
# Per GPU, and only the GPUs with a bit to show: the answer stays small however many nodes there are.
CLOCK_EVENTS = Signal("clock-events", "clock event reasons", "dcgm", "bits", "", lambda v: f"0x{int(v):x}",
                      'floor(max by ({by}, gpu) (last_over_time(DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{job="{job}"}}[{w}]))'
                      f' / {2 * IDLE_BIT}) * {2 * IDLE_BIT} > 0')
NVLINK = Signal("nvlink", "nvlink traffic", "dcgm", "sum", "", _rate,
                'sum by ({by}) (rate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{{job="{job}"}}[{w}]))')
IB = Signal("ib", "infiniband traffic", "node", "sum", "low", _rate,
            'sum by ({by}) (rate(node_infiniband_port_data_transmitted_bytes_total{{job="{job}", '
            'device=~"{rails}"}}[{w}]) + rate(node_infiniband_port_data_received_bytes_total{{job="{job}", '
            'device=~"{rails}"}}[{w}]))')

SIGNALS = (GPU_UTIL, GPU_UTIL_MIN, SM_CLOCK, POWER, ACTIVITY, CLOCK_EVENTS, NVLINK, IB)
BY_NAME = {signal.name: signal for signal in SIGNALS}
# The signals whose outliers name a slow node by the robust score; clock-events names one by its bits.
SCORED = (SM_CLOCK, ACTIVITY, POWER, IB)


def in_use(config: Config) -> tuple[Signal, ...]:
    """The signals this site can read: node_exporter's only where prometheus.jobs has its job."""
    return tuple(s for s in SIGNALS if s.source in config.prometheus.jobs)
