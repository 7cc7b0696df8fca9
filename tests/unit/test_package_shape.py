"""The shape of opsctl/ as README's "Layout" gives it, computed from the source (tests/import_graph.py): the
packages import each other one way only, and the commands reach the features, never the edges."""

import ast
from pathlib import Path

import opsctl
from tests.import_graph import find_cycle, package_graph

PACKAGE = Path(opsctl.__file__).resolve().parent
# What commands/ may import: one package per feature (named as users call it), the actor, the config, the
# errors and how a command ends (exit.py), the clients that the CLI builds (passed through to a feature, never
# called), and its own rendering modules. Not prom, slurm, gpu, storage or fileio: a command that needs them
# calls a feature.
FEATURES = {"health", "ladder", "rollout", "why", "jobhealth", "validate", "ib", "fabrictest", "hw", "nodecheck",
            "dashboards", "metrics", "topology", "recover"}
COMMANDS_MAY_IMPORT = FEATURES | {"actor", "config", "errors", "exit", "clients", "commands"}
# What the Clients build: a command passes the Clients to its feature and never calls these itself.
CLIENT_EDGES = {"slurm", "prom", "prom_range", "fresh_prom", "jobs", "accounting", "requeues"}
# opsctl's state and audit log, which a command never opens.
STATE_NAMES = {"State", "Ledger", "AuditLog", "RunLock", "read_nofollow", "write_atomic"}
# A feature's result is rendered in commands/: no feature imports the command layer or click's CLI.
NEVER_FROM_FEATURES = {"commands", "cli"}


def test_opsctl_has_no_import_cycle():
    cycle = find_cycle(package_graph(PACKAGE, "opsctl"))
    assert cycle is None, f"import cycle in opsctl: {' -> '.join(cycle or [])}"


def test_commands_import_only_features_the_actor_config_and_rendering():
    graph = package_graph(PACKAGE, "opsctl")
    assert graph["commands"] - COMMANDS_MAY_IMPORT == set()


def test_no_feature_imports_the_command_layer():
    graph = package_graph(PACKAGE, "opsctl")
    assert {name: sorted(targets & NEVER_FROM_FEATURES) for name, targets in graph.items()
            if name not in ("commands", "cli", "__main__") and targets & NEVER_FROM_FEATURES} == {}


def test_every_feature_package_exists():
    assert {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()} >= FEATURES | {"actor"}


def test_the_rule_catches_a_command_that_reads_slurm(tmp_path):
    """The same computation over a planted tree: a command importing the Slurm edge is named."""
    root = tmp_path / "pkg"
    for name, text in {"__init__.py": "", "slurm/__init__.py": "", "health/__init__.py": "",
                       "commands/__init__.py": "", "commands/nodes.py": "from pkg.slurm import Slurm\n",
                       "commands/health.py": "from pkg.health import run\n"}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    assert package_graph(root, "pkg")["commands"] - {"health"} == {"slurm"}


def edges_and_state_used(tree: ast.AST) -> list[str]:
    found = [f"{n.lineno} .{n.func.attr}()" for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr in CLIENT_EDGES]
    return found + [f"{n.lineno} {n.id}" for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in STATE_NAMES]


def test_commands_reach_no_slurm_prometheus_or_state_themselves():
    used = {path.name: found for path in sorted((PACKAGE / "commands").glob("*.py"))
            if (found := edges_and_state_used(ast.parse(path.read_text())))}
    assert used == {}


def test_the_commands_rule_catches_a_direct_slurm_read():
    planted = ast.parse("def nodes(clients):\n    return clients.slurm().nodes(), Ledger(config)\n")
    assert edges_and_state_used(planted) == ["2 .slurm()", "2 Ledger"]
