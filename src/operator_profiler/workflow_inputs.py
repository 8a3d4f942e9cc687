"""The library files each workflow rule runs, derived from the package's import graph: the rules' ``lib``
inputs (workflow/common.smk), so an edit of any of them re-runs the rule (DESIGN.md, "What re-runs when").

A rule's entry is ``scripts/<rule>.py``, or for a GPU rule ``python -m operator_profiler.gpu_jobs <rule>``:
gpu_jobs.py less the other rules' dispatch functions (its ``RULES`` table). Its inputs are every package
``.py`` file the entry can import, module-level and function-level imports alike, followed to the end, and
every package data file (``ncu/metrics.yaml``) named in a function the entry can reach by calls (per file,
stages.py would tie the metric catalog to every CPU rule). Reads source files with :mod:`ast` only (never
imports the package: no pandas or torch when the DAG is built).

:func:`module_sources` derives a custom factory's (or loss_fn's) inputs the same way: its module's import
closure over the user's own files (the captures' ``model`` input, workflow/common.smk ``custom_model_source``).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = __name__.rpartition(".")[0]
#: The GPU rules' entry (``python -m operator_profiler.gpu_jobs RULE``) and its rule -> function table.
GPU_ENTRY, GPU_TABLE = f"{PACKAGE}.gpu_jobs", "RULES"
BODY = "<body>"  # the statements a module runs when imported (everything but its functions and classes)


@dataclass
class _Unit:
    """A module's body, or one of its top-level functions or classes."""

    imports: set[str] = field(default_factory=set)  # package modules it imports (dotted)
    bindings: dict[str, tuple] = field(default_factory=dict)  # names its imports bind
    refs: set[tuple[str, str | None]] = field(default_factory=set)  # names it uses: (name, attribute or None)
    data: set[str] = field(default_factory=set)  # package data files it names (relative to the package)


@dataclass
class _Module:
    name: str
    path: Path
    units: dict[str, _Unit]


class _Package:
    """The parsed ``.py`` files and data files of one package folder."""

    def __init__(self, folder: Path):
        self.folder = folder
        files = sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        self.data_files = {p.relative_to(folder).as_posix() for p in files if p.suffix not in (".py", ".pyc")}
        self.paths = {self.dotted(p): p for p in files if p.suffix == ".py"}
        self.modules = {name: self._parse(name, path) for name, path in self.paths.items()}

    def dotted(self, path: Path) -> str:
        parts = [PACKAGE, *path.relative_to(self.folder).with_suffix("").parts]
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    def _parse(self, name: str, path: Path, is_package: bool | None = None) -> _Module:
        if is_package is None:
            is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        # the folder a data file named in this module is relative to (besides the package root)
        here = path.parent.relative_to(self.folder).as_posix() if path.is_relative_to(self.folder) else None
        scan = _Scan(self, name, is_package, here)
        units = {BODY: _Unit()}
        for stmt in tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                units[stmt.name] = scan.unit([stmt])
                # decorators, defaults, base classes and class-level statements run at import
                scan.collect(_import_time_parts(stmt), units[BODY])
            else:
                scan.collect([stmt], units[BODY])
        return _Module(name, path, units)

    def entry(self, script: Path) -> _Module:
        return self._parse("__main__", script, is_package=False)


