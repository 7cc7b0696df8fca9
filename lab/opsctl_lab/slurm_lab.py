"""The lab's Slurm: its own munged, one slurmctld and one slurmd per emulated node, all real
Debian daemons, configured from templates under lab/opsctl_lab/templates/."""

import os
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import jinja2

from opsctl.slurm.hostlist import hostlist_expression
from opsctl_lab import paths as lp
from opsctl_lab import processes, slurm_reboot
from opsctl_lab.errors import LabError
from opsctl_lab.hardware import GPUS_PER_NODE

EPILOG_TEMPLATE = (Path(__file__).resolve().parents[2] / "playbooks" / "roles" / "slurm_controller" / "templates"
                   / "opsctl-epilog-slurmctld.sh.j2")
_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("opsctl_lab", "templates"), undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True)


# sinfo's compact node states (`%t`), as both lab tiers read them: flags it appends (`*` not responding,
# `~` powered off, ...), and the states of a node out of service, whoever took it out.
STATE_FLAGS = "*~#!%$@^-"
OUT_OF_SERVICE = ("drain", "drng", "down", "fail")
# The states of a node that has registered and answers, whatever its capacity is kept for: a job, a drain,
# or a reservation over it (maint, resv; plnd: a job planned on it).
SETTLED = ("idle", "drain", "alloc", "mix", "maint", "resv", "plnd")


def base_state(state: str) -> str:
    return state.rstrip(STATE_FLAGS)


def is_out_of_service(state: str) -> bool:
    return base_state(state).startswith(OUT_OF_SERVICE)


def render_configs(paths: lp.LabPaths, nodes: int) -> None:
    values = {
        "slurmctld_port": lp.slurmctld_port(),
        "slurmdbd_port": lp.slurmdbd_port(),
        "munge_socket": paths.munge / "munge.socket",
        "slurm_dir": paths.slurm,
        "log_dir": paths.logs,
        "nodes_expr": ",".join(hostlist_expression(lp.node_name(i) for i in range(nodes))),
        "ports_expr": ",".join(hostlist_expression(range(lp.slurmd_first_port(), lp.slurmd_first_port() + nodes))),
        "dev_dir": paths.dev,
        "reboot_program": reboot_program(paths),
        "epilog_slurmctld": epilog_slurmctld(paths),
    }
    for sub in ("state", "spool"):
        (paths.slurm / sub).mkdir(parents=True, exist_ok=True)
    for name in ("slurm.conf", "gres.conf", "cgroup.conf"):
        (paths.slurm / name).write_text(_TEMPLATES.get_template(f"{name}.j2").render(**values))
    slurm_reboot.write_program(reboot_program(paths), cluster="the opsctl lab", run_dir=paths.run,
                               log_dir=paths.logs, slurm_conf=paths.slurm_conf,
                               hardware=slurm_reboot.hardware_command(paths))
    make_gpu_devices(paths.dev)
    write_epilog_slurmctld(paths)


def epilog_slurmctld(paths: lp.LabPaths) -> Path:
    return paths.slurm / "epilog-slurmctld"


def write_epilog_slurmctld(paths: lp.LabPaths) -> None:
    """The slurm_controller role's own EpilogSlurmctld, rendered for the lab's spool (slurmctld runs it as
    SlurmUser, root here)."""
    paths.why_spool.mkdir(mode=0o700, exist_ok=True)
    template = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    template.filters["comment"] = lambda text: "".join(f"# {line}\n" for line in str(text).splitlines())
    script = template.from_string(EPILOG_TEMPLATE.read_text()).render(
        ansible_managed="Rendered by `opsctl lab up` from the slurm_controller role's template.",
        slurm_controller_why_spool=paths.why_spool)
    epilog_slurmctld(paths).write_text(script)
    epilog_slurmctld(paths).chmod(0o755)


def reboot_program(paths: lp.LabPaths) -> Path:
    """slurm.conf's RebootProgram: `scontrol reboot` restarts the node's slurmd (opsctl_lab.slurm_reboot)."""
    return paths.slurm / "reboot"


def make_gpu_devices(dev: Path) -> None:
    """/dev/nvidiaN stand-ins: character devices 195:N, as the NVIDIA driver makes them."""
    dev.mkdir(parents=True, exist_ok=True)
    for gpu in range(GPUS_PER_NODE):
        node = dev / f"nvidia{gpu}"
        if not node.exists():
            os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(195, gpu))


