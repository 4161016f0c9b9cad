"""Every ``from sequoia_opt... import ...`` in the benchmark scripts resolves: the scripts import most of the
package inside ``main`` (after their arguments are parsed), so a module moved or a name renamed in the package
broke them only when someone next ran one for an hour (``benchmarks/omp_wait.py`` still imported
``sequoia_opt.profiling.device`` after ``cpu_name`` moved to ``sequoia_opt.device``)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))
OPTIONAL = ("gguf", "llama_cpp", "vllm", "sglang", "tensorrt_llm", "triton")  # extras a default install lacks


def package_imports(path: Path) -> list[tuple[int, str, str]]:
    """(line, module, name) for every ``from sequoia_opt[.x] import name`` in ``path``, at any depth, but those in
    an ``except ImportError`` fallback (a script that also measures earlier checkouts, ``loop_overhead.py``: the
    API before the one loop; the ``try`` body, today's API, must resolve)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    fallback = {id(n) for h in ast.walk(tree) if isinstance(h, ast.ExceptHandler) for stmt in h.body
                for n in ast.walk(stmt)}
    out = []
    for node in ast.walk(tree):
        if id(node) in fallback:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "sequoia_opt":
            out += [(node.lineno, node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, alias.name, "") for alias in node.names if alias.name.split(".")[0] == "sequoia_opt"]
    return out


def test_the_benchmarks_import_the_package_at_all():
    assert len(BENCHMARKS) >= 10 and sum(bool(package_imports(p)) for p in BENCHMARKS) >= 10


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.name)
def test_every_package_import_of_a_benchmark_resolves(path):
    missing = []
    for line, module, name in package_imports(path):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name and err.name.split(".")[0] in OPTIONAL:
                continue
            missing.append(f"{path.name}:{line}: no module {module}")
            continue
        if name and name != "*" and not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ModuleNotFoundError:
                missing.append(f"{path.name}:{line}: {module} has no {name}")
    assert missing == []