def _import_time_parts(node) -> list:
    parts = [*node.decorator_list]
    if isinstance(node, ast.ClassDef):
        parts += [*node.bases, *node.keywords]
        parts += [s for s in node.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    else:
        parts += [d for d in (*node.args.defaults, *node.args.kw_defaults) if d is not None]
    return parts


# Fields never evaluated (annotations) or holding no names (expression contexts).
_NEVER_RUN = frozenset(("annotation", "returns", "ctx", "type_comment"))


def _is_docstring(stmt) -> bool:
    return type(stmt) is ast.Expr and type(stmt.value) is ast.Constant and type(stmt.value.value) is str


class _Scan:
    """Collects one unit's imports, names used and data files named (annotations are skipped: never run)."""

    def __init__(self, package: _Package, module: str, is_package: bool, here: str | None):
        self.package, self.here = package, here
        self.base = module.split(".") if is_package else module.split(".")[:-1]

    def unit(self, nodes) -> _Unit:
        unit = _Unit()
        self.collect(nodes, unit)
        return unit

    def collect(self, nodes, unit: _Unit) -> None:
        stack = list(nodes)
        while stack:
            node = stack.pop()
            kind = type(node)
            if kind is ast.Name:
                if type(node.ctx) is ast.Load:
                    unit.refs.add((node.id, None))
                continue
            if kind is ast.Attribute and type(node.value) is ast.Name:
                unit.refs.add((node.value.id, node.attr))
                continue
            if kind is ast.Constant:
                if type(node.value) is str:
                    unit.data.update(self._data_files(node.value))
                continue
            if kind is ast.Import:
                self._import_names(node, unit)
                continue
            if kind is ast.ImportFrom:
                self._import_from(node, unit)
                continue
            for name in node._fields:
                if name in _NEVER_RUN:
                    continue
                value = getattr(node, name, None)
                if type(value) is list:
                    if name == "body" and value and _is_docstring(value[0]):
                        value = value[1:]
                    stack.extend(v for v in value if isinstance(v, ast.AST))
                elif isinstance(value, ast.AST):
                    stack.append(value)

    def _absolute(self, module: str | None, level: int) -> str:
        if not level:
            return module or ""
        base = self.base[: len(self.base) - (level - 1)]
        return ".".join([*base, *([module] if module else [])])

    def _import(self, dotted: str, unit: _Unit) -> None:
        """Importing ``a.b.c`` runs ``a``, ``a.b`` and ``a.b.c``: each that is a package module."""
        parts = dotted.split(".")
        unit.imports.update(".".join(parts[:i]) for i in range(1, len(parts) + 1)
                            if ".".join(parts[:i]) in self.package.paths)

    def _import_names(self, node: ast.Import, unit: _Unit) -> None:
        for alias in node.names:
            self._import(alias.name, unit)
            if alias.asname:
                unit.bindings[alias.asname] = ("module", alias.name)
            else:
                top = alias.name.split(".")[0]
                unit.bindings[top] = ("module", top)

    def _import_from(self, node: ast.ImportFrom, unit: _Unit) -> None:
        source = self._absolute(node.module, node.level)
        self._import(source, unit)
        for alias in node.names:
            if alias.name == "*":  # every name of the module: all of it
                unit.bindings[f"*{source}"] = ("module", source)
                unit.refs.add((f"*{source}", None))
                continue
            submodule = f"{source}.{alias.name}"
            if submodule in self.package.paths:
                self._import(submodule, unit)
                unit.bindings[alias.asname or alias.name] = ("module", submodule)
            else:
                unit.bindings[alias.asname or alias.name] = ("from", source, alias.name)

    def _data_files(self, text: str) -> set[str]:
        """Package data files ``text`` names: relative to the package root or to the module's folder."""
        candidates = {text}
        if self.here not in (None, "."):
            candidates.add(f"{self.here}/{text}")
        return candidates & self.package.data_files


class _Closure:
    """The files reachable from one entry module (``blocked``: units of it never entered)."""

    def __init__(self, package: _Package, entry: _Module, blocked: set[str]):
        self.package, self.entry, self.blocked = package, entry, blocked

    def module(self, name: str) -> _Module:
        return self.entry if name == self.entry.name else self.package.modules[name]

    def files(self) -> list[Path]:
        """Every package .py file an entry's unit imports, then every unit of those, to the end."""
        seen: set[str] = set()
        todo = [i for u, unit in self.entry.units.items() if u not in self.blocked for i in unit.imports]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            todo += [i for unit in self.package.modules[name].units.values() for i in unit.imports]
        if self.entry.name in self.package.modules:
            seen.add(self.entry.name)
        return [self.package.paths[name] for name in seen]

    def data_files(self) -> list[Path]:
        """The data files named by the units reachable by calls (names used) and imports from the entry."""
        seen: set[tuple[str, str]] = set()
        todo = [(self.entry.name, u) for u in self.entry.units if u not in self.blocked]
        data: set[str] = set()
        while todo:
            key = todo.pop()
            if key in seen or (key[0] == self.entry.name and key[1] in self.blocked):
                continue
            seen.add(key)
            module, unit = self.module(key[0]), self.module(key[0]).units[key[1]]
            data |= unit.data
            todo.append((module.name, BODY))
            todo += [(name, BODY) for name in unit.imports]
            for name, attr in unit.refs:
                todo += self._targets(module, unit, name, attr)
        return [self.package.folder / p for p in data]

    def _targets(self, module: _Module, unit: _Unit, name: str, attr: str | None) -> list[tuple[str, str]]:
        binding = unit.bindings.get(name) or module.units[BODY].bindings.get(name)
        if binding is None:
            return [(module.name, name)] if name in module.units else []
        if binding[0] == "module":
            if binding[1] not in self.package.modules:
                return []
            return self._member(binding[1], attr) if attr else self._all(binding[1])
        return self._member(binding[1], binding[2])

    def _all(self, name: str) -> list[tuple[str, str]]:
        return [(name, u) for u in self.package.modules[name].units]

    def _member(self, name: str, member: str, depth: int = 0) -> list[tuple[str, str]]:
        """What ``name.member`` runs: a function or class, a name it re-exports, or its body (a variable)."""
        module = self.package.modules.get(name)
        if module is None or depth > 20:
            return []
        if member in module.units:
            return [(name, member)]
        if f"{name}.{member}" in self.package.modules:
            return self._all(f"{name}.{member}")
        binding = module.units[BODY].bindings.get(member)
        if binding is not None and binding[0] == "from":
            return [(name, BODY), *self._member(binding[1], binding[2], depth + 1)]
        if binding is not None and binding[1] in self.package.modules:
            return [(name, BODY), *self._all(binding[1])]
        return [(name, BODY)]


def _gpu_rules(package: _Package) -> dict[str, str]:
    """``{rule: dispatch function}`` of gpu_jobs.py's ``RULES`` table (read from its source)."""
    path = package.paths[GPU_ENTRY]
    for stmt in ast.parse(path.read_text(), str(path)).body:
        if (isinstance(stmt, ast.Assign) and [getattr(t, "id", None) for t in stmt.targets] == [GPU_TABLE]
                and isinstance(stmt.value, ast.Dict)):
            return {k.value: v.id for k, v in zip(stmt.value.keys, stmt.value.values)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Name)}
    raise ValueError(f"{path}: no {GPU_TABLE} = {{rule: function}} table found")


