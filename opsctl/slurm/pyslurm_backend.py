"""The `pyslurm` Slurm backend, for sites whose pyslurm matches their Slurm (25.11 and later).

pyslurm is imported only when this backend is chosen, so the default install does not need it.
"""

import importlib

from opsctl.errors import ConfigError, SourceUnavailable
from opsctl.slurm.base import SlurmNode
from opsctl.slurm.cli import SlurmCliImpl


def _seconds(value: object) -> float | None:
    """pyslurm's Node times (boot_time, reason_time): Unix seconds, None or 0 when Slurm has none."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


class PySlurmImpl:
    def __init__(self) -> None:
        try:
            self.pyslurm = importlib.import_module("pyslurm")
        except ImportError:
            raise ConfigError("config key slurm.backend: pyslurm is not installed "
                              "(pip install 'opsctl[pyslurm]', or use backend: cli)") from None

    def nodes(self) -> dict[str, SlurmNode]:
        try:
            raw = self.pyslurm.Nodes.load()
        except Exception as err:  # pyslurm raises its own RPCError family
            raise SourceUnavailable(f"Slurm (pyslurm): {err}") from None
        nodes = {}
        for name, node in raw.items():
            states = [s.lower() for s in str(node.state).replace("+", " ").split()]
            flags = tuple(s.upper() for s in states[1:])
            reason = node.reason or ""
            nodes[name] = SlurmNode(name=name, state=states[0] if states else "", flags=flags,
                                    reason=reason, partitions=tuple(node.partitions or ()),
                                    gres=",".join(f"{k}:{v}" for k, v in (node.configured_gres or {}).items()),
                                    boot_time=_seconds(getattr(node, "boot_time", None)),
                                    reason_user=str(getattr(node, "reason_user", "") or "") if reason else "",
                                    reason_time=_seconds(getattr(node, "reason_time", None)) if reason else None)
        return nodes

    def _update(self, names: list[str], **changes: str) -> None:
        try:
            for name in names:
                self.pyslurm.Node(name).modify(self.pyslurm.Node(**changes))
        except Exception as err:
            raise SourceUnavailable(f"Slurm (pyslurm): update failed: {err}") from None

    def drain(self, names: list[str], reason: str) -> None:
        self._update(names, state="DRAIN", reason=reason)

    def resume(self, names: list[str]) -> None:
        self._update(names, state="RESUME")

    def set_reason(self, names: list[str], reason: str) -> None:
        self._update(names, reason=reason)

    def reboot(self, names: list[str], reason: str) -> None:
        SlurmCliImpl().reboot(names, reason)  # pyslurm has no reboot request; scontrol is installed with it

    def return_to_service(self) -> int:
        return SlurmCliImpl().return_to_service()  # the same text wherever scontrol runs

    def expand(self, hostlist: str) -> list[str]:
        # Hostlist syntax is Slurm's own; scontrol is installed wherever pyslurm can work.
        return SlurmCliImpl().expand(hostlist)
