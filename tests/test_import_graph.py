"""The package's import graph: no import circle; the GPU job entry point stays free of pandas; ``opprof --help``,
the no-op job and the rule scripts' import phase import no heavy package.

The graph is read from the source with ``ast`` (every ``import`` statement, also those inside functions: a lazy
import that closes a circle is still a circle of concerns), independent of the modules' import-time behaviour;
``sys.modules`` after a real import checks the entry point.
"""

from __future__ import annotations

import ast
import json
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


#: Packages that take 0.1-1 s each to import (more on a loaded machine): a command that needs none of them must
#: not pay for them at start-up (``opprof --help`` took 2.0 s, 1.6 s of it imports, before they were lazy).
HEAVY = ("torch", "pandas", "pyarrow", "numpy", "jsonschema", "yaml", "orjson", "sympy", "scipy")
ROOT = PACKAGE.parents[1]


def _heavy_imported(args: list[str], **kwargs) -> list[str]:
    """The ``HEAVY`` packages ``python -X importtime ARGS`` imported, run as a user runs it (a subprocess)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True, cwd=ROOT,
                          **kwargs)
    names = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert names, proc.stderr[-2000:]  # importtime did report
    return [name for name in HEAVY if name in names]


def test_opprof_help_and_an_argument_error_import_no_heavy_package():
    assert _heavy_imported(["-m", "operator_profiler.cli", "--help"]) == []
    # an argument error (argparse exits 2) is also answered before any stage code is imported
    assert _heavy_imported(["-m", "operator_profiler.cli", "attribute", "--out", "x.parquet"]) == []


def test_the_noop_job_imports_no_heavy_package(tmp_path):
    """A CPU run's select_clocks job (nothing to lock: it writes the target only), started the way the workflow's
    shell rule starts it."""
    params = json.dumps({"clocks": "{}", "device": "cpu"})
    files = json.dumps({"wildcards": {"workload": "w"}, "input": {}, "output": {"target": str(tmp_path / "t.json")}})
    args = ["-m", "operator_profiler.gpu_jobs", "select_clocks", params, files, str(tmp_path / "job.log")]
    assert _heavy_imported(args) == []
    assert json.loads((tmp_path / "t.json").read_text())["policy"] == "none"
    assert (tmp_path / "job.log").read_text().startswith("job phases: start-up ")


def test_the_rule_scripts_import_phase_imports_no_heavy_package():
    """Every ``scripts/*.py``'s module-level imports (the job's import phase): the stage imports what it needs
    when it runs (operator_profiler.stages), so a job pays only for the packages of its own work."""
    scripts = sorted((ROOT / "scripts").glob("*.py"))
    assert len(scripts) >= 10
    for script in scripts:
        tree = ast.parse(script.read_text(encoding="utf-8"))
        imports = "\n".join(ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)))
        assert "operator_profiler" in imports, script.name
        assert _heavy_imported(["-c", imports]) == [], script.name


def test_a_stage_still_imports_what_its_work_needs():
    """The lazy imports are inside the stages: calling one brings in pandas (the check above is not vacuous)."""
    probe = ("import sys\nfrom operator_profiler import stages\nassert 'pandas' not in sys.modules\n"
             "try:\n    stages.read_timeline('/nonexistent-timeline')\nexcept Exception as exc:\n"
             "    print(type(exc).__name__)\nprint('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["InputError", "True"]


#: The modules that may import the optimizer: the entry points that run its jobs and commands. Everything else
#: (capture/, transforms/, the analysis) lies below it; the model changes the harness applies live in transforms/.
OPTIMIZER_USERS = {"operator_profiler.stages", "operator_profiler.gpu_jobs", "operator_profiler.cli"}


def test_nothing_below_the_optimizer_imports_it():
    modules = _modules()
    importers = {m for m, p in modules.items() if not m.startswith("operator_profiler.optimize")
                 and any(t.startswith("operator_profiler.optimize") for t in _imported(m, p, modules))}
    assert importers <= OPTIMIZER_USERS, sorted(importers - OPTIMIZER_USERS)
    transforms = {m: _imported(m, p, modules) for m, p in modules.items() if m.startswith("operator_profiler.transforms")}
    assert set(transforms) >= {"operator_profiler.transforms.changes", "operator_profiler.transforms.vocabulary"}
    upward = {m: sorted(t for t in ts if t.startswith(("operator_profiler.capture", "operator_profiler.optimize")))
              for m, ts in transforms.items()}
    assert not any(upward.values()), upward