def _derive(package_dir: Path, scripts_dir: Path) -> dict[str, list[str]]:
    """``{rule: its files relative to package_dir}`` for every script and every gpu_jobs rule."""
    package = _Package(package_dir)
    closures = {script.stem: _Closure(package, package.entry(script), set())
                for script in sorted(scripts_dir.glob("*.py"))}
    dispatch = _gpu_rules(package)
    for rule, function in dispatch.items():
        closures[rule] = _Closure(package, package.modules[GPU_ENTRY], set(dispatch.values()) - {function})
    return {rule: sorted(p.relative_to(package_dir).as_posix() for p in {*c.files(), *c.data_files()})
            for rule, c in closures.items()}


def _sources(package_dir: Path, scripts_dir: Path) -> list[Path]:
    """Every file the derivation reads (this module too: its logic decides the results)."""
    return [Path(__file__), *(p for folder in (package_dir, scripts_dir) for p in sorted(folder.rglob("*"))
                              if p.is_file() and "__pycache__" not in p.parts)]


def _fingerprint(sources: list[Path]) -> str:
    """A digest of the sources' names and contents: equal digests, equal results."""
    digest = hashlib.sha256()
    for path in sources:
        content = path.read_bytes()
        digest.update(f"{path.as_posix()}\0{len(content)}\0".encode() + content)
    return digest.hexdigest()


