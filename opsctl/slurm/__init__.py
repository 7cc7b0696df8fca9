"""Slurm access: the `cli` backend (sinfo/scontrol) or `pyslurm`, chosen by slurm.backend."""

from opsctl.config.schema import Config
from opsctl.slurm.base import MANUAL_PREFIX, OWNED_PREFIX, Slurm, SlurmNode
from opsctl.slurm.cli import SlurmCliImpl, parse_nodes, parse_sinfo


def make_slurm(config: Config) -> Slurm:
    if config.slurm.backend == "pyslurm":
        from opsctl.slurm.pyslurm_backend import PySlurmImpl

        return PySlurmImpl()
    return SlurmCliImpl(config.slurm.sinfo, config.slurm.scontrol, config.slurm.timeout_seconds)


__all__ = ["MANUAL_PREFIX", "OWNED_PREFIX", "Slurm", "SlurmCliImpl", "SlurmNode", "make_slurm",
           "parse_nodes", "parse_sinfo"]
