"""`opsctl ib topology`: read the fabric, write topology.conf, check it for cabling drift. The command renders
the result.

- Reading: `<ib.ibnetdiscover> -C <hca> -P 1` once per rail of ib.rails, on the host it runs on (a head or
  login host with an HCA on every rail, as NVIDIA's topograph runs it), or saved outputs (`--input`: a
  directory with `<hca>.txt` per rail, or one file for a one-fabric design). A rail whose ibnetdiscover
  fails or whose file is missing stops the run before anything is written (exit 3).
- `--output FILE`: topology.conf (opsctl/topology/render.py), replaced atomically (opsctl/fileio.py), and
  the fabric it was written from recorded in opsctl's state through the ledger (the accepted fabric).
- `--check`: the drift (opsctl/topology/drift.py) against the accepted fabric, or `--design FILE` (a
  fabric record as `--json` prints it under `fabric`, or ibnetdiscover output: a file or a directory as
  for `--input`). Each node whose HCA is cross-cabled to another rail or left its leaf group is drained
  `opsctl:ib-cabling <hca> <what>` through `drain_findings`: the actor, the one judgement of what opsctl
  may touch (a node in service with no reason, or opsctl's own, opsctl/slurm/reach.py) and every limit of
  `opsctl health --drain`. More than ib.max_fail_fraction of the nodes drifting at once is a recabling
  or an outdated record, not the nodes: nothing is drained (exit 4).
"""

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opsctl.actor.ledger import Ledger
from opsctl.actor.result import ActionResult
from opsctl.actor.state import State
from opsctl.clients import Clients
from opsctl.config.schema import Config
from opsctl.errors import ConfigError, ExitCode, SourceUnavailable, worst
from opsctl.fileio import write_atomic
from opsctl.gpu.tools import Run, run_tool
from opsctl.health.evaluate import Check
from opsctl.health.findings import drain_findings, failing_check, shared_cause
from opsctl.topology.drift import Drift, find_drift
from opsctl.topology.fabric import RECORD_SCHEMA, Fabric, build_fabric
from opsctl.topology.ibnetdiscover import Subnet, process_ibnetdiscover_output
from opsctl.topology.render import render

RULE = "ib-cabling"
# A sweep of a large fabric takes seconds to a minute; a rail that outlasts this is unreadable.
IBNETDISCOVER_TIMEOUT_S = 300


@dataclass
class Topology:
    fabric: Fabric
    source: str  # where the fabric was read, in words
    conf: dict[str, str]  # plugin (tree, block) -> topology.conf
    not_on_fabric: list[str]  # Slurm GPU nodes with no HCA on the fabric: Slurm cannot place jobs on them
    drift: list[Drift]  # with --check the changes found; otherwise what the live fabric shows of itself
    baseline: str = ""  # what --check compared with, in words ("" without --check)
    output: str = ""  # the file written
    warnings: list[str] = field(default_factory=list)
    action: ActionResult = field(default_factory=ActionResult)
    exit_code: ExitCode = ExitCode.OK


def read_subnets(config: Config, input_path: str | None, run: Run) -> tuple[list[Subnet], str]:
    """The subnets of every rail (live, or saved under `input_path`) and where they came from."""
    rails = config.ib.rails
    if input_path is None:
        return [_discover(config.ib.ibnetdiscover, hca, run) for hca in rails], \
            f"{config.ib.ibnetdiscover} of {len(rails)} rail(s)"
    path = Path(input_path)
    if path.is_dir():
        missing = [hca for hca in rails if not (path / f"{hca}.txt").is_file()]
        if missing:
            raise SourceUnavailable(f"{path}: no {missing[0]}.txt (one ibnetdiscover output per rail of ib.rails)")
        return [_read(path / f"{hca}.txt") for hca in rails], f"{path}/<rail>.txt of {len(rails)} rail(s)"
    return [_read(path)], str(path)


def _discover(program: str, hca: str, run: Run) -> Subnet:
    argv = [program, "-C", hca, "-P", "1"]
    done = run_tool(run, argv, IBNETDISCOVER_TIMEOUT_S)
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise SourceUnavailable(f"{' '.join(argv)}: exit {done.returncode}" + (f": {why[-1][:200]}" if why else ""))
    return process_ibnetdiscover_output(done.stdout, f"{program} -C {hca}")


