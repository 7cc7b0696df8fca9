"""The nodes' BMCs: the remediation ladder's power cycle of a node whose reboot never came back (a GPU off the bus
can hang a graceful reboot; NVIDIA's XID catalog says RESTART_BM for XID 79). Redfish by default (DMTF DSP0266,
`ComputerSystem.Reset`), IPMI through ipmitool as an option. The password is read from `bmc.password_file` at use
and never written to a log, an audit record or an error message.
"""

from typing import Protocol

from opsctl.config.schema import BmcConfig
from opsctl.errors import ConfigError


class PowerControl(Protocol):
    def power_cycle(self, node: str) -> str:
        """Power the node off and on again; what happened, in words. SourceUnavailable when the BMC did not."""
        ...


def power_control(bmc: BmcConfig) -> PowerControl:
    """The configured BMC client; ConfigError when no protocol is set."""
    if bmc.protocol == "redfish":
        from opsctl.bmc.redfish import Redfish

        return Redfish(bmc)
    if bmc.protocol == "ipmi":
        from opsctl.bmc.ipmi import Ipmi

        return Ipmi(bmc)
    raise ConfigError("bmc.protocol is not set: no BMC to power-cycle a node with")
