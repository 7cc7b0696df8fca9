"""The series `opsctl job-health --queue` leaves for Prometheus: one per verdict of its last run, and when that
run ended, in a textfile of its own (job_health.textfile) beside opsctl health's, which each run replaces
whole. A verdict's series is gone from the next run that no longer finds it (the job ended or recovered),
and the alert (opsctl.metrics.alerts, OpsctlJobHealthVerdict) also stops when the runs themselves stop,
so a textfile that a stopped timer left behind raises no alert for ever. Node names are in `slurm_node`, as
in opsctl's other metrics: node_exporter's target already has a `node` label (the head node's name)."""

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

VERDICT = "opsctl_job_health_verdict"
LAST_RUN = "opsctl_job_health_last_run_timestamp_seconds"
JOBS = "opsctl_job_health_jobs"


@dataclass(frozen=True)
class VerdictSample:
    job: str
    node: str  # "" for a hung job none of whose nodes stands out
    verdict: str  # hung | slow
    signal: str


class JobHealthMetrics(Collector):
    """The samples of one run: its verdicts, how many multi-node jobs it judged, by verdict, and when."""

    def __init__(self, verdicts: Iterable[VerdictSample], jobs: dict[str, int], now: float):
        self.verdicts = sorted(set(verdicts), key=lambda v: (v.job, v.node, v.verdict, v.signal))
        self.jobs = jobs
        self.now = now

    def collect(self) -> Iterable[Metric]:
        verdict = GaugeMetricFamily(VERDICT, "1 for each verdict of the last opsctl job-health run: a running "
                                    "job's node that hangs or slows it, by the signal that says so (slurm_node "
                                    "empty: a hung job none of whose nodes stands out).",
                                    labels=("slurm_job", "slurm_node", "verdict", "signal"))
        for v in self.verdicts:
            verdict.add_metric([v.job, v.node, v.verdict, v.signal], 1.0)
        yield verdict
        jobs = GaugeMetricFamily(JOBS, "Running multi-node jobs in the last opsctl job-health run, by verdict.",
                                 labels=("verdict",))
        for name, count in sorted(self.jobs.items()):
            jobs.add_metric([name], float(count))
        yield jobs
        yield GaugeMetricFamily(LAST_RUN, "When the last opsctl job-health run ended that read Slurm and "
                                "Prometheus.", value=self.now)
