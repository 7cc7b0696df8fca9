"""The `opsctl` command line. Thin by design: parse arguments, call one function per command.

Every command turns an error into one line on stderr and its documented exit code (see
opsctl/errors.py and opsctl/exit.py). What a command talks to (config, Prometheus, Slurm)
is built in one place, opsctl.clients.Clients, carried in click's context object.
Commands of separately installed packages join through the entry point
group `opsctl.commands`: the lab (`opsctl lab ...`, package opsctl-lab in lab/) is one.
"""

from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import click

from opsctl import __version__
from opsctl.clients import Clients
from opsctl.errors import ConfigError
from opsctl.exit import one_line_errors

PLUGIN_GROUP = "opsctl.commands"
# Commands that a package outside the product provides, and what installs it.
OPTIONAL_COMMANDS = {"lab": "the lab is not installed: `make venv`, or `pip install -e . -e ./lab` (extra opsctl[lab])"}


class Commands(click.Group):
    """The built-in commands plus those registered by installed packages under PLUGIN_GROUP."""

    def _plugins(self) -> dict[str, EntryPoint]:
        return {ep.name: ep for ep in entry_points(group=PLUGIN_GROUP)}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._plugins()))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        plugin = self._plugins().get(cmd_name)
        if plugin is not None:
            loaded = plugin.load()
            return loaded if isinstance(loaded, click.Command) else None
        if cmd_name in OPTIONAL_COMMANDS:
            return _not_installed(cmd_name)
        return None


def _not_installed(name: str) -> click.Command:
    @click.command(name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
                   add_help_option=False, hidden=True)
    @one_line_errors
    def missing() -> None:
        raise ConfigError(f"opsctl {name}: {OPTIONAL_COMMANDS[name]}")

    return missing


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="opsctl")
@click.option("--debug", is_flag=True, help="Print the traceback of an unexpected error.")
@click.pass_context
def main(ctx, debug):
    """Provision and keep healthy NVIDIA H200 GPU clusters."""
    if not isinstance(ctx.obj, Clients):
        ctx.obj = Clients()
    ctx.obj.debug = debug


# ---- health, nodes, drain, resume, history -------------------------------------------------
def _http_url(ctx, param, value):
    if value is not None and not value.startswith(("http://", "https://")):
        raise click.BadParameter("must start with http:// or https://")
    return value


config_option = click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
                             help="Config file (default: $OPSCTL_CONFIG, then /etc/opsctl/config.yaml).")
# `opsctl ib check` and `opsctl node check` read the same sysfs tree and watch the same counters.
window_option = click.option("--window", type=click.FloatRange(min=0, max=600), default=None, metavar="SECONDS",
                             help="Watch the error counters this long (default: ib.window_seconds, 10; "
                                  "0: no window).")
sysfs_root_option = click.option("--sysfs-root", default=None, metavar="DIR",
                                 help="Read sysfs here (default: ib.sysfs_root, /sys).")


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
@click.option("--changes-only", is_flag=True,
              help="Print only the verdicts that changed since the last run of the same kind, each action and "
                   "refusal, and one summary line (the timer's journal).")
@config_option
@click.pass_obj
@one_line_errors
def health_cmd(clients, drain, dry_run, resume, as_json, watch, prometheus, all_nodes, scope, changes_only,
               config_path):
    """Judge every node by the health rules; with --drain/--resume, act on the verdicts.

    Exit codes: 0 no failing node, 1 failing nodes, 2 usage/config error, 3 Prometheus or Slurm
    unavailable or partial, or an unexpected error (nothing done), 4 safety stop (circuit breaker,
    budget, out-of-service limit, too many unknown nodes, lock held).
    """
    from opsctl.commands.health import health

    return health(clients.use(config_path, prometheus), drain, dry_run, resume, as_json, watch, all_nodes, scope,
                  changes_only)


@main.command("nodes")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@config_option
@click.pass_obj
@one_line_errors
def nodes_cmd(clients, as_json, config_path):
    """List Slurm nodes with their state and who owns their drain reason."""
    from opsctl.commands.nodes import nodes

    return nodes(clients.use(config_path), as_json)


@main.command("drain")
@click.argument("hostlist", metavar="NODES")
@click.option("--reason", required=True, help="Why; stored as `opsctl:manual <reason>`.")
@click.option("--json", "as_json", is_flag=True, help="Print what was done, refused and skipped as JSON.")
@config_option
@click.pass_obj
@one_line_errors
def drain_cmd(clients, hostlist, reason, as_json, config_path):
    """Drain NODES (a Slurm hostlist such as gpu[001-004]) by hand."""
    from opsctl.commands.nodes import drain

    return drain(clients.use(config_path), hostlist, reason, as_json)


