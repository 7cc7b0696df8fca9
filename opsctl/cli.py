"""The `opsctl` command line. Thin by design: parse arguments, call one function per command.

Every command turns an OpsctlError into one line on stderr and its documented exit code
(see opsctl/errors.py).
"""

import functools
import sys

import click

from opsctl import __version__
from opsctl.errors import ExitCode, OpsctlError


def one_line_errors(func):
    """Run a command body; an OpsctlError becomes one stderr line and its exit code."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            code = func(*args, **kwargs)
        except OpsctlError as err:
            click.echo(f"opsctl: error: {err}", err=True)
            sys.exit(int(err.exit_code))
        sys.exit(int(code or ExitCode.OK))

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="opsctl")
def main():
    """Provision and keep healthy NVIDIA H200 GPU clusters."""


# ---- health, nodes, drain, resume, history -------------------------------------------------
def _http_url(ctx, param, value):
    if value is not None and not value.startswith(("http://", "https://")):
        raise click.BadParameter("must start with http:// or https://")
    return value


config_option = click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
                             help="Config file (default: $OPSCTL_CONFIG, then /etc/opsctl/config.yaml).")


@main.command("health")
@click.option("--drain", is_flag=True, help="Drain failing nodes (within the safety limits).")
@click.option("--dry-run", is_flag=True, help="Show what --drain/--resume would do; change nothing.")
@click.option("--resume", is_flag=True, help="Resume nodes opsctl drained whose rule is ok again.")
@click.option("--json", "as_json", is_flag=True, help='Print {"nodes": [...], "summary": {...}}.')
@click.option("--watch", type=click.FloatRange(min=1), default=None, metavar="SECONDS",
              help="Run again every SECONDS until SIGTERM.")
@click.option("--prometheus", callback=_http_url, default=None, metavar="URL", help="Override prometheus.url.")
@click.option("--all", "all_nodes", is_flag=True, help="List ok nodes in the table too.")
@click.option("--nodes", "scope", default=None, metavar="HOSTLIST", help="Judge and act on these nodes only.")
@config_option
@one_line_errors
def health_cmd(drain, dry_run, resume, as_json, watch, prometheus, all_nodes, scope, config_path):
    """Judge every node by the health rules; with --drain/--resume, act on the verdicts.

    Exit codes: 0 no failing node, 1 failing nodes, 2 usage/config error, 3 Prometheus or Slurm
    unavailable (nothing done), 4 safety stop (circuit breaker, budget, lock held).
    """
    from opsctl.health.commands import health

    return health(config_path, drain, dry_run, resume, as_json, watch, prometheus, all_nodes, scope)


@main.command("nodes")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@config_option
@one_line_errors
def nodes_cmd(as_json, config_path):
    """List Slurm nodes with their state and who owns their drain reason."""
    from opsctl.health.commands import nodes

    return nodes(config_path, as_json)


@main.command("drain")
@click.argument("hostlist", metavar="NODES")
@click.option("--reason", required=True, help="Why; stored as `opsctl:manual <reason>`.")
@config_option
@one_line_errors
def drain_cmd(hostlist, reason, config_path):
    """Drain NODES (a Slurm hostlist such as gpu[001-004]) by hand."""
    from opsctl.health.commands import drain

    return drain(config_path, hostlist, reason)


@main.command("resume")
@click.argument("hostlist", metavar="NODES")
@click.option("--force", is_flag=True, help="Also resume nodes drained by someone else.")
@config_option
@one_line_errors
def resume_cmd(hostlist, force, config_path):
    """Resume NODES by hand."""
    from opsctl.health.commands import resume

    return resume(config_path, hostlist, force)


@main.command("history")
@click.option("--node", default=None, help="Only this node.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="Last N entries.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSONL records.")
@config_option
@one_line_errors
def history_cmd(node, limit, as_json, config_path):
    """Show the audit log: every drain, resume and refusal."""
    from opsctl.health.commands import history

    return history(config_path, node, limit, as_json)


@main.group("rules")
def rules_group():
    """The health rule catalog."""


@rules_group.command("export")
@click.option("--format", "fmt", type=click.Choice(["prometheus", "grafana"]), default="prometheus",
              show_default=True, help="Prometheus alert rules, or a Grafana dashboard with one panel per rule.")
@config_option
@one_line_errors
def rules_export_cmd(fmt, config_path):
    """Print the catalog as a Prometheus alert rules file or a Grafana dashboard."""
    from opsctl.health.commands import rules_export

    return rules_export(config_path, fmt)


@rules_group.command("list")
@config_option
@one_line_errors
def rules_list_cmd(config_path):
    """List the rules in effect (shipped catalog plus config)."""
    from opsctl.health.commands import rules_list

    return rules_list(config_path)
# ---- end health ----------------------------------------------------------------------------


# ---- lab: the simulated cluster on this machine --------------------------------------------
@main.group()
def lab():
    """The simulated cluster: real Slurm and Prometheus, emulated H200 nodes."""


@lab.command("up")
@click.option("--nodes", type=click.IntRange(1, 1000), default=64, show_default=True, help="Emulated H200 nodes.")
@click.option("--scrape-interval", type=click.IntRange(1, 300), default=5, show_default=True,
              help="Prometheus scrape interval, seconds.")
@one_line_errors
def lab_up(nodes, scrape_interval):
    """Start (or keep) the simulated cluster and wait until it is ready."""
    from opsctl.lab.cluster import up

    return up(nodes=nodes, scrape_interval=scrape_interval)


@lab.command("down")
@one_line_errors
def lab_down():
    """Stop every process the lab started."""
    from opsctl.lab.cluster import down

    return down()


@lab.command("status")
@one_line_errors
def lab_status():
    """Show what the lab runs."""
    from opsctl.lab.cluster import status

    return status()


@lab.command("env")
@one_line_errors
def lab_env():
    """Print shell exports: eval "$(opsctl lab env)"."""
    from opsctl.lab.cluster import env

    return env()


@lab.command("inject")
@click.argument("node")
@click.argument("fault")
@click.option("--gpu", type=click.IntRange(0, 7), default=None, help="GPU index (default 0).")
@click.option("--hca", default=None, help="HCA rail 0-7, or a device name such as mlx5_bond_0.")
@one_line_errors
def lab_inject(node, fault, gpu, hca):
    """Inject FAULT into NODE's emulated hardware (see `opsctl lab faults`)."""
    from opsctl.lab.cluster import inject

    return inject(node, fault, gpu=gpu, hca=hca)