def start_munge(paths: lp.LabPaths) -> None:
    paths.munge.mkdir(parents=True, exist_ok=True)
    os.chmod(paths.munge, 0o700)
    key = paths.munge / "munge.key"
    if not key.exists():
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as out:
            out.write(os.urandom(1024))
    processes.start("munged", [
        "munged", "--foreground", "--force", f"--socket={paths.munge / 'munge.socket'}",
        f"--key-file={key}", f"--pid-file={paths.munge / 'munged.pid'}",
        f"--log-file={paths.logs / 'munged.log'}", f"--seed-file={paths.munge / 'munged.seed'}",
    ], paths.run, paths.logs)
    wait_for(lambda: (paths.munge / "munge.socket").exists(), 10, "munged did not create its socket")


def start_slurm(paths: lp.LabPaths, nodes: int) -> None:
    env = {"SLURM_CONF": str(paths.slurm_conf)}
    processes.start("slurmctld", ["slurmctld", "-D", "-i", "-f", str(paths.slurm_conf)], paths.run,
                    paths.logs, env=env)
    for index in range(nodes):
        name = lp.node_name(index)
        processes.start(f"slurmd.{name}", ["slurmd", "-D", "-N", name, "-f", str(paths.slurm_conf)],
                        paths.run, paths.logs, env=env)


def node_states(paths: lp.LabPaths) -> dict[str, str]:
    """node -> compact sinfo state (idle, drain, down*, ...); empty if slurmctld does not answer."""
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=10,
                             env={**os.environ, "SLURM_CONF": str(paths.slurm_conf)})
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if out.returncode != 0:
        return {}
    return {node: state for node, state in (line.split(None, 1) for line in out.stdout.splitlines() if " " in line)}


def ladder_down(paths: lp.LabPaths) -> set[str]:
    """The nodes DOWN with their slurmd answering and an opsctl reason: where opsctl's remediation ladder
    leaves a node (rebooted with nextstate=DOWN, then validated, unvalidated or RMA) until it or a person
    resumes it. Empty if slurmctld does not answer."""
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-t", "down", "-o", "%N|%t|%E"], capture_output=True, text=True,
                             timeout=10, env={**os.environ, "SLURM_CONF": str(paths.slurm_conf)})
    except (OSError, subprocess.TimeoutExpired):
        return set()
    rows = [line.split("|", 2) for line in out.stdout.splitlines() if line.count("|") >= 2]
    return {node for node, state, reason in rows if state == "down" and reason.startswith("opsctl:")}


def unsettled(states: dict[str, str], ladder: set[str]) -> list[str]:
    """The nodes still on their way in: not idle, drained, allocated or reserved, or not answering (`*`); a node
    the ladder left DOWN (`ladder`, ladder_down) is where it belongs."""
    return [node for node, state in states.items()
            if (not base_state(state).startswith(SETTLED) or state.endswith("*"))
            and not (state == "down" and node in ladder)]


def _slurm(paths: lp.LabPaths, *argv: str) -> str:
    """A Slurm command's output; its failure a LabError naming it."""
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=30,
                         env={**os.environ, "SLURM_CONF": str(paths.slurm_conf)})
    if out.returncode != 0:
        raise LabError(f"{' '.join(argv[:2])} failed: {(out.stderr or out.stdout).strip()[:200]}")
    return out.stdout


def resume(paths: lp.LabPaths, nodes: list[str]) -> None:
    """Return nodes to service (lifts DRAIN and DOWN), whoever took them out."""
    _slurm(paths, "scontrol", "update", f"nodename={','.join(nodes)}", "state=resume")


def reservations(paths: lp.LabPaths) -> dict[str, str]:
    """name -> nodes of every reservation slurmctld holds ("No reservations in the system" when none)."""
    found = {}
    for line in _slurm(paths, "scontrol", "-o", "show", "reservation").splitlines():
        fields = dict(field.split("=", 1) for field in line.split() if "=" in field)
        if "ReservationName" in fields:
            found[fields["ReservationName"]] = fields.get("Nodes", "")
    return found


def delete_reservation(paths: lp.LabPaths, name: str) -> None:
    _slurm(paths, "scontrol", "delete", f"ReservationName={name}")


def jobs(paths: lp.LabPaths) -> list[str]:
    """The ids of every job slurmctld holds that has not ended (pending, held, running, completing)."""
    return _slurm(paths, "squeue", "-h", "-o", "%i").split()


def cancel(paths: lp.LabPaths, job_ids: list[str]) -> None:
    _slurm(paths, "scancel", *job_ids)


def wait_for(check: Callable[[], object], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise LabError(message)
        time.sleep(0.1)
