"""The import graph of a package, computed from its source with `ast`: every `import` and `from ... import`,
those inside functions too, at the level of the package's top-level modules and subpackages (each one node).
The lab's test uses it; it is kept free of the lab so that one for `opsctl/` can use it as well."""

import ast
from pathlib import Path


def imported_modules(path: Path, module: str) -> set[str]:
    """The dotted names that the source file of `module` imports; `from a import b` names `a.b` as well as `a`,
    since `b` may be a module. A relative import is resolved against `module`'s package."""
    names: set[str] = set()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            origin = ".".join([*base, *([node.module] if node.module else [])])
            names.add(origin)
            names.update(f"{origin}.{alias.name}" for alias in node.names)
    return names


def _modules(root: Path, top: str) -> list[tuple[Path, str]]:
    """Each source file under `root` (package `top`) with its module name (`top.machines.lifecycle`)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out.append((path, ".".join((top, *(parts[:-1] if parts[-1] == "__init__" else parts)))))
    return out


def package_graph(root: Path, top: str) -> dict[str, set[str]]:
    """`root` is the directory of package `top`. A node per top-level module and subpackage (`cli`, `machines`);
    an edge A -> B when a module in A imports a module in B (A != B). `top`'s own `__init__` is left out: it
    only names the package."""
    graph: dict[str, set[str]] = {}
    for path, module in _modules(root, top):
        if module == top:
            continue
        source = module.split(".")[1]
        targets = graph.setdefault(source, set())
        for name in imported_modules(path, module):
            parts = name.split(".")
            if parts[0] == top and len(parts) > 1 and parts[1] != source:
                targets.add(parts[1])
    # `from top import x` where x is a name of top/__init__.py, not a module, is no edge.
    known = set(graph)
    return {node: {t for t in targets if t in known} for node, targets in graph.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle as its nodes in order, the first repeated at the end (['a', 'b', 'a']); None when acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def importers_of(root: Path, top: str, forbidden: tuple[str, ...]) -> list[str]:
    """`module imports name` for each module of package `top` that imports one of `forbidden` or a module below
    it (`opsctl.commands` covers `opsctl.commands.exit`)."""
    found = []
    for path, module in _modules(root, top):
        names = {n for n in imported_modules(path, module) if any(n == f or n.startswith(f + ".") for f in forbidden)}
        # `from a.b import c` names a.b and a.b.c: say a.b only.
        found += [f"{module} imports {n}" for n in sorted(names) if n.rpartition(".")[0] not in names]
    return found
