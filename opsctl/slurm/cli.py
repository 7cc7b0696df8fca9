"""The `cli` Slurm backend: sinfo --json to read, scontrol to change. Works with Slurm 22.05+.

`sinfo --json` (22.05) prints, per node (trimmed):
  {"nodes": [{"name": "gpu001", "state": "idle", "state_flags": ["DRAIN"],
              "reason": "opsctl:xid-79 gpu3 xid=79 count=1", "partitions": ["gpu"], ...}], ...}
Later releases spell `state` as a list (["IDLE", "DRAIN"]); both are read.
scontrol exits 0 on success and 1 with a message on stderr otherwise.
"""

import json
import subprocess
from collections.abc import Callable

from opsctl.errors import SourceUnavailable
from opsctl.slurm.base import SlurmNode


def process_sinfo_output(text: str) -> dict[str, SlurmNode]:
    try:
        data = json.loads(text)
    except ValueError:
        raise SourceUnavailable("sinfo --json: output is not JSON") from None
    raw_nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(raw_nodes, list):
        raise SourceUnavailable("sinfo --json: no `nodes` list in the output")
    nodes = {}
    for raw in raw_nodes:
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise SourceUnavailable("sinfo --json: a node entry has no name")
        state = raw.get("state", "")
        flags = [str(f).upper() for f in raw.get("state_flags") or []]
        if isinstance(state, list):  # 23.02+: ["IDLE", "DRAIN"]; the first is the base state
            flags += [str(s).upper() for s in state[1:]]
            state = state[0] if state else ""
        nodes[raw["name"]] = SlurmNode(name=raw["name"], state=str(state).lower(), flags=tuple(dict.fromkeys(flags)),
                                       reason=str(raw.get("reason") or ""))
    return nodes


# subprocess.run's shape, so that tests can pass a fake (the lab tier runs the real commands).
Runner = Callable[..., "subprocess.CompletedProcess[str]"]


class SlurmCliImpl:
    def __init__(self, sinfo: str = "sinfo", scontrol: str = "scontrol", timeout: float = 30.0,
                 run: Runner = subprocess.run):
        self.sinfo = sinfo
        self.scontrol = scontrol
        self.timeout = timeout
        self._run = run

    def _call(self, argv: list[str]) -> str:
        try:
            proc = self._run(argv, capture_output=True, text=True, timeout=self.timeout)
        except FileNotFoundError:
            raise SourceUnavailable(f"Slurm: {argv[0]} not found (install slurm-client or set slurm.{argv[0]})") \
                from None
        except subprocess.TimeoutExpired:
            raise SourceUnavailable(f"Slurm: {argv[0]} {argv[1]} timed out after {self.timeout:g}s") from None
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout or "").strip().splitlines()
            msg = lines[0] if lines else f"exit {proc.returncode}"
            raise SourceUnavailable(f"Slurm: {argv[0]} {argv[1]} failed: {msg}")
        return str(proc.stdout)

    def nodes(self) -> dict[str, SlurmNode]:
        return process_sinfo_output(self._call([self.sinfo, "--json"]))

    def drain(self, names: list[str], reason: str) -> None:
        # One call for all nodes that share the reason; argv, not a shell, so the reason needs no quoting.
        self._call([self.scontrol, "update", f"nodename={','.join(names)}", "state=drain", f"reason={reason}"])

    def resume(self, names: list[str]) -> None:
        self._call([self.scontrol, "update", f"nodename={','.join(names)}", "state=resume"])

    def expand(self, hostlist: str) -> list[str]:
        return self._call([self.scontrol, "show", "hostnames", hostlist]).split()
