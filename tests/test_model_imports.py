"""Imports inside ``sequoia_opt.model`` flow one way: the graph of intra-package imports, read from the source
with ``ast`` (module level and inside functions, relative and absolute), has no cycle. A cycle there once hid
behind function-level imports (``loaders`` <-> ``hf`` / ``gguf_loader``)."""

from __future__ import annotations

import ast
from pathlib import Path

import sequoia_opt.model

PACKAGE = "sequoia_opt.model"
ROOT = Path(sequoia_opt.model.__file__).parent


def _module_name(path: Path, package: str) -> str:
    return package if path.name == "__init__.py" else f"{package}.{path.stem}"


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports, over every ``*.py`` directly in ``root``. Every
    ``import`` / ``from ... import`` node counts, wherever it sits (module body, function, ``try``).
    ``from . import x`` counts as importing the submodule ``x`` when ``root/x.py`` exists. The implicit import
    of a package's ``__init__`` by its submodules is not an edge (it would make every package a cycle)."""
    modules = {_module_name(p, package): p for p in sorted(root.glob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        # the package a relative import resolves against: the module's parent (the package itself for __init__)
        here = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                    target = f"{base}.{node.module}" if node.module else base
                else:
                    target = node.module or ""
                targets = [target] + [f"{target}.{alias.name}" for alias in node.names]
            for t in targets:
                if t in modules and t != name and t != package:
                    edges.add(t)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle as a list of modules (first == last), or None when the graph is acyclic (depth-first search)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_find_cycle_sees_a_cycle_and_its_absence():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_import_graph_reads_relative_and_function_level_imports(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n    return g()\n")
    (pkg / "b.py").write_text("from . import a\nimport pkg.c\n")
    (pkg / "c.py").write_text("from ..other import x\n")
    graph = import_graph(pkg, "pkg")
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a", "pkg.c"}, "pkg.c": set()}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]


def test_model_package_imports_are_acyclic():
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"
    # the graph was read, not empty: the dispatch imports both formats, and they import the shared builder
    assert {f"{PACKAGE}.hf", f"{PACKAGE}.gguf_loader"} <= graph[f"{PACKAGE}.loaders"]
    assert f"{PACKAGE}.build" in graph[f"{PACKAGE}.hf"] & graph[f"{PACKAGE}.gguf_loader"]
