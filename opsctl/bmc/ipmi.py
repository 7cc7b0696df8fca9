"""A node's power cycle through its BMC over IPMI 2.0 (ipmitool's lanplus interface), the option for BMCs
without Redfish:

    ipmitool -I lanplus -H <bmc> -U <user> -f <password_file> chassis power cycle

ipmitool(1): "power cycle: provides a power off interval of at least 1 second"; the password stays in its file
(`-f`), never on a command line that `ps` shows.
"""

import subprocess

from opsctl.config.schema import BmcConfig
from opsctl.errors import SourceUnavailable
from opsctl.gpu.tools import Run, exited, run_tool


class Ipmi:
    def __init__(self, bmc: BmcConfig, run: Run = subprocess.run):
        self.bmc, self.run = bmc, run

    def power_cycle(self, node: str) -> str:
        host = self.bmc.url.format(node=node)
        argv = ["ipmitool", "-I", "lanplus", "-H", host, "-U", self.bmc.user, "-f", str(self.bmc.password_file),
                "chassis", "power", "cycle"]
        out = run_tool(self.run, argv, self.bmc.timeout)
        if out.returncode != 0:
            raise SourceUnavailable(f"BMC {host}: {exited(out, 'ipmitool chassis power cycle')}")
        return f"BMC power cycle (IPMI): {out.stdout.strip() or 'done'}"