def _read(path: Path) -> Subnet:
    try:
        return process_ibnetdiscover_output(path.read_text(), str(path))
    except OSError as err:
        raise SourceUnavailable(f"cannot read {path}: {err.strerror}") from None


def load_design(path: str, config: Config, slurm_nodes: set[str]) -> dict[str, Any]:
    """A --design FILE: a fabric record (JSON), or ibnetdiscover output as for --input."""
    text = "" if Path(path).is_dir() else _text(Path(path))
    if text.lstrip().startswith("{"):
        try:
            record = json.loads(text)
        except ValueError as err:
            raise ConfigError(f"--design {path}: not JSON: {err}") from None
        if not isinstance(record, dict) or record.get("schema") != RECORD_SCHEMA \
                or not isinstance(record.get("hcas"), dict) or not isinstance(record.get("switches"), dict):
            raise ConfigError(f"--design {path}: not a fabric record (`opsctl ib topology --json`'s `fabric`)")
        return record
    subnets, _ = read_subnets(config, path, run=subprocess.run)
    return build_fabric(subnets, slurm_nodes).record()


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as err:
        raise ConfigError(f"--design {path}: {err.strerror}") from None


def topology(clients: Clients, input_path: str | None, output: str | None, plugins: list[str], check: bool,
             design: str | None, dry_run: bool, run: Run = subprocess.run, now: float | None = None) -> Topology:
    """Read the fabric and render topology.conf for each of `plugins`; write the first to `output` and accept
    the fabric, or with `check` compare and drain (`dry_run`: say what would be drained)."""
    now = time.time() if now is None else now
    config = clients.config(acting=bool(output) or (check and not dry_run))
    slurm = clients.slurm()
    slurm_nodes = slurm.nodes()
    subnets, source = read_subnets(config, input_path, run)
    fabric = build_fabric(subnets, set(slurm_nodes))
    if not fabric.home:
        raise SourceUnavailable(f"{source}: no HCA of a Slurm node on a switch (an HCA's node description must be "
                                "`<Slurm node> <hca>`)")
    result = Topology(fabric, source, {p: render(fabric, p, source) for p in plugins},
                      sorted(n for n, s in slurm_nodes.items() if s.has_gpus and n not in fabric.home), [])
    result.warnings += [f"{n}: no HCA on the fabric; Slurm places no job on it by this topology"
                        for n in result.not_on_fabric]
    if check:
        _check(config, clients, result, design, set(slurm_nodes), dry_run, now)
        return result
    result.drift = find_drift(fabric, None, config.ib.rails)
    if output:
        _write(config, result, Path(output), plugins[0], now)
    return result


def _write(config: Config, result: Topology, output: Path, plugin: str, now: float) -> None:
    try:
        write_atomic(output, result.conf[plugin], mode=0o644)
    except OSError as err:
        raise SourceUnavailable(f"cannot write {output}: {err.strerror}") from None
    record = {**result.fabric.record(), "accepted": now, "source": result.source, "output": str(output)}
    Ledger(config).save_accepted_fabric(record)
    result.output = str(output)


def _check(config: Config, clients: Clients, result: Topology, design: str | None, slurm_nodes: set[str],
           dry_run: bool, now: float) -> None:
    if design is not None:
        base: dict[str, Any] | None = load_design(design, config, slurm_nodes)
        result.baseline = f"the design {design}"
    else:
        base = State(config.state_dir).fabric.load()
        accepted = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(base["accepted"])) \
            if base and isinstance(base.get("accepted"), (int, float)) else "?"
        result.baseline = f"the fabric accepted {accepted}" if base else ""
        if base is None:
            result.warnings.append("no accepted fabric (opsctl ib topology --output FILE accepts one): only what "
                                   "the live fabric shows of itself was checked")
    result.drift = find_drift(result.fabric, base, config.ib.rails)
    found: dict[str, list[Check]] = {}
    for drift in result.drift:
        if drift.drains:
            found.setdefault(drift.node, []).append(failing_check(RULE, drift.hca, drift.evidence))
    stop = shared_cause(len(found), len(result.fabric.home), config.ib.max_fail_fraction, "the cabling check",
                        cause="a recabling or an outdated accepted fabric")
    if found:
        drain_findings(config, clients.slurm(), found, stop, dry_run, now=now, result=result.action)
    result.exit_code = worst(ExitCode.FAILING if result.drift else ExitCode.OK, result.action.exit_code)