@main.command("resume")
@click.argument("hostlist", metavar="NODES")
@click.option("--force", is_flag=True, help="Also resume nodes drained by someone else.")
@click.option("--json", "as_json", is_flag=True, help="Print what was done, refused and skipped as JSON.")
@config_option
@click.pass_obj
@one_line_errors
def resume_cmd(clients, hostlist, force, as_json, config_path):
    """Resume NODES by hand."""
    from opsctl.commands.nodes import resume

    return resume(clients.use(config_path), hostlist, force, as_json)


@main.command("remediate")
@click.option("--dry-run", is_flag=True, help="Show each node's next step on the ladder; change nothing.")
@click.option("--json", "as_json", is_flag=True, help='Print {"nodes": [...], "stop": ...}.')
@click.option("--watch", type=click.FloatRange(min=1), default=None, metavar="SECONDS",
              help="Run again every SECONDS until SIGTERM, printing the steps made.")
@config_option
@click.pass_obj
@one_line_errors
def remediate_cmd(clients, dry_run, as_json, watch, config_path):
    """Take each drained node one step up the ladder: reset, reboot, validate, resume or RMA."""
    from opsctl.commands.remediate import remediate_or_watch

    return remediate_or_watch(clients.use(config_path), dry_run, as_json, watch)


@main.command("hold")
@click.argument("hostlist", metavar="NODES")
@click.option("--reason", "why", default="", help="Why, for the audit log.")
@click.option("--release", is_flag=True, help="Hand the nodes back to the ladder.")
@config_option
@click.pass_obj
@one_line_errors
def hold_cmd(clients, hostlist, why, release, config_path):
    """Keep the remediation ladder off NODES (a person works on them), or --release them to it."""
    from opsctl.commands.remediate import hold

    return hold(clients.use(config_path), hostlist, why, release)


