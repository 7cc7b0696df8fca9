"""A node's power cycle through its BMC's Redfish service (DMTF DSP0266; the ComputerSystem schema's
`Actions/#ComputerSystem.Reset` with a `ResetType`, and its `PowerState`):

    POST /redfish/v1/Systems/<id>/Actions/ComputerSystem.Reset   {"ResetType": "ForceOff"}
    GET  /redfish/v1/Systems/<id>                                until "PowerState": "Off"
    POST ...ComputerSystem.Reset                                 {"ResetType": "On"}
    GET  ...                                                     until "PowerState": "On"

ForceOff and On rather than PowerCycle: every Redfish BMC implements those two (PowerCycle is optional in the
schema's ResetType list), and the node is seen off before it is powered on. A BMC applies an action a moment
later (the request answers 202 or 204 at once): the power state is polled, bounded by bmc.power_wait. With no
`bmc.system`, the BMC's one ComputerSystem (its /redfish/v1/Systems collection) is the node.
"""

import time
from typing import Any

import requests

from opsctl.config.schema import BmcConfig
from opsctl.errors import SourceUnavailable
from opsctl.fileio import read_secret

POLL_S = 2.0
SYSTEMS = "/redfish/v1/Systems"


class Redfish:
    def __init__(self, bmc: BmcConfig, session: Any = None, clock: Any = time):
        self.bmc, self.clock = bmc, clock
        self.session = session or requests.Session()

    def power_cycle(self, node: str) -> str:
        base = self.bmc.url.format(node=node).rstrip("/")
        system = self._system(base, node)
        self._reset(system, "ForceOff")
        off = self._wait(system, "Off")
        self._reset(system, "On")
        on = self._wait(system, "On")
        return f"BMC power cycle: ForceOff, Off after {off:.0f}s, On, On after {on:.0f}s"

    def _system(self, base: str, node: str) -> str:
        if self.bmc.system:
            return f"{base}{SYSTEMS}/{self.bmc.system.format(node=node)}"
        members = self._get(f"{base}{SYSTEMS}").get("Members") or []
        if len(members) != 1 or "@odata.id" not in members[0]:
            raise SourceUnavailable(f"BMC {base}: {len(members)} systems under {SYSTEMS}; set bmc.system")
        return f"{base}{members[0]['@odata.id']}"

    def _reset(self, system: str, reset_type: str) -> None:
        self._request("POST", f"{system}/Actions/ComputerSystem.Reset", json={"ResetType": reset_type})

    def _wait(self, system: str, state: str) -> float:
        """Seconds until the system's PowerState is `state`; SourceUnavailable past bmc.power_wait."""
        start = self.clock.monotonic()
        while True:
            seen = self._get(system).get("PowerState")
            waited = self.clock.monotonic() - start
            if seen == state:
                return waited
            if waited >= self.bmc.power_wait:
                raise SourceUnavailable(f"BMC {system}: PowerState {seen} after {waited:.0f}s, not {state}")
            self.clock.sleep(POLL_S)

    def _get(self, url: str) -> dict[str, Any]:
        body = self._request("GET", url).json()
        if not isinstance(body, dict):
            raise SourceUnavailable(f"BMC {url}: not a Redfish resource")
        return body

    def _request(self, method: str, url: str, **kwargs: Any) -> Any:
        verify: bool | str = self.bmc.ca_bundle or self.bmc.verify_tls
        auth = (self.bmc.user, read_secret(self.bmc.password_file, "bmc.password_file"))
        try:
            answer = self.session.request(method, url, auth=auth, verify=verify, timeout=self.bmc.timeout, **kwargs)
        except requests.RequestException as err:
            raise SourceUnavailable(f"BMC {method} {url}: {type(err).__name__}") from None
        if answer.status_code >= 400:
            raise SourceUnavailable(f"BMC {method} {url}: HTTP {answer.status_code}")
        return answer