@functools.cache
def _all_rules(package_dir: Path, scripts_dir: Path, stamp: tuple) -> dict[str, list[str]]:
    """The derivation, once per process while the sources' ``stamp`` (names, sizes, mtimes) holds, and on
    disk once per content of the sources: parsing the package takes ~0.3 s, a noticeable part of a DAG
    build (each cluster job builds one)."""
    key = _fingerprint([p for p, _, _ in stamp])
    cache = package_dir / "__pycache__" / "workflow_inputs.json"
    try:
        cached = json.loads(cache.read_text())
        if cached.get("key") == key:
            return cached["rules"]
    except (OSError, ValueError, AttributeError):
        pass
    rules = _derive(package_dir, scripts_dir)
    try:  # a read-only installation has no cache: the derivation runs each time
        cache.parent.mkdir(exist_ok=True)
        partial = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps({"key": key, "rules": rules}))
        os.replace(partial, cache)
    except OSError:
        pass
    return rules


def rule_inputs(rule: str, package_dir: Path, scripts_dir: Path) -> list[str]:
    """The package files (absolute paths, sorted) that ``rule``'s entry can run: its ``lib`` inputs.

    ``package_dir``: the package's source folder (``src/operator_profiler``); ``scripts_dir``: the workflow's
    ``scripts/``. Derived once per process, and cached on disk (``__pycache__/workflow_inputs.json`` in
    ``package_dir``) by a digest of the sources. Raises ValueError for a rule with no entry (neither
    ``scripts/<rule>.py`` nor a gpu_jobs rule), SyntaxError for a package file that does not parse.
    """
    package_dir, scripts_dir = Path(package_dir).resolve(), Path(scripts_dir).resolve()
    stamp = tuple((p, p.stat().st_mtime_ns, p.stat().st_size) for p in _sources(package_dir, scripts_dir))
    rules = _all_rules(package_dir, scripts_dir, stamp)
    if rule not in rules:
        raise ValueError(f"rule {rule!r} has no entry: no {scripts_dir / rule}.py and not in {GPU_ENTRY}.{GPU_TABLE} "
                         f"(known: {', '.join(sorted(rules))})")
    return [str(package_dir / p) for p in rules[rule]]


# ------------------------------------------------------------------------------------- a custom model's sources

#: Calls that import a module by a name computed at run time, which reading the source cannot follow.
DYNAMIC_IMPORTS = frozenset(("import_module", "__import__", "spec_from_file_location", "run_path", "run_module",
                             "exec", "execfile", "load_source", "load_module"))


@functools.cache
def _stdlib_roots() -> tuple[Path, ...]:
    import sysconfig

    paths = sysconfig.get_paths()
    return tuple(Path(paths[k]).resolve() for k in ("stdlib", "platstdlib") if paths.get(k))


def _not_users_code(path: Path) -> bool:
    """Whether ``path`` is the standard library or an installed package (site-/dist-packages)."""
    if any(part in ("site-packages", "dist-packages") for part in path.parts):
        return True
    return any(path.is_relative_to(root) for root in _stdlib_roots())


def _find_module(dotted: str, search_path: list[str] | None) -> list:
    """The specs of ``dotted`` and of its parent packages (outermost first), found with the path finder alone:
    nothing is imported (``importlib.util.find_spec`` would run the parents' ``__init__``). Stops at the first
    part not found (a missing module, a built-in, a module an installed finder provides)."""
    import importlib.machinery

    specs, locations = [], search_path
    parts = dotted.split(".")
    for i in range(len(parts)):
        name = ".".join(parts[:i + 1])
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, locations)
        except KeyError:
            # a namespace package inside a namespace package: the path finder found no module or regular
            # package of that name and builds a _NamespacePath, which looks its parent up in sys.modules
            folders = _subfolders(locations, parts[i])
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True) if folders else None
            if spec is not None:
                spec.submodule_search_locations = folders
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            break
        specs.append(spec)
        if spec.submodule_search_locations is None:  # a plain module: nothing below it
            break
        locations = _plain_locations(spec, locations, parts[i])
    return specs