@main.command("history")
@click.argument("node_arg", metavar="[NODE]", required=False)
@click.option("--node", default=None, help="Only this node (the same as NODE).")
@click.option("--job", default=None, metavar="JOB", help="Only this Slurm job's records: `why` and requeues.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="Last N entries.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSONL records.")
@config_option
@click.pass_obj
@one_line_errors
def history_cmd(clients, node_arg, node, job, limit, as_json, config_path):
    """Show the audit log, or one node's events in time order: every drain, resume, reboot and refusal."""
    from opsctl.commands.history import history

    if node_arg and node and node_arg != node:
        raise click.UsageError(f"NODE {node_arg!r} and --node {node!r} differ: give one")
    if job is not None and not job.isdigit():
        raise click.UsageError(f"--job must be a Slurm job id, not {job!r}")
    return history(clients.use(config_path), node_arg or node, limit, as_json, job)


@main.group("ib")
def ib_group():
    """InfiniBand: the node-local precheck."""


@ib_group.command("check")
@click.option("--profile", "profile_name", type=click.Choice(["h200-ndr"]), default=None,
              help="Hardware profile (default: ib.profile of the config, h200-ndr).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--from", "from_path", type=click.Path(exists=True), default=None, metavar="PATH",
              help="Check a capture instead of this node: an ibstat or ibv_devinfo output, or a copied sysfs tree.")
@window_option
@sysfs_root_option
@config_option
@click.pass_obj
@one_line_errors
def ib_check_cmd(clients, profile_name, as_json, from_path, window, sysfs_root, config_path):
    """Check this node's HCAs against a hardware profile: count, link layer, state, rate, firmware,
    PCIe link, rising error counters and the GPUDirect RDMA module.

    Exit codes: 0 pass, 1 fail, 2 usage/config error, 3 the hardware or capture could not be read.
    """
    from opsctl.commands.ib_check import ib_check

    return ib_check(clients.use(config_path), profile_name, as_json, from_path, window, sysfs_root)


@ib_group.command("quarantine")
@click.option("--results", required=True, metavar="FILE",
              help="The nodes' `opsctl ib check --json` reports: a JSON object, node -> report ('-': stdin).")
@click.option("--json", "as_json", is_flag=True, help="Print the decisions as JSON.")
@click.option("--dry-run", is_flag=True, help="Show what would be drained and resumed; change nothing.")
@config_option
@click.pass_obj
@one_line_errors
def ib_quarantine_cmd(clients, results, as_json, dry_run, config_path):
    """Provisioning's InfiniBand precheck, on the head: drain the failing nodes (opsctl:ib-precheck), resume
    the passing ones it drained, and drain none when the fault is shared (every port INIT: the subnet manager).

    Exit codes: 0 all pass, 1 a node fails (quarantined), 2 usage/config error, 3 reports or Slurm unreadable,
    4 safety stop (the breaker: nothing drained; drain limits).
    """
    from opsctl.commands.ib_quarantine import quarantine

    return quarantine(clients.use(config_path), results, as_json, dry_run)


@ib_group.command("fabric-test")
@click.option("--inventory", default=None, type=click.Path(exists=True), metavar="INV",
              help="The Ansible inventory (hosts.yml or its directory) whose nodes to test (required to test).")
@click.option("--hosts", "hosts_pattern", default=None, metavar="PATTERN", help="Only hosts matching this glob.")
@click.option("--group", default=None, help="Inventory group to test (default: gpu_nodes when there is one).")
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON.")
@click.option("--drain", is_flag=True, help="Drain the culprits (opsctl:ib-fabric), within the safety limits.")
@click.option("--dry-run", is_flag=True, help="Show what --drain would do; change nothing.")
@click.option("--html", "html_path", default=None, metavar="FILE",
              help="Draw the rails x nodes grid, culprits marked, into FILE: one self-contained HTML page.")
@click.option("--svg", "svg_path", default=None, metavar="FILE", help="The same picture as SVG.")
@click.option("--png", "png_path", default=None, metavar="FILE", help="The same picture as PNG (needs cairosvg).")
@click.option("--history", "show_history", is_flag=True,
              help="Test nothing: show each node's HCA judged on the kept runs, culprits first.")
@config_option
@click.pass_obj
@one_line_errors
def ib_fabric_test_cmd(clients, inventory, hosts_pattern, group, as_json, drain, dry_run, config_path,
                       html_path=None, svg_path=None, png_path=None, show_history=False):
    """Run ib_write_bw between nodes over SSH, rail-aligned, in pairing rounds that isolate slow or dead
    HCAs; name them with their bandwidths, and with --drain drain their nodes.

    Exit codes: 0 all rails good, 1 culprits (the run's or the history's) or unresolved rails, 2 usage/config
    error, 3 a node could not be reached (nothing tested), 4 safety stop (too many nodes fail: the fabric is at
    fault; drain limits). With --history: 0 no culprit, 1 culprits, 2 the history unreadable.
    """
    from opsctl.commands.ib_fabric_test import fabric_test

    if show_history:
        from opsctl.commands.ib_fabric_test import history

        given = [name for name, value in (("--inventory", inventory), ("--hosts", hosts_pattern), ("--group", group),
                                          ("--drain", drain), ("--dry-run", dry_run), ("--html", html_path),
                                          ("--svg", svg_path), ("--png", png_path)) if value]
        if given:
            raise click.UsageError(f"--history tests nothing and shows the kept runs: drop {', '.join(given)}")
        return history(clients.use(config_path), as_json)
    if inventory is None:
        raise click.UsageError("Missing option '--inventory' (or --history, to show the kept runs)")
    return fabric_test(clients.use(config_path), inventory, hosts_pattern, group, as_json, drain, dry_run,
                       html=html_path, svg=svg_path, png=png_path)


@ib_group.command("topology")
@click.option("--input", "input_path", type=click.Path(exists=True), default=None, metavar="PATH",
              help="Saved ibnetdiscover outputs: a directory with <hca>.txt per rail, or one file (one fabric). "
                   "Default: run ib.ibnetdiscover -C <hca> -P 1 per rail of ib.rails here.")
@click.option("--output", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Write topology.conf here (atomically) and accept this fabric for --check.")
@click.option("--format", "fmt", type=click.Choice(["tree", "block", "both"]), default="tree", show_default=True,
              help="topology/tree (Slurm 22.05+) or topology/block (24.05+) lines; both: print both.")
@click.option("--check", is_flag=True, help="Compare with the accepted fabric (or --design); drain cross-cabled nodes.")
@click.option("--design", type=click.Path(exists=True), default=None, metavar="FILE",
              help="With --check: compare with this fabric record (JSON) or ibnetdiscover output instead.")
@click.option("--dry-run", is_flag=True, help="With --check: show what would be drained; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the fabric, topology.conf and the drift as JSON.")
@config_option
@click.pass_obj
@one_line_errors
def ib_topology_cmd(clients, input_path, output, fmt, check, design, dry_run, as_json, config_path):
    """Map each node's HCAs to their leaf switches and the leaves to spines, per rail, from ibnetdiscover; print or
    write topology.conf; with --check name each cabling change and drain the nodes cabled to another rail or
    leaf group (opsctl:ib-cabling).

    Exit codes: 0 read (and written), or no change; 1 a change found (--check); 2 usage/config error; 3
    ibnetdiscover, an input, Slurm or the output unreadable or unwritable (nothing done); 4 safety stop.
    """
    from opsctl.commands.ib_topology import topology

    return topology(clients.use(config_path), input_path, output, fmt, check, design, dry_run, as_json)

@main.group("hw")
def hw_group():
    """Hardware: the nodes that differ from their group's profile."""


@hw_group.command("quarantine")
@click.option("--results", required=True, metavar="FILE",
              help="What differs per node: a JSON object, node -> why (\"\" when it fits) ('-': stdin).")
@click.option("--json", "as_json", is_flag=True, help="Print the decisions as JSON.")
@click.option("--dry-run", is_flag=True, help="Show what would be drained and resumed; change nothing.")
@config_option
@click.pass_obj
@one_line_errors
def hw_quarantine_cmd(clients, results, as_json, dry_run, config_path):
    """Provisioning's hardware check, on the head: drain the nodes whose hardware differs from their group's
    profile (opsctl:hw-mismatch), resume the ones it drained that fit again, and drain none when too many differ.

    Exit codes: 0 all fit, 1 a node differs (drained), 2 usage/config error, 3 input or Slurm unreadable,
    4 safety stop (the breaker: nothing drained; drain limits).
    """
    from opsctl.commands.hw_quarantine import quarantine

    return quarantine(clients.use(config_path), results, as_json, dry_run)


@main.group("rollout")
def rollout_group():
    """Provisioning's rolling changes: a batch of nodes out of service, changed, checked, back."""


@rollout_group.command("drain")
@click.argument("hostlist", metavar="NODES")
@click.option("--change", required=True, help="What changes; stored as `opsctl:provision <change>`.")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=3600, show_default=True, metavar="SECONDS",
              help="How long the batch's jobs may run on; a node whose jobs outlast it is put back, unchanged.")
@click.option("--json", "as_json", is_flag=True, help="Print the batch as JSON.")
@config_option
@click.pass_obj
@one_line_errors
def rollout_drain_cmd(clients, hostlist, change, wait_s, as_json, config_path):
    """Take the nodes of a batch out of service and wait until their jobs end; never cancels a job.

    Exit codes: 0 every node is ready (no job runs there), 1 a node is skipped (back in service, unchanged),
    2 usage/config error (an unknown node), 3 Slurm unreadable.
    """
    from opsctl.commands.rollout import drain

    return drain(clients.use(config_path), hostlist, change, wait_s, as_json)


@rollout_group.command("reboot")
@click.argument("hostlist", metavar="NODES")
@click.option("--change", required=True, help="What changed; the node returns DOWN with `opsctl:provision <change>`.")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=1800, show_default=True, metavar="SECONDS",
              help="How long to wait for the nodes to register with Slurm again.")
