"""The one place where opsctl builds what it talks to: the config, the Prometheus client, the Slurm
backend, the nodes' BMCs and how the node's GPU tools run. The CLI passes a Clients through click's context
object; tests pass one holding fakes of the PromQuery and Slurm protocols and of the tools' runner
(`CliRunner().invoke(main, args, obj=Clients(...))`)."""

import os
import subprocess
from typing import cast

from opsctl.bmc import PowerControl
from opsctl.config import Config, load_config
from opsctl.errors import ConfigError
from opsctl.gpu.tools import Run
from opsctl.prom.client import PromClientImpl, PromQuery, PromRangeQuery
from opsctl.slurm import Slurm, SlurmCliImpl, make_slurm
from opsctl.slurm.base import SlurmAccounting, SlurmReservations
from opsctl.slurm.requeue import SlurmRequeue


class Clients:
    def __init__(self, config: Config | None = None, prom: PromQuery | None = None, slurm: Slurm | None = None,
                 jobs: SlurmReservations | None = None, accounting: SlurmAccounting | None = None,
                 tools: Run | None = None, requeues: SlurmRequeue | None = None, power: PowerControl | None = None):
        self._config = config
        self._power = power
        self._tools = tools
        self._prom = prom
        self._slurm = slurm
        self._jobs = jobs
        self._accounting = accounting
        self._requeues = requeues
        self._loaded_here = False
        self.config_path: str | None = None
        self.prometheus_url: str | None = None
        self.debug = False

    def use(self, config_path: str | None, prometheus_url: str | None = None) -> "Clients":
        """The command's --config and --prometheus; they apply to what is built after this call."""
        self.config_path = config_path
        self.prometheus_url = prometheus_url
        return self

    def config(self, acting: bool = False) -> Config:
        """The config; `acting` for a command that changes nodes, whose state directory must be the cluster's."""
        if self._config is None:
            self._config = load_config(self.config_path)
            self._loaded_here = True
        if acting and self._loaded_here:  # a config handed in (tests) is taken as it is
            refuse_private_state_dir(self._config, self.config_path)
        return self._config

    def power(self) -> PowerControl | None:
        """The nodes' BMCs when handed a fake (tests); None: the actor builds bmc's client when a step needs it."""
        return self._power

    def tools(self) -> Run:
        """How the node's GPU tools run (opsctl.gpu.tools.run_tool): subprocess.run unless handed a fake."""
        return self._tools or subprocess.run

    def prom(self) -> PromQuery:
        if self._prom is None:
            self._prom = PromClientImpl.from_config(self.config().prometheus, self.prometheus_url)
        return self._prom

    def slurm(self) -> Slurm:
        if self._slurm is None:
            self._slurm = make_slurm(self.config())
        return self._slurm

    def jobs(self) -> SlurmReservations:
        """opsctl's own jobs go through sbatch, squeue and scancel, whichever backend reads the nodes."""
        if self._jobs is None:
            self._jobs = self._slurm_commands()
        return self._jobs

    def accounting(self) -> SlurmAccounting:
        """Ended jobs come from sacct, whichever backend reads the nodes."""
        if self._accounting is None:
            self._accounting = self._slurm_commands()
        return self._accounting

    def requeues(self) -> SlurmRequeue:
        """Users' jobs are read and requeued through squeue and scontrol, whichever backend reads the nodes."""
        if self._requeues is None:
            self._requeues = self._slurm_commands()
        return self._requeues

    def _slurm_commands(self) -> SlurmCliImpl:
        slurm = self.slurm()
        return slurm if isinstance(slurm, SlurmCliImpl) else SlurmCliImpl(
            self.config().slurm.sinfo, self.config().slurm.scontrol, self.config().slurm.timeout_seconds)

    def prom_range(self) -> PromRangeQuery:
        prom = self.prom()
        if not hasattr(prom, "query_range"):
            raise ConfigError("this Prometheus client answers no range queries")
        return cast(PromRangeQuery, prom)

    def fresh_prom(self) -> PromQuery:
        """A new client per --watch round: its query count and warnings are that round's."""
        if isinstance(self._prom, PromClientImpl):
            self._prom = None
        return self.prom()


def refuse_private_state_dir(config: Config, config_path: str | None) -> None:
    """One safety state per cluster: the lock, the budgets and the handled events that every acting run
    shares live in the config's `state_dir`. OPSCTL_STATE_DIR naming another directory would give this run a
    lock, budget and memory of its own (a re-drain of a node that a person repaired): for actions, refused."""
    private = os.environ.get("OPSCTL_STATE_DIR")
    if not private:
        return
    system = load_config(config_path, {k: v for k, v in os.environ.items() if k != "OPSCTL_STATE_DIR"}).state_dir
    if os.path.realpath(private) != os.path.realpath(system):
        raise ConfigError(f"OPSCTL_STATE_DIR={private} is for read-only runs: a command that changes nodes uses "
                          f"the cluster's one state directory {system} (config state_dir), whose lock, budgets and "
                          "handled events every run shares; unset OPSCTL_STATE_DIR")
