"""The one place where opsctl builds what it talks to: the config, the Prometheus client and the Slurm
backend. The CLI passes a Clients through click's context object; tests pass one holding fakes of
the PromQuery and Slurm protocols (`CliRunner().invoke(main, args, obj=Clients(...))`)."""

from opsctl.config import Config, load_config
from opsctl.prom.client import PromClientImpl, PromQuery
from opsctl.slurm import Slurm, make_slurm


class Clients:
    def __init__(self, config: Config | None = None, prom: PromQuery | None = None, slurm: Slurm | None = None):
        self._config = config
        self._prom = prom
        self._slurm = slurm
        self.config_path: str | None = None
        self.prometheus_url: str | None = None
        self.debug = False

    def use(self, config_path: str | None, prometheus_url: str | None = None) -> "Clients":
        """The command's --config and --prometheus; they apply to what is built after this call."""
        self.config_path = config_path
        self.prometheus_url = prometheus_url
        return self

    def config(self) -> Config:
        if self._config is None:
            self._config = load_config(self.config_path)
        return self._config

    def prom(self) -> PromQuery:
        if self._prom is None:
            self._prom = PromClientImpl.from_config(self.config().prometheus, self.prometheus_url)
        return self._prom

    def slurm(self) -> Slurm:
        if self._slurm is None:
            self._slurm = make_slurm(self.config())
        return self._slurm

    def fresh_prom(self) -> PromQuery:
        """A new client per --watch round: its query count and warnings are that round's."""
        if isinstance(self._prom, PromClientImpl):
            self._prom = None
        return self.prom()
