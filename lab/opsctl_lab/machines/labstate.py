"""What the lab machines still hold from earlier work, reported by `up` and cleared by `reset`: faults
injected into the GPU machines (they survive a restart, as broken hardware would), Slurm nodes out of
service (slurmctld keeps drains in its state), and opsctl's state and audit log on the head node.

Slurm is read on the head over the lab's SSH with one `sinfo` call. Before `make provision` the head has
no Slurm: then nothing is said about nodes.
"""

import shlex
import subprocess
import time
from pathlib import Path

import yaml

import opsctl
from opsctl.config.schema import DEFAULT_AUDIT_LOG, DEFAULT_STATE_DIR
from opsctl_lab.errors import LabError
from opsctl_lab.hardware import NodeHardware, fault_label
from opsctl_lab.machines import fabric_cabling, keys, nspawn
from opsctl_lab.machines.settings import HW_STATE, Settings
from opsctl_lab.slurm_lab import base_state, is_out_of_service

HEAD = "head"
# node, compact state (idle, drain, down*, ...), reason ("none" when there is none): sinfo(1) -o.
SINFO = "sinfo -h -N -o '%N %t %E'"
NO_SINFO = 127  # the shell's "command not found": Slurm is not installed yet
# How long `up` gives the slurmds to register after SSH answers: a few seconds, once the GPUs are ready. slurmd
# waits for them first where provisioning made it (the slurm_compute role's wait for the fabric and persistence
# mode), and a fabric trains for the machine's training time after Fabric Manager starts (settle_timeout).
SETTLE_S = 30.0
# The opsctl role's defaults (playbooks/roles/opsctl/defaults/main.yml); an inventory may override them.
OPSCTL_CONFIG_VAR = "opsctl_config_path"
OPSCTL_CONFIG_DEFAULT = "/etc/opsctl/config.yaml"
HEAD_GROUPS = ("all", "cluster", "controller")
ROLE_DEFAULTS = Path(opsctl.__file__).resolve().parents[1] / "playbooks/roles/opsctl/defaults/main.yml"

Nodes = dict[str, tuple[str, str]]


# ---- pure: parsing and what is said ------------------------------------------------------------------
def parse_sinfo(text: str) -> Nodes:
    """`sinfo -h -N -o '%N %t %E'` -> node: (compact state, reason or ""). A node in two partitions is
    listed twice by -N; it is one node."""
    nodes: Nodes = {}
    for line in text.splitlines():
        parts = line.split(None, 2)
        if len(parts) < 2:
            continue
        reason = parts[2].strip() if len(parts) == 3 else ""
        nodes[parts[0]] = (parts[1], "" if reason == "none" else reason)
    return nodes


def out_of_service(nodes: Nodes) -> Nodes:
    """The nodes to resume (slurm_lab.is_out_of_service, as the simulated tier's reset)."""
    return {node: value for node, value in nodes.items() if is_out_of_service(value[0])}


def unsettled(nodes: Nodes) -> list[str]:
    """Nodes whose slurmd has not answered yet (`*`, or state unknown) right after the machines start."""
    return sorted(n for n, (state, _) in nodes.items() if state.endswith("*") or base_state(state).startswith("unk"))


def found_lines(nodes: Nodes | None, faults: dict[str, list[str]], sinfo_error: str = "") -> list[str]:
    """What `up` found, as `opsctl lab up` says it: nodes by their state (never "idle" for one that is not),
    each node that is not idle with its reason, and each fault still injected."""
    lines = []
    if nodes is not None:
        by_state: dict[str, int] = {}
        for state, _ in nodes.values():
            by_state[state] = by_state.get(state, 0) + 1
        counts = ", ".join(f"{n} {state}" for state, n in sorted(by_state.items(), key=lambda i: (-i[1], i[0])))
        lines.append(f"slurm: {len(nodes)} nodes ({counts})")
        lines += [f"  {state:8} {node}  {reason}".rstrip() for node, (state, reason) in sorted(nodes.items())
                  if state != "idle"]
    elif sinfo_error:
        lines.append(f"slurm: no answer from sinfo on {HEAD}: {sinfo_error}")
    lines += [f"  faults {node}: {', '.join(labels)}" for node, labels in sorted(faults.items()) if labels]
    return lines


def reset_lines(cleared: dict[str, list[str]], resumed: Nodes, emptied: list[str], where: str) -> list[str]:
    """What `reset` cleared, one line per thing, as `opsctl lab reset` says it."""
    lines = [f"cleared {node}: {', '.join(labels)}" for node, labels in sorted(cleared.items()) if labels]
    lines += [f"resumed {node} ({state})" for node, (state, _) in sorted(resumed.items())]
    if emptied:
        lines.append(f"emptied the opsctl state and audit log on {HEAD} ({where}): {', '.join(emptied)}")
    return lines or ["the lab machines were clean"]


def opsctl_config_path(inventory_dir: Path, role_defaults: Path) -> str:
    """Where the opsctl role writes opsctl's config: the inventory's group_vars of the head's groups, else
    the role's default."""
    path = OPSCTL_CONFIG_DEFAULT
    for source in [role_defaults] + [inventory_dir / "group_vars" / f"{g}.yml" for g in HEAD_GROUPS]:
        try:
            data = yaml.safe_load(source.read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, dict) and isinstance(data.get(OPSCTL_CONFIG_VAR), str):
            path = data[OPSCTL_CONFIG_VAR]
    return path