@click.option("--json", "as_json", is_flag=True, help="Print the nodes back as JSON.")
@config_option
@click.pass_obj
@one_line_errors
def rollout_reboot_cmd(clients, hostlist, change, wait_s, as_json, config_path):
    """Reboot through Slurm the nodes of a batch that the rollout drained (scontrol reboot ASAP nextstate=DOWN),
    and wait until they registered again.

    Exit codes: 0 every node is back, 1 a node is refused (not drained by a rollout, or jobs run there) or not
    back in time (left DOWN), 2 usage/config error, 3 Slurm unreadable.
    """
    from opsctl.commands.rollout import reboot

    return reboot(clients.use(config_path), hostlist, change, wait_s, as_json)


@rollout_group.command("resume")
@click.argument("hostlist", metavar="NODES")
@click.option("--json", "as_json", is_flag=True, help="Print the nodes resumed as JSON.")
@config_option
@click.pass_obj
@one_line_errors
def rollout_resume_cmd(clients, hostlist, as_json, config_path):
    """Put back in service the nodes of a batch that passed their checks: only the rollout's own drains, and
    the nodes back from its reboot.

    Exit codes: 0 done, 2 usage/config error, 3 Slurm unreadable.
    """
    from opsctl.commands.rollout import resume

    return resume(clients.use(config_path), hostlist, as_json)


