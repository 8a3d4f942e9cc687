"""The package's import graph: no import circle, and the GPU job entry point stays free of pandas.

The graph is read from the source with ``ast`` (every ``import`` statement, also those inside functions: a lazy
import that closes a circle is still a circle of concerns), independent of the modules' import-time behaviour;
``sys.modules`` after a real import checks the entry point.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "operator_profiler"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imported(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Package modules ``module`` imports anywhere in its source (the innermost existing module of each name)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            targets += [f"{base}.{alias.name}" for alias in node.names] or [base]
    out = set()
    for target in targets:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != module:
            out.add(target)
    return out


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_the_package_has_no_import_circle():
    modules = _modules()
    graph = {m: _imported(m, p, modules) for m, p in modules.items()}
    assert "operator_profiler.errors" in graph and graph["operator_profiler.errors"] == set()
    assert _circles(graph) == []


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_gpu_job_entry_point_imports_no_pandas_and_no_analysis_code():
    probe = ("import sys, operator_profiler.gpu_jobs, operator_profiler.rule_runner, operator_profiler.capture; "
             "print(' '.join(sorted(m for m in sys.modules if m == 'pandas' or m.startswith('operator_profiler.'))))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert "pandas" not in loaded
    assert not [m for m in loaded if m.startswith(("operator_profiler.attribution", "operator_profiler.timeline"))]
