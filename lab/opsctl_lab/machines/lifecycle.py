"""`opsctl lab machines up|down|status|reset|inject|clear`: the whole life of the machines tier.

`up` is idempotent: with every machine running and answering SSH it changes nothing. It prints the
time of each phase (network, apt cache, image, machines, ssh) and the total, then what the machines still
hold: faults injected into them and Slurm nodes out of service (labstate.py).
"""

import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from opsctl.errors import ExitCode
from opsctl_lab.errors import LabError
from opsctl_lab.hardware import NodeHardware, parse_fault
from opsctl_lab.machines import (
    aptcache,
    disks,
    fabric_cabling,
    hwinstall,
    image,
    inventory,
    keys,
    labstate,
    net,
    nspawn,
    readiness,
)
from opsctl_lab.machines import vendor_server as vendor_serve
from opsctl_lab.machines.settings import (
    HW_STATE,
    MAX_GPU_NODES,
    STORAGE_MACHINE,
    Settings,
    is_gpu_machine,
    machine_names,
)
from opsctl_lab.processes import stop_pids
from opsctl_lab.vendor_repos import build as vendor_build

Echo = Callable[[str], None]
NEEDED = ["ip", "debootstrap", "systemd-nspawn", "apt-cacher-ng", "ssh", "ssh-keygen", "chroot"]


def _preflight() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab machines need root (network namespaces, systemd-nspawn)")
    missing = [tool for tool in NEEDED if shutil.which(tool) is None]
    if missing:
        raise LabError(f"missing {', '.join(missing)}: run `make deps-machines`")