@lab.command("clear")
@click.argument("node")
@one_line_errors
def lab_clear(node):
    """Clear every fault on NODE."""
    from opsctl.lab.cluster import clear

    return clear(node)


@lab.command("faults")
@one_line_errors
def lab_faults():
    """List the faults that `inject` takes."""
    from opsctl.lab.hardware import describe_faults

    click.echo(describe_faults())
    return ExitCode.OK


# (section: lab machines)
@lab.group("machines")
def lab_machines():
    """Real Debian machines (systemd-nspawn) with emulated H200 hardware, for provisioning."""


@lab_machines.command("up")
@click.option("--count", type=int, default=3, show_default=True,
              help="GPU machines gpu1..gpuN, 1-32 (plus the head machine).")
@one_line_errors
def lab_machines_up(count):
    """Start (or keep) the machines and write inventory/lab/; prints the time of each phase."""
    from opsctl.lab.machines import up

    return up(count=count, echo=click.echo)


@lab_machines.command("down")
@click.option("--purge", is_flag=True, help="Also delete the machines' own layers (their installed state).")
@one_line_errors
def lab_machines_down(purge):
    """Stop every machine; remove the lab's namespaces, bridge, guard route and apt cache daemon."""
    from opsctl.lab.machines import down

    return down(echo=click.echo, purge=purge)


@lab_machines.command("status")
@one_line_errors
def lab_machines_status():
    """Show the machines and whether they run."""
    from opsctl.lab.machines import status

    return status(echo=click.echo)


@lab_machines.command("inject")
@click.argument("machine")
@click.argument("fault")
@click.option("--gpu", type=int, default=None, help="GPU index 0-7 (default 0).")
@click.option("--hca", default=None, help="HCA rail 0-7, or a device name such as mlx5_bond_0.")
@one_line_errors
def lab_machines_inject(machine, fault, gpu, hca):
    """Inject FAULT into MACHINE's emulated hardware (`opsctl lab faults` lists them)."""
    from opsctl.lab.machines import inject

    return inject(machine, fault, gpu=gpu, hca=hca, echo=click.echo)


@lab_machines.command("clear")
@click.argument("machine")
@one_line_errors
def lab_machines_clear(machine):
    """Clear every fault on MACHINE."""
    from opsctl.lab.machines import clear

    return clear(machine, echo=click.echo)


# ---- end lab -------------------------------------------------------------------------------