def opsctl_paths(config_text: str | None) -> tuple[str, str]:
    """(state_dir, audit_log) that opsctl on the head uses: its config's keys, else opsctl's defaults."""
    try:
        data = yaml.safe_load(config_text or "") or {}
    except yaml.YAMLError:
        data = {}
    data = data if isinstance(data, dict) else {}
    return str(data.get("state_dir") or DEFAULT_STATE_DIR), str(data.get("audit_log") or DEFAULT_AUDIT_LOG)


# ---- the machines ------------------------------------------------------------------------------------
def _ssh(settings: Settings, machine: str, command: str, stdin: str | None = None,
         timeout: float = 30) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(keys.ssh_args(settings, machine) + [command], input=stdin or "", capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess([], 124, "", f"no answer from {machine} in {timeout:.0f}s")


def _first_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[0] if lines else f"exit {result.returncode}"


def slurm_nodes(settings: Settings) -> tuple[Nodes | None, str]:
    """(nodes, "") from sinfo on the head; (None, "") without Slurm there; (None, why) when sinfo fails."""
    result = _ssh(settings, HEAD, f"command -v sinfo >/dev/null || exit {NO_SINFO}; {SINFO}")
    if result.returncode == NO_SINFO:
        return None, ""
    if result.returncode != 0:
        return None, _first_line(result)
    return parse_sinfo(result.stdout), ""


def settled_slurm_nodes(settings: Settings, timeout: float = SETTLE_S) -> tuple[Nodes | None, str]:
    """Right after the machines started: sinfo once slurmctld answers and every slurmd has registered (or
    `timeout` has passed: then the states are what they are)."""
    deadline = time.monotonic() + timeout
    while True:
        nodes, error = slurm_nodes(settings)
        waiting = error or (nodes is not None and unsettled(nodes))
        if not waiting or time.monotonic() > deadline:
            return nodes, error
        time.sleep(1)


def settle_timeout(settings: Settings) -> float:
    """The bound of `up`'s wait for the slurmds: SETTLE_S past the machines' fabric training, which a slurmd that
    waits for its GPUs waits out before it registers. A bound only: `up` goes on once every node has registered."""
    return SETTLE_S + settings.fabric_training_s


def faults(settings: Settings, machines: list[str]) -> dict[str, list[str]]:
    """Faults injected into each GPU machine, from its state file in the machine's own layer, and the
    fabric's own (opsctl_lab.machines.fabric_cabling)."""
    found = {}
    for name in machines:
        state = nspawn.upper(settings, name) / HW_STATE.lstrip("/")
        if name != HEAD and state.exists():
            found[name] = [fault_label(f) for f in NodeHardware.load(state, name).active]
    found[fabric_cabling.FABRIC] = fabric_cabling.faults(settings)
    return found


def report(settings: Settings, machines: list[str], settle: bool) -> list[str]:
    nodes, error = settled_slurm_nodes(settings, settle_timeout(settings)) if settle else slurm_nodes(settings)
    return found_lines(nodes, faults(settings, machines), error)


# Runs on the head as root: opsctl's state files (not its run lock, nor a directory another role keeps
# there) are removed while holding that lock, so that no timer run writes them meanwhile; the audit log
# is emptied in place. Prints the name of each thing it emptied.
EMPTY_STATE = r"""
state=$1 log=$2
if [ -f "$state/lock" ]; then exec 9<"$state/lock"; flock -w 30 9 || exit 1; fi
for file in "$state"/* "$state"/.[!.]*; do
  if [ -f "$file" ] && [ ! -L "$file" ] && [ "${file##*/}" != lock ]; then rm -f -- "$file"; echo "${file##*/}"; fi
done
if [ -s "$log" ] && [ ! -L "$log" ]; then : > "$log"; echo "${log##*/}"; fi
"""


def empty_opsctl_state(settings: Settings, role_defaults: Path = ROLE_DEFAULTS) -> tuple[list[str], str]:
    config = opsctl_config_path(settings.inventory_dir, role_defaults)
    read = _ssh(settings, HEAD, f"cat {shlex.quote(config)} 2>/dev/null || true")
    state_dir, audit_log = opsctl_paths(read.stdout if read.returncode == 0 else None)
    result = _ssh(settings, HEAD, f"sh -s -- {shlex.quote(state_dir)} {shlex.quote(audit_log)}", stdin=EMPTY_STATE)
    if result.returncode != 0:
        raise LabError(f"{HEAD}: emptying {state_dir}: {_first_line(result)}")
    return result.stdout.split(), f"{state_dir}, {audit_log}"


def reset(settings: Settings, running: list[str], role_defaults: Path = ROLE_DEFAULTS) -> list[str]:
    """Clear every fault, resume every node out of service, empty opsctl's state and audit log."""
    cleared = faults(settings, running)
    fabric_cabling.clear(settings)
    for name, labels in cleared.items():
        if labels and name != fabric_cabling.FABRIC:
            result = _ssh(settings, name, "/usr/local/sbin/opsctl-hw clear", timeout=60)
            if result.returncode != 0:
                raise LabError(f"{name}: opsctl-hw clear: {_first_line(result)}")
    nodes, error = slurm_nodes(settings)
    if error:
        raise LabError(f"{HEAD}: sinfo: {error}")
    resumed = out_of_service(nodes or {})
    if resumed:
        result = _ssh(settings, HEAD, f"scontrol update nodename={','.join(sorted(resumed))} state=resume")
        if result.returncode != 0:
            raise LabError(f"{HEAD}: scontrol update state=resume: {_first_line(result)}")
    emptied, where = empty_opsctl_state(settings, role_defaults)
    return reset_lines(cleared, resumed, emptied, where)