@contextmanager
def _locked(settings: Settings) -> Iterator[None]:
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    with open(settings.state_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def known(settings: Settings) -> list[str]:
    """Machines this tier has a directory for, head first."""
    if not settings.state_dir.is_dir():
        return []
    names = [p.name for p in settings.state_dir.iterdir() if (p / "upper").is_dir()]
    return sorted(names, key=lambda n: (n != "head", is_gpu_machine(n), len(n), n))


def _all_ready(settings: Settings, names: list[str], run: readiness.Runner = subprocess.run) -> bool:
    """Whether `up` has nothing to do: inventory and known_hosts written, exactly these machines and the apt
    cache running, and every machine ready for provisioning by the same check that `up` waits for (a
    machine that answers root while its boot still refuses other logins is not)."""
    if not (settings.inventory_dir / "hosts.yml").exists() or not settings.known_hosts.exists():
        return False
    running = {n for n in known(settings) if nspawn.running_pid(settings, n)}
    if running != set(names) or aptcache.running_pid(settings) is None or vendor_serve.running_pid(settings) is None:
        return False
    return all(readiness.ready(settings, n, run) for n in names)


def up(count: int = 3, echo: Echo = lambda _line: None, settings: Settings | None = None,
       boot_timeout: float = 90) -> ExitCode:
    if not 1 <= count <= MAX_GPU_NODES:
        raise LabError(f"--count must be 1-{MAX_GPU_NODES} GPU machines")
    _preflight()
    settings = settings or Settings()
    names = machine_names(count)
    start = time.monotonic()
    with _locked(settings):
        if _all_ready(settings, names):
            echo(f"lab machines already up: {', '.join(names)} ({time.monotonic() - start:.1f}s)")
            for line in labstate.report(settings, names, settle=False):
                echo(line)
            return ExitCode.OK
        phase = _phases(echo)
        with phase("network"):
            net.ensure_bridge(settings)
        with phase("apt cache"):
            aptcache.ensure_running(settings)
        with phase("image") as note:
            note(f"{'built' if image.build(settings) else 'cached'} {image.path(settings)}")
        with phase("vendor") as note:
            vendor = vendor_build.ensure_built()
            vendor_serve.ensure_serving(settings, vendor)
            inventory.write_vendor_vars(settings, vendor_serve.vendor_vars(settings, vendor))
            note(f"{vendor.root} on {settings.vendor_url}")
        with phase("machines") as note:
            started = _start_machines(settings, names, vendor_build.key_text(vendor, "kernel"))
            note(f"started {', '.join(started)}" if started else "all running")
        with phase("ssh"):
            readiness.wait_ssh(settings, names, timeout=boot_timeout)
        inventory.write(settings, names)
        # Just booted: slurmd registers with slurmctld a few seconds after SSH answers, or once the fabric has
        # trained where it waits for the GPUs (labstate.settle_timeout).
        found = labstate.report(settings, names, settle=True)
    echo(f"lab machines up: {', '.join(f'{n}={settings.addr(n)}' for n in names)}; "
         f"inventory {settings.inventory_dir}/hosts.yml; total {time.monotonic() - start:.1f}s")
    for line in found:
        echo(line)
    return ExitCode.OK


def _phases(echo: Echo) -> Callable[[str], AbstractContextManager[Callable[[str], None]]]:
    @contextmanager
    def phase(title: str) -> Iterator[Callable[[str], None]]:
        notes: list[str] = []
        began = time.monotonic()
        yield notes.append
        echo(f"  {title:10} {time.monotonic() - began:6.1f}s  {'; '.join(notes)}".rstrip())

    return phase


def _start_machines(settings: Settings, names: list[str], kernel_key: str = "") -> list[str]:
    for extra in [n for n in known(settings) if n not in names and nspawn.running_pid(settings, n)]:
        nspawn.stop(settings, extra)
        net.remove_machine_netns(settings, extra)
    pubkey = keys.ensure_client_key(settings)
    fabric_cabling.write_fabric(settings, names)
    uppers = {}
    started = []
    for name in names:
        running = nspawn.running_pid(settings, name) is not None
        if running:
            uppers[name] = nspawn.upper(settings, name)
            continue
        net.ensure_machine_netns(settings, name)
        uppers[name] = nspawn.prepare_layer(settings, name, names, pubkey, kernel_key)
        if is_gpu_machine(name):
            hwinstall.install(uppers[name], name, settings.addr(name))
            state = uppers[name] / HW_STATE.lstrip("/")
            hw = hwinstall.set_fabric_training(state, name, settings.fabric_training_s)
            fabric_cabling.publish(settings.fabric_dir / "nodes", hw)
        elif name == "head":
            hwinstall.install_head(uppers[name])
        machine_args = (disks.nspawn_args(settings) if name == STORAGE_MACHINE
                        else nspawn.gpu_machine_args() if is_gpu_machine(name) else [])
        nspawn.start(settings, name, machine_args)
        started.append(name)
    keys.write_known_hosts(settings, uppers)
    inventory.write(settings, names)  # as soon as the machines exist; SSH answers a few seconds later
    return started


def down(echo: Echo = lambda _line: None, purge: bool = False, settings: Settings | None = None) -> ExitCode:
    """Stop every machine, then remove every namespace, the apt cache daemon, the bridge and the guard
    route. Machine layers stay (like disks of powered-off nodes) unless `purge`."""
    _preflight()
    settings = settings or Settings()
    start = time.monotonic()
    with _locked(settings):
        names = known(settings)
        for name in names:
            nspawn.stop(settings, name)
        stop_pids(nspawn.stray_pids(settings), grace=20)
        disks.detach(settings)
        for name in net.lab_netns(settings):
            net.remove_machine_netns(settings, name)
        aptcache.stop(settings)
        vendor_serve.stop(settings)
        net.remove_bridge(settings)
        if purge:
            for name in names:
                shutil.rmtree(settings.machine_dir(name))
    echo(f"lab machines down: stopped {len(names)} machine(s), removed namespaces, bridge and guard route "
         f"({time.monotonic() - start:.1f}s)")
    return ExitCode.OK


def status(echo: Echo = lambda _line: None, settings: Settings | None = None) -> ExitCode:
    """Exit 0 when everything the tier runs is running (every machine and the apt cache), else 1, as
    `opsctl lab status` does for the simulated cluster."""
    settings = settings or Settings()
    names = known(settings)
    if not names:
        echo("no lab machines: `opsctl lab machines up`")
        return ExitCode.FAILING
    pids = {name: nspawn.running_pid(settings, name) for name in names}
    for name, pid in pids.items():
        echo(f"{name:6} {settings.addr(name):12} {'running pid ' + str(pid) if pid else 'stopped'}")
    cache = aptcache.running_pid(settings)
    echo(f"{'apt':6} {settings.bridge_addr:12} {'running pid ' + str(cache) if cache else 'stopped'}")
    vendor = vendor_serve.running_pid(settings)
    echo(f"{'vendor':6} {settings.bridge_addr:12} {'running pid ' + str(vendor) if vendor else 'stopped'}")
    return ExitCode.OK if cache and vendor and all(pids.values()) else ExitCode.FAILING


def reset(echo: Echo = lambda _line: None, settings: Settings | None = None) -> ExitCode:
    """Back to clean machines: every fault cleared, every Slurm node out of service resumed (by whoever),
    opsctl's state and audit log on the head emptied. Says what it cleared."""
    _preflight()
    settings = settings or Settings()
    with _locked(settings):
        running = [n for n in known(settings) if nspawn.running_pid(settings, n)]
        if "head" not in running:
            raise LabError("the lab machines are not running; start them with `opsctl lab machines up`")
        for line in labstate.reset(settings, running):
            echo(line)
    return ExitCode.OK


def _ssh_admin(settings: Settings, machine: str, args: list[str]) -> str:
    if machine not in known(settings) or not is_gpu_machine(machine):
        gpus = [n for n in known(settings) if is_gpu_machine(n)]
        raise LabError(f"unknown GPU machine {machine!r}; lab GPU machines: {', '.join(gpus) or 'none'}")
    if nspawn.running_pid(settings, machine) is None:
        raise LabError(f"machine {machine} is not running: `opsctl lab machines up`")
    result = subprocess.run(keys.ssh_args(settings, machine) + ["/usr/local/sbin/opsctl-hw", *args],
                            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines()
        raise LabError(f"{machine}: {lines[-1] if lines else 'opsctl-hw failed'}")
    return result.stdout.strip()


def _targets(settings: Settings, machine: str) -> list[str]:
    """MACHINE, or every GPU machine for `all` (a shared service that fails: a storage outage)."""
    return [n for n in known(settings) if is_gpu_machine(n)] if machine == "all" else [machine]


def inject(machine: str, fault: str, gpu: int | None = None, hca: str | None = None,
           echo: Echo = lambda _line: None, settings: Settings | None = None) -> ExitCode:
    """MACHINE `fabric`: a fault of the InfiniBand fabric itself (uplink-down:<leaf>), in the fabric's state
    on this host (opsctl_lab.machines.fabric_cabling)."""
    if machine == fabric_cabling.FABRIC or parse_fault(fault)[0].target == "fabric":
        if machine != fabric_cabling.FABRIC or parse_fault(fault)[0].target != "fabric":
            raise LabError(f"the fabric's own faults (uplink-down:<leaf>) go on `{fabric_cabling.FABRIC}`, "
                           f"not {fault} on {machine}")
        echo(f"injected {fabric_cabling.inject(settings or Settings(), fault)} on the {fabric_cabling.FABRIC}")
        return ExitCode.OK
    NodeHardware(node=machine).inject(fault, gpu=gpu, hca=hca)  # bad input fails here, before any SSH
    if parse_fault(fault)[0].simulated_only:
        raise LabError(f"{fault} is a fault of the simulated lab: `opsctl lab inject`")
    args = ["inject", fault]
    if gpu is not None:
        args += ["--gpu", str(gpu)]
    if hca is not None:
        args += ["--hca", str(hca)]
    settings = settings or Settings()
    for name in _targets(settings, machine):
        echo(_ssh_admin(settings, name, args))
    return ExitCode.OK


def clear(machine: str, echo: Echo = lambda _line: None, settings: Settings | None = None) -> ExitCode:
    """MACHINE `all`: every GPU machine and the fabric; `fabric`: the fabric's own faults."""
    settings = settings or Settings()
    if machine in ("all", fabric_cabling.FABRIC):
        echo(f"{fabric_cabling.FABRIC}: cleared " + (", ".join(fabric_cabling.clear(settings)) or "no faults"))
        if machine == fabric_cabling.FABRIC:
            return ExitCode.OK
    for name in _targets(settings, machine):
        echo(_ssh_admin(settings, name, ["clear"]))
    return ExitCode.OK
