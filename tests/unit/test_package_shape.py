"""The shape of opsctl/ as README's "Layout" gives it, computed from the source (tests/import_graph.py): the
packages import each other one way only, and the commands reach the features, never the edges."""

from pathlib import Path

import opsctl
from tests.import_graph import find_cycle, package_graph

PACKAGE = Path(opsctl.__file__).resolve().parent
# What commands/ may import: one package per feature (named as users call it), the actor, the config, the
# errors and exit codes, the clients that the CLI builds (passed through to a feature, never called), and
# its own rendering modules. Not prom, slurm, gpu, storage or fileio: a command that needs them calls a feature.
FEATURES = {"health", "ladder", "rollout", "why", "validate", "ib", "fabrictest", "hw", "nodecheck", "dashboards",
            "metrics"}
COMMANDS_MAY_IMPORT = FEATURES | {"actor", "config", "errors", "clients", "commands"}
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
