"""`opsctl lab ...`: the simulated cluster and the lab machines. Registered with opsctl through the
entry point group `opsctl.commands` (lab/pyproject.toml), so the product package carries none of it."""

import click

from opsctl.errors import ExitCode
from opsctl.exit import one_line_errors


@click.group()
def lab() -> None:
    """The simulated cluster: real Slurm and Prometheus, emulated H200 nodes."""


@lab.command("up")
@click.option("--nodes", type=click.IntRange(1, 1000), default=64, show_default=True, help="Emulated H200 nodes.")
@click.option("--scrape-interval", type=click.IntRange(1, 300), default=5, show_default=True,
              help="Prometheus scrape interval, seconds.")
@one_line_errors
def lab_up(nodes: int, scrape_interval: int) -> ExitCode:
    """Start (or keep) the simulated cluster and wait until it is ready."""
    from opsctl_lab.cluster import up

    return up(nodes=nodes, scrape_interval=scrape_interval)


@lab.command("down")
@one_line_errors
def lab_down() -> ExitCode:
    """Stop every process the lab started."""
    from opsctl_lab.cluster import down

    return down()


@lab.command("status")
@one_line_errors
def lab_status() -> ExitCode:
    """Show what the lab runs."""
    from opsctl_lab.cluster import status

    return status()


@lab.command("reset")
@one_line_errors
def lab_reset() -> ExitCode:
    """Clear every fault, return every node to service, empty opsctl's lab state and audit log."""
    from opsctl_lab.cluster import reset

    return reset()


@lab.command("env")
@one_line_errors
def lab_env() -> ExitCode:
    """Print shell exports: eval "$(opsctl lab env)"."""
    from opsctl_lab.cluster import env

    return env()


@lab.command("inject")
@click.argument("node")
@click.argument("fault")
@click.option("--gpu", type=click.IntRange(0, 7), default=None, help="GPU index (default 0).")
@click.option("--hca", default=None, help="HCA rail 0-7, or a device name such as mlx5_bond_0.")
@one_line_errors
def lab_inject(node: str, fault: str, gpu: int | None, hca: str | None) -> ExitCode:
    """Inject FAULT into NODE's emulated hardware (see `opsctl lab faults`); NODE `all`: every node; NODE `fabric`:
    the InfiniBand fabric's own faults (uplink-down:<leaf>)."""
    from opsctl_lab.cluster import inject

    return inject(node, fault, gpu=gpu, hca=hca)


@lab.command("clear")
@click.argument("node")
@one_line_errors
def lab_clear(node: str) -> ExitCode:
    """Clear every fault on NODE (NODE `all`: on every node and the fabric; `fabric`: the fabric's own)."""
    from opsctl_lab.cluster import clear

    return clear(node)


@lab.command("faults")
@one_line_errors
def lab_faults() -> ExitCode:
    """List the faults that `inject` takes."""
    from opsctl_lab.hardware import describe_faults

    click.echo(describe_faults())
    return ExitCode.OK


@lab.group("machines")
def lab_machines() -> None:
    """Real Debian machines (systemd-nspawn) with emulated H200 hardware, for provisioning."""


@lab_machines.command("up")
@click.option("--count", type=int, default=3, show_default=True,
              help="GPU machines gpu1..gpuN, 1-32 (plus the head machine).")
@click.option("--boot-timeout", type=click.IntRange(1, 3600), default=90, show_default=True,
              help="Seconds to wait for every machine to boot and take SSH logins.")
@one_line_errors
def lab_machines_up(count: int, boot_timeout: int) -> ExitCode:
    """Start (or keep) the machines and write inventory/lab/; prints the time of each phase."""
    from opsctl_lab.machines.lifecycle import up

    return up(count=count, echo=click.echo, boot_timeout=boot_timeout)


@lab_machines.command("down")
@click.option("--purge", is_flag=True, help="Also delete the machines' own layers (their installed state).")
@one_line_errors
def lab_machines_down(purge: bool) -> ExitCode:
    """Stop every machine; remove the lab's namespaces, bridge, guard route and apt cache daemon."""
    from opsctl_lab.machines.lifecycle import down

    return down(echo=click.echo, purge=purge)


@lab_machines.command("status")
@one_line_errors
def lab_machines_status() -> ExitCode:
    """Show the machines and whether they run."""
    from opsctl_lab.machines.lifecycle import status

    return status(echo=click.echo)


@lab_machines.command("reset")
@one_line_errors
def lab_machines_reset() -> ExitCode:
    """Clear every fault, resume every drained or down node, empty opsctl's state and audit log on the head."""
    from opsctl_lab.machines.lifecycle import reset

    return reset(echo=click.echo)


@lab_machines.command("inject")
@click.argument("machine")
@click.argument("fault")
@click.option("--gpu", type=int, default=None, help="GPU index 0-7 (default 0).")
@click.option("--hca", default=None, help="HCA rail 0-7, or a device name such as mlx5_bond_0.")
@one_line_errors
def lab_machines_inject(machine: str, fault: str, gpu: int | None, hca: str | None) -> ExitCode:
    """Inject FAULT into MACHINE's emulated hardware (`opsctl lab faults` lists them); MACHINE `all`: every
    GPU machine at once; MACHINE `fabric`: the InfiniBand fabric's own faults (uplink-down:<leaf>)."""
    from opsctl_lab.machines.lifecycle import inject

    return inject(machine, fault, gpu=gpu, hca=hca, echo=click.echo)


@lab_machines.command("clear")
@click.argument("machine")
@one_line_errors
def lab_machines_clear(machine: str) -> ExitCode:
    """Clear every fault on MACHINE (MACHINE `all`: on every GPU machine and the fabric; `fabric`: its own)."""
    from opsctl_lab.machines.lifecycle import clear

    return clear(machine, echo=click.echo)