@main.group("node")
def node_group():
    """Checks that run on the node itself."""


@node_group.command("check")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--textfile", default=None, metavar="PATH",
              help="Write opsctl_node_check metrics here for node_exporter's textfile collector (*.prom).")
@click.option("--drain-self", "drain", is_flag=True,
              help="Drain this node when a check fails, resume it from its own drain when all pass "
                   "(Slurm's HealthCheckProgram).")
@click.option("--remediate-self", "remediate", is_flag=True,
              help="Take this node's step of the remediation ladder when its Slurm reason asks: reset the GPU, "
                   "check it, answer (docs/remediation.md).")
@click.option("--node", default=None, metavar="NAME", help="This node's Slurm name (default: the short host name).")
@window_option
@sysfs_root_option
@config_option
@click.pass_obj
@one_line_errors
def node_check_cmd(clients, as_json, textfile, drain, remediate, node, window, sysfs_root, config_path):
    """Run every node-local check: InfiniBand, and the storage mounts of the config's storage section.

    Exit codes: 0 all pass, 1 a check failed, 2 usage/config error, 3 the hardware could not be read.
    """
    from opsctl.commands.node_check import node_check

    return node_check(clients.use(config_path), as_json, textfile, drain, node, window, sysfs_root, remediate)


@node_group.command("validate")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--textfile", default=None, metavar="PATH",
              help="Write opsctl_node_validate metrics here for node_exporter's textfile collector (*.prom).")
@click.option("--record-pairs", default=None, metavar="pass|HCA[,HCA]",
              help="Run nothing: write what opsctl validate --preflight found on this node's rails "
                   "(beside --textfile).")
@config_option
@click.pass_obj
@one_line_errors
def node_validate_cmd(clients, as_json, textfile, record_pairs, config_path):
    """Run this node's active checks: dcgmi diag and an NCCL all-reduce over its GPUs against a floor
    (what `opsctl validate` runs as a Slurm job on an idle node).

    Exit codes: 0 all pass, 1 a test failed, 2 usage/config error, 3 a test could not run (not checked).
    """
    from opsctl.commands.node_validate import node_validate

    return node_validate(clients.use(config_path), as_json, textfile, record_pairs)


@main.command("validate")
@click.option("--idle", is_flag=True, help="Validate the idle GPU nodes, one exclusive low-priority job each.")
@click.option("--preflight", "wanted", type=click.IntRange(min=1), default=None, metavar="N",
              help="Reserve idle nodes, validate them (alone, then in pairs one rail at a time) and hand N good "
                   "ones over in a reservation.")
@click.option("--reservation", default=None, metavar="NAME",
              help="--preflight: the reservation the good nodes end in [opsctl-preflight-<time>].")
@click.option("--user", "users", multiple=True, metavar="USER",
              help="--preflight: who may use that reservation (repeat for more) [the caller].")
@click.option("--spares", type=click.IntRange(min=0), default=None, metavar="K",
              help="--preflight: nodes reserved beyond N, for the ones that fail [max(2, N/4)].")
@click.option("--nodes", "scope", default=None, metavar="HOSTLIST", help="Only these nodes (a Slurm hostlist).")
@click.option("--dry-run", is_flag=True, help="Show which nodes a sweep would validate; submit nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the sweep and the health run as JSON.")
@config_option
@click.pass_obj
@one_line_errors
def validate_cmd(clients, idle, wanted, reservation, users, spares, scope, dry_run, as_json, config_path):
    """Run active checks (dcgmi diag, an NCCL all-reduce) as Slurm jobs on idle nodes, then drain the
    failures through `opsctl health --drain` (docs/validate.md).

    Exit codes: 0 all pass (--preflight: N good nodes handed over), 1 a node failed or was not checked
    (--preflight: fewer than N good nodes), 2 usage/config error, 3 Slurm or Prometheus unreadable,
    4 safety stop.
    """
    from opsctl.commands.validate import PreflightRequest, validate

    if wanted is None and (reservation or users or spares is not None):
        raise click.UsageError("--reservation, --user and --spares go with --preflight N")
    request = PreflightRequest(wanted, reservation, users, spares) if wanted is not None else None
    return validate(clients.use(config_path), idle, request, scope, dry_run, as_json)