def _plain_locations(spec, parent_locations: list[str] | None, part: str) -> list[str]:
    """A package's search locations as a list of folders. A namespace package's (PEP 420: no ``__init__.py``)
    is a ``_NamespacePath`` that recomputes itself from its parent module in ``sys.modules``, which nothing here
    imported (iterating it raises KeyError): its folders are then ``part`` in each of the parent's locations."""
    try:
        return list(spec.submodule_search_locations)
    except (KeyError, ImportError, AttributeError):
        return _subfolders(parent_locations, part)


def _subfolders(bases: list[str] | None, part: str) -> list[str]:
    """The folders named ``part`` in each of ``bases`` (default ``sys.path``): a namespace package's locations."""
    return [str(Path(base or ".") / part) for base in (bases if bases is not None else sys.path)
            if (Path(base or ".") / part).is_dir()]


def _imports_of(tree: ast.AST, package: str) -> tuple[set[str], bool]:
    """The modules a source's import statements (anywhere: module level, functions, ``try``) can run, as
    absolute dotted names (``from a import b``: ``a`` and ``a.b``, a submodule or not), and whether it calls
    an importer of computed names (:data:`DYNAMIC_IMPORTS`). ``package``: the module's package, for relative
    imports."""
    names: set[str] = set()
    dynamic = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if source == "__future__" or not source:
                continue
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            dynamic = dynamic or called in DYNAMIC_IMPORTS
    return names, dynamic


def module_sources(module: str, search_path: list[str] | None = None) -> list[str]:
    """The source files of the user's own code that importing ``module`` (a custom factory's or loss_fn's
    module, dotted) can run: its ``.py`` file, the ``__init__.py`` of its packages, and every module its import
    statements name (module-level and function-level, absolute and relative), followed to the end; never the
    standard library or an installed package (site-/dist-packages), which are not followed either. Files are
    read with :mod:`ast` and found with the path finder on ``search_path`` (default ``sys.path``): nothing is
    imported. A file that imports by a computed name (:data:`DYNAMIC_IMPORTS`: ``importlib.import_module``,
    ``__import__``, ``exec`` ...) cannot be followed, so every ``.py`` beside it counts as well (and is followed).

    Returns absolute paths, sorted; empty when ``module`` is not found or has no ``.py`` source (a built-in, an
    extension module, an installed package). A file that does not parse is kept and not followed (its capture
    fails in one line)."""
    found: set[Path] = set()
    parsed: set[Path] = set()
    todo = [module]
    visited: set[str] = set()
    while todo:
        name = todo.pop()
        if name in visited:
            continue
        visited.add(name)
        for spec in _find_module(name, search_path):
            origin = spec.origin if spec.has_location and isinstance(spec.origin, str) else None
            if origin is None or not origin.endswith(".py"):
                continue
            path = Path(origin).resolve()
            if path in parsed or _not_users_code(path):
                continue
            parsed.add(path)
            found.add(path)
            try:
                tree = ast.parse(path.read_bytes(), str(path))
            except (SyntaxError, ValueError, OSError):
                continue
            package = spec.name if spec.submodule_search_locations is not None else spec.name.rpartition(".")[0]
            imported, dynamic = _imports_of(tree, package)
            todo += sorted(imported)
            if dynamic:  # what it imports is known at run time only: the files beside it, followed too
                beside = sorted(p.resolve() for p in path.parent.glob("*.py"))
                found.update(beside)
                todo += [f"{package}.{p.stem}" if package else p.stem for p in beside if p.stem != "__init__"]
    return sorted(str(p) for p in found)
