"""The lab's packages import each other in one direction only: the import graph of opsctl_lab, computed
from the source (every import, those inside functions too), at the level of its top-level modules and
subpackages, has no cycle; and the lab never imports the product's command layer (opsctl.commands,
opsctl.cli), only what a command is built from."""

from pathlib import Path

import opsctl_lab
from tests.import_graph import find_cycle, importers_of, package_graph

LAB = Path(opsctl_lab.__file__).resolve().parent
COMMAND_LAYER = ("opsctl.commands", "opsctl.cli")


def test_the_lab_import_graph_has_no_cycle():
    cycle = find_cycle(package_graph(LAB, "opsctl_lab"))
    assert cycle is None, f"import cycle in opsctl_lab: {' -> '.join(cycle or [])}"


def test_the_lab_does_not_import_the_products_command_layer():
    assert importers_of(LAB, "opsctl_lab", COMMAND_LAYER) == []


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path):
    """The shape the lab had: machines -> vendor_repos at the top, and back inside a function."""
    root = write(tmp_path / "pkg", {
        "__init__.py": "",
        "errors.py": "",
        "machines/__init__.py": "from pkg.machines.lifecycle import up\n",
        "machines/lifecycle.py": "from pkg import errors\nfrom pkg.vendor_repos import build\n",
        "vendor_repos/__init__.py": "",
        "vendor_repos/build.py": "def tool():\n    from pkg.machines import hwinstall  # noqa\n",
    })
    graph = package_graph(root, "pkg")
    assert graph == {"errors": set(), "machines": {"errors", "vendor_repos"}, "vendor_repos": {"machines"}}
    assert find_cycle(graph) in (["machines", "vendor_repos", "machines"], ["vendor_repos", "machines", "vendor_repos"])


def test_a_longer_cycle_and_relative_imports_are_found_and_an_acyclic_graph_passes(tmp_path):
    root = write(tmp_path / "pkg", {
        "__init__.py": "",
        "a.py": "import pkg.b\n",
        "b/__init__.py": "from .c import x\n",
        "b/c.py": "from ..d import y\n",
        "d.py": "from pkg import a\n",
    })
    assert find_cycle(package_graph(root, "pkg")) == ["a", "b", "d", "a"]
    (root / "d.py").write_text("import os\n")
    assert find_cycle(package_graph(root, "pkg")) is None


def test_an_import_of_the_command_layer_is_named(tmp_path):
    root = write(tmp_path / "pkg", {
        "__init__.py": "",
        "cli.py": "from opsctl.commands.exit import one_line_errors\nfrom opsctl.errors import ExitCode\n",
        "run.py": "def main():\n    import opsctl.cli\n",
    })
    assert importers_of(root, "pkg", COMMAND_LAYER) == ["pkg.cli imports opsctl.commands.exit",
                                                        "pkg.run imports opsctl.cli"]
