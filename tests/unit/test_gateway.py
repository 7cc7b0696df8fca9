"""One gateway: outside opsctl/actor/ no module changes a node in Slurm or writes opsctl's state, computed from
the source. The Slurm backends (opsctl/slurm/) implement the changes; the actor alone calls them. The state
directory and the audit log are written by actor/ alone: no other module imports their writers, calls a
store's save, or writes a file, except the modules below that write elsewhere, each for a reason."""

import ast
from pathlib import Path

import opsctl

PACKAGE = Path(opsctl.__file__).resolve().parent
SLURM_CHANGES = {"drain", "resume", "set_reason", "reboot"}
# The writers of the state directory and the audit log, and the stores: imported by actor/ alone.
STATE_WRITERS = {("opsctl.fileio", "write_atomic"), ("opsctl.actor.audit", "AuditLog"),
                 ("opsctl.actor.lock", "secure_dir"), ("opsctl.actor.lock", "RunLock"),
                 ("opsctl.actor.state", "JsonFile")}
STORE_WRITES = {"save", "record"}
# Calls that create, replace or remove a file (os.replace, not str.replace).
FILE_WRITES = {"write_atomic", "write_text", "write_bytes", "mkdir", "makedirs", "unlink", "rmtree"}
OS_FILE_WRITES = {"replace", "rename", "remove", "mkdir", "makedirs", "unlink"}
# Modules outside actor/ that write files, none of them under the state directory.
WRITES_ELSEWHERE = {
    "fileio.py": "the atomic writer itself",
    "metrics/recorder.py": "opsctl's own metrics, in node_exporter's textfile directory",
    "nodecheck/report.py": "the node check's results, in node_exporter's textfile directory",
    "fabrictest/textfile.py": "the fabric test's figures, in node_exporter's textfile directory",
    "fabrictest/picture.py": "the fabric test's picture into the --html, --svg and --png files a person names",
    "storage/probe_child.py": "the probe file on each checked mount",
    "recover/spool.py": "removes the entries of the controller's spool directory that it explains",
    "commands/dashboards.py": "the dashboards' JSON into the --out directory a person names",
    "topology/run.py": "topology.conf at the --output path a person (or the slurm role) names",
}


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text())


def outside(where: str, *inside: str) -> bool:
    return not where.startswith(("actor/", *inside))


def slurm_changes(tree: ast.AST) -> list[int]:
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr in SLURM_CHANGES]


def writer_imports(tree: ast.AST) -> list[str]:
    return [f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
            for a in n.names if (n.module, a.name) in STATE_WRITERS]


def dotted(node: ast.AST) -> list[str]:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return parts[::-1]


def store_writes(tree: ast.AST) -> list[int]:
    """`<...>.state.<store>.save(...)` and the like: a store written around the ledger."""
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr in STORE_WRITES and "state" in dotted(n.func.value)[:-1]]


def file_writes(tree: ast.AST) -> list[int]:
    found = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call):
            continue
        name = n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id if isinstance(n.func, ast.Name) else ""
        if name in FILE_WRITES or (dotted(n.func)[:1] == ["os"] and name in OS_FILE_WRITES):
            found.append(n.lineno)
        elif name == "open" and any(isinstance(a, ast.Attribute) and a.attr in ("O_CREAT", "O_WRONLY", "O_RDWR")
                                    for a in ast.walk(n)):
            found.append(n.lineno)
        elif name == "open" and any(isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value[:1] in "wax"
                                    for a in n.args[1:2] + [k.value for k in n.keywords if k.arg == "mode"]):
            found.append(n.lineno)
    return found


def test_only_the_actor_calls_the_slurm_clients_changes():
    calls = {where: lines for where, tree in modules() if outside(where, "slurm/") and (lines := slurm_changes(tree))}
    assert calls == {}
    assert slurm_changes(ast.parse((PACKAGE / "actor" / "act.py").read_text())), "the actor makes the changes"


def test_only_the_actor_imports_the_writers_of_the_state_directory_and_the_audit_log():
    found = {where: names for where, tree in modules() if outside(where) and where != "fileio.py"
             and (names := writer_imports(tree)) and where not in WRITES_ELSEWHERE}
    assert found == {}


def test_no_store_is_written_outside_the_actor():
    assert {where: lines for where, tree in modules() if outside(where) and (lines := store_writes(tree))} == {}


def test_no_module_outside_the_actor_writes_a_file_except_those_that_write_elsewhere():
    writers = {where for where, tree in modules() if outside(where) and file_writes(tree)}
    assert writers <= set(WRITES_ELSEWHERE), writers - set(WRITES_ELSEWHERE)


def test_the_rules_catch_what_they_forbid():
    planted = ast.parse(
        "from opsctl.actor.audit import AuditLog\n"
        "AuditLog(config.audit_log).write('drain')\n"
        "slurm.drain(['gpu001'], 'x')\n"
        "actor.state.holds.save({})\n"
        "(path / 'budget.json').write_text('{}')\n"
        "fd = os.open(path, os.O_WRONLY | os.O_CREAT)\n"
        "open(path, 'a')\n"
        "os.replace(tmp, path)\n"
        "text.replace('a', 'b')\n")
    assert slurm_changes(planted) == [3]
    assert writer_imports(planted) == ["opsctl.actor.audit.AuditLog"]
    assert store_writes(planted) == [4]
    assert file_writes(planted) == [5, 6, 7, 8]


def test_each_module_that_writes_elsewhere_exists_and_writes():
    trees = dict(modules())
    assert {where for where in WRITES_ELSEWHERE if where not in trees or not file_writes(trees[where])} == set()