@main.command("why")
@click.argument("job_id", metavar="JOB", required=False)
@click.option("--spool", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="Record every job that the controller's EpilogSlurmctld left in DIR (one empty file per job "
                   "id), then remove it, and requeue each job that opted in without its culprit "
                   "(docs/recover.md): the opsctl-why service's way.")
@click.option("--json", "as_json", is_flag=True, help="Print the answer and every event as JSON.")
@click.option("--record", is_flag=True,
              help="Write the answer to the audit log, one record per node of the job (its history); only for "
                   "a job that failed (EpilogSlurmctld).")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=0, show_default=True, metavar="SECONDS",
              help="Wait up to this long for accounting to show the job ended and for its last scrapes.")
@config_option
@click.pass_obj
@one_line_errors
def why_cmd(clients, job_id, spool, as_json, record, wait_s, config_path):
    """Say which node most likely ended a failed job, and why: what opsctl knows about the job's nodes
    over its time (docs/why.md).

    A job that still runs gets the node that hangs or slows it instead (docs/job-health.md).

    Exit codes: 0 answered (a likely culprit, no evidence, or a running job's verdict), 2 usage/config error or
    --record of a job that has not ended, 3 Slurm's accounting or Prometheus unreadable.
    """
    from opsctl.commands.why import why

    return why(clients.use(config_path), job_id, spool, as_json, record, wait_s)


@main.command("suspects")
@click.option("--queue", is_flag=True, help="Queue the suspects for the next `opsctl validate --idle`.")
@click.option("--json", "as_json", is_flag=True, help="Print every node's score as JSON.")
@config_option
@click.pass_obj
@one_line_errors
def suspects_cmd(clients, queue, as_json, config_path):
    """List the nodes that keep turning up in failed jobs that no evidence explains (why.suspect_*);
    a suspect is validated, never drained, on its score (docs/why.md).

    Exit codes: 0 done (suspects or none), 2 usage/config error, 3 accounting or Prometheus unreadable.
    """
    from opsctl.commands.why import suspects

    return suspects(clients.use(config_path), queue, as_json)


@main.command("job-health")
@click.option("--queue", is_flag=True,
              help="Queue each node named hung or slow for `opsctl validate`, audit the verdicts and write their "
                   "metrics (the opsctl-job-health timer's way); never drains.")
@click.option("--json", "as_json", is_flag=True, help="Print every running multi-node job's verdict as JSON.")
@config_option
@click.pass_obj
@one_line_errors
def job_health_cmd(clients, queue, as_json, config_path):
    """Name the node that hangs or slows each running job of two nodes or more: its nodes' GPU, NVLink and
    InfiniBand signals against each other over job_health.window (docs/job-health.md).

    Exit codes: 0 answered (verdicts or none), 2 usage/config error, 3 Slurm (squeue) or Prometheus unreadable,
    or the audit log or state unwritable.
    """
    from opsctl.commands.job_health import job_health

    return job_health(clients.use(config_path), queue, as_json)


@main.group("rules")
def rules_group():
    """The health rule catalog."""


@rules_group.command("export")
@click.option("--format", "fmt", type=click.Choice(["prometheus", "grafana"]), default="prometheus",
              show_default=True, help="Prometheus alert rules (health and system), or the GPU health dashboard.")
@config_option
@click.pass_obj
@one_line_errors
def rules_export_cmd(clients, fmt, config_path):
    """Print the catalog as a Prometheus alert rules file or a Grafana dashboard."""
    from opsctl.commands.rules import rules_export

    return rules_export(clients.use(config_path), fmt)


@rules_group.command("list")
@config_option
@click.pass_obj
@one_line_errors
def rules_list_cmd(clients, config_path):
    """List the rules in effect (shipped catalog plus config)."""
    from opsctl.commands.rules import rules_list

    return rules_list(clients.use(config_path))


@main.group("dashboards")
def dashboards_group():
    """Grafana dashboards with the config's thresholds (needs the extra opsctl[dashboards])."""


@dashboards_group.command("export")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Directory to write one JSON file per dashboard to.")
@config_option
@one_line_errors
def dashboards_export_cmd(out_dir, config_path):
    """Write every dashboard, ready for Grafana's file provisioning."""
    from opsctl.commands.dashboards import export_dashboards

    return export_dashboards(config_path, out_dir)
