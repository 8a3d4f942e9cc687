"""Every rule's ``lib`` input holds every package module its entry can import.

What a rule declares is read from Snakemake's own parse of the workflow (its rule objects, in a child
process). What the rule's entry imports is found without operator_profiler.workflow_inputs (which derives
the declarations from source with :mod:`ast`): for a ``script:`` rule, the stdlib ModuleFinder over the
script's bytecode, function-level imports included, followed through the package; for a GPU rule
(``python -m operator_profiler.gpu_jobs RULE``), the package modules ``gpu_jobs.main`` loads while it
dispatches RULE (run in a child process with the job's work replaced by a no-op), each then scanned by
ModuleFinder for the imports it runs later.
"""

from __future__ import annotations

import json
import modulefinder
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest
from workflow_runs import copy_repo

from operator_profiler import gpu_jobs
from operator_profiler.workflow_inputs import rule_inputs

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "operator_profiler"

# Snakemake's parse of the workflow: each rule's lib input, script and shell command, as JSON.
DECLARED = r"""
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

root, workdir = Path(sys.argv[1]), Path(sys.argv[2])
with SnakemakeApi(OutputSettings()) as api:
    workflow = api.workflow(
        resource_settings=ResourceSettings(cores=1), snakefile=root / "Snakefile", workdir=workdir,
        config_settings=ConfigSettings(configfiles=[root / "config" / "config.yaml"], config={"device": "cpu"}),
    )._workflow
    rules = {rule.name: {"lib": [str(f) for f in rule.input.lib] if "lib" in rule.input.keys() else None,
                         "script": str(Path(rule.basedir) / rule.script) if rule.script else None,
                         "shell": rule.shellcmd} for rule in workflow.rules}
print("RULES " + json.dumps(rules))
"""

# gpu_jobs.main for one rule, as Snakemake runs it, except the job's work: the package modules it loaded.
GPU_PROBE = r"""
import json, sys
from operator_profiler import gpu_jobs

rule, log = sys.argv[1], sys.argv[2]


class Anything(str):
    "Any attribute of the job, any JSON field: an empty JSON object."

    def __getattr__(self, name):
        return Anything("{}")


dispatch = gpu_jobs.RULES[rule]
gpu_jobs.RULES[rule] = lambda job: (dispatch(job), (lambda: None, ()))[1]
gpu_jobs.parse_job = lambda params, files: Anything("{}")
gpu_jobs.main([rule, "{}", json.dumps({"wildcards": {}, "input": {}, "output": {}}), log])
print("LOADED " + json.dumps(sorted(name for name in sys.modules if name.split(".")[0] == "operator_profiler")))
"""


def declared_rules(root: Path, workdir: Path) -> dict[str, dict]:
    """{rule: {"lib": [paths] or None, "script": path or None, "shell": command or None}} from Snakemake."""
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    done = subprocess.run([sys.executable, "-c", DECLARED, str(root), str(workdir)], check=False, capture_output=True,
                          text=True, env=env, cwd=workdir, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RULES ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RULES "))


class CachedModuleFinder(modulefinder.ModuleFinder):
    """The stdlib ModuleFinder, each source file compiled once per session (the 17 rules share most files)."""

    codes: ClassVar[dict[str, object]] = {}

    def load_module(self, fqname, fp, pathname, file_info):
        if file_info[2] != modulefinder._PY_SOURCE:
            return super().load_module(fqname, fp, pathname, file_info)
        if pathname not in self.codes:
            self.codes[pathname] = compile(fp.read(), pathname, "exec")
        module = self.add_module(fqname)
        module.__file__, module.__code__ = pathname, self.codes[pathname]
        self.scan_code(module.__code__, module)
        return module


def _package_files(finder: CachedModuleFinder, src: Path) -> set[str]:
    package = src / PACKAGE
    return {Path(m.__file__).relative_to(package).as_posix() for name, m in finder.modules.items()
            if name.split(".")[0] == PACKAGE and m.__file__}


def script_imports(script: Path, src: Path) -> set[str]:
    """The package files a script can import (ModuleFinder: the package on its path, nothing else)."""
    finder = CachedModuleFinder(path=[str(src)])
    finder.run_script(str(script))
    return _package_files(finder, src)


def _start_gpu_probe(rule: str, src: Path, tmp: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.Popen([sys.executable, "-c", GPU_PROBE, rule, str(tmp / f"{rule}.log")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _gpu_probe_imports(probe: subprocess.Popen, src: Path) -> set[str]:
    """The package files the probed ``python -m operator_profiler.gpu_jobs RULE`` loaded, and those they can
    import (gpu_jobs itself is not scanned: its imports for RULE are those the run made; a scan would add
    every rule's dispatch imports)."""
    stdout, stderr = probe.communicate(timeout=120)
    lines = [line for line in stdout.splitlines() if line.startswith("LOADED ")]
    assert probe.returncode == 0 and lines, stdout[-2000:] + stderr[-3000:]
    entry = f"{PACKAGE}.gpu_jobs"
    finder = CachedModuleFinder(path=[str(src)], excludes=[entry])
    for name in json.loads(lines[-1].removeprefix("LOADED ")):
        if name != entry:
            finder.import_hook(name)
    return _package_files(finder, src) | {"gpu_jobs.py"}


def entry_imports(declared: dict[str, dict], rules: list[str], src: Path, tmp: Path) -> dict[str, set[str]]:
    """{rule: the package files its entry can import}, the entry taken from Snakemake's declaration (its
    script, or its gpu_jobs command: those probes run side by side, while the scripts are scanned)."""
    probes = {}
    for rule in rules:
        if not declared[rule]["script"]:
            words = shlex.split(declared[rule]["shell"] or "")
            assert words[1:3] == ["-m", f"{PACKAGE}.gpu_jobs"] and words[3] == rule, (
                f"rule {rule}: no script and no gpu_jobs command ({declared[rule]['shell']!r}): no entry known")
            probes[rule] = _start_gpu_probe(rule, src, tmp)
    found = {rule: script_imports(Path(declared[rule]["script"]), src) for rule in rules if rule not in probes}
    return {**found, **{rule: _gpu_probe_imports(probe, src) for rule, probe in probes.items()}}


def lib_gaps(declared: dict[str, dict], imported: dict[str, set[str]], package: Path) -> dict[str, list[str]]:
    """{rule: the package files (relative) its entry imports that its lib input lacks}, rules with a gap only."""
    gaps = {}
    for rule, files in imported.items():
        assert declared[rule]["lib"] is not None, f"rule {rule} declares no lib input"
        lib = {Path(p).resolve().relative_to(package.resolve()).as_posix() for p in declared[rule]["lib"]}
        if files - lib:
            gaps[rule] = sorted(files - lib)
    return gaps


def missing_lib_inputs(root: Path, tmp: Path, rules: list[str]) -> dict[str, list[str]]:
    """{rule: the package files its entry imports that its lib input does not declare}, for ``rules`` with a gap."""
    workdir = tmp / "workdir"
    workdir.mkdir(exist_ok=True)
    declared = declared_rules(root, workdir)
    return lib_gaps(declared, entry_imports(declared, rules, root / "src", tmp), root / "src" / PACKAGE)


def describe(missing: dict[str, list[str]]) -> str:
    return "\n".join(f"rule {rule}: lib does not declare {', '.join(files)} (its entry imports them)"
                     for rule, files in sorted(missing.items()))


# The rules to check: one per script, one per gpu_jobs rule (that this is every rule is checked below).
CHECKED = sorted(p.stem for p in (ROOT / "scripts").glob("*.py")) + sorted(gpu_jobs.RULES)


@pytest.fixture(scope="module")
def declared(tmp_path_factory) -> dict[str, dict]:
    return declared_rules(ROOT, tmp_path_factory.mktemp("workdir"))


@pytest.fixture(scope="module")
def imported(declared, tmp_path_factory) -> dict[str, set[str]]:
    return entry_imports(declared, CHECKED, ROOT / "src", tmp_path_factory.mktemp("probes"))


def test_every_rule_that_runs_something_is_checked(declared):
    runs = {rule for rule, spec in declared.items() if spec["script"] or spec["shell"]}
    assert runs == set(CHECKED) and set(declared) - runs == {"all"}, (sorted(runs), CHECKED)


@pytest.mark.parametrize("rule", CHECKED)
def test_rule_declares_every_module_its_entry_imports(declared, imported, rule):
    gaps = lib_gaps(declared, {rule: imported[rule]}, ROOT / "src" / PACKAGE)
    assert not gaps, describe(gaps)


def test_an_import_added_without_its_declaration_is_reported(tmp_path):
    """The check above fails, naming the rule and the module, when a module gains an import its rules do not
    declare: the lib lists are frozen (as hand-kept lists were), then files.py (imported by CPU and GPU rules)
    imports stale.py (imported by no rule) inside a function."""
    repo = copy_repo(tmp_path / "repo")
    package, scripts = repo / "src" / PACKAGE, repo / "scripts"
    rules = ("aggregate", "capture_timeline")
    frozen = {rule: rule_inputs(rule, package, scripts) for rule in CHECKED}
    assert not any(path.endswith("/stale.py") for lists in frozen.values() for path in lists)
    (tmp_path / "frozen.json").write_text(json.dumps(frozen))
    with open(repo / "workflow" / "common.smk", "a") as common:
        common.write(f"\n\ndef lib_inputs(rule):\n    return json.loads(Path({str(tmp_path / 'frozen.json')!r})"
                     ".read_text())[rule]\n")
    with open(package / "files.py", "a") as files:
        files.write("\n\ndef _added_later():\n    from . import stale\n\n    return stale\n")

    missing = missing_lib_inputs(repo, tmp_path, list(rules))
    assert missing == {"aggregate": ["stale.py"], "capture_timeline": ["stale.py"]}, missing
    assert describe(missing).splitlines() == [
        "rule aggregate: lib does not declare stale.py (its entry imports them)",
        "rule capture_timeline: lib does not declare stale.py (its entry imports them)"]
    # The derivation follows the new import: with it, both rules declare stale.py.
    for rule in rules:
        assert str(package.resolve() / "stale.py") in rule_inputs(rule, package, scripts), rule


# A package in small: what the derivation follows (relative and lazy imports, `from . import x`, a submodule
# named in `from .pkg import name`, a module alias's attribute, gpu_jobs's dispatch table) and how far a data file
# reaches (only to the rules that can call the function naming it).
SMALL = {
    "__init__.py": "",
    "gpu_jobs.py": """
from .interrupts import watch


def _first(job):
    from . import first

    return first.run, ()


def _second(job):
    from .sub import second

    return second.run, ()


RULES = {"first_rule": _first, "second_rule": _second}


def main():
    from .errors import run_rule

    watch()
    run_rule()
""",
    "interrupts.py": "def watch():\n    pass\n",
    "errors.py": "def run_rule():\n    pass\n",
    "first.py": "import json\n\n\ndef run():\n    from .sub.leaf import helper\n\n    return json.dumps(helper())\n",
    "sub/__init__.py": "",
    "sub/second.py": "from ..shared import VALUE\n\n\ndef run():\n    return VALUE\n",
    "sub/leaf.py": """
from importlib import resources


def helper():
    return 1


def load_table():
    return resources.files(__package__).joinpath("table.yaml").read_text()
""",
    "sub/table.yaml": "a: 1\n",
    "shared.py": "VALUE = 1\n",
    "hub.py": """
from . import shared as alias


def uses_table():
    from .sub.leaf import load_table

    return load_table()


def no_table():
    from .sub import leaf

    return leaf.helper() + alias.VALUE
""",
    "unused.py": "from . import first\n",
}


@pytest.fixture
def small_package(tmp_path) -> tuple[Path, Path]:
    package, scripts = tmp_path / "src" / PACKAGE, tmp_path / "scripts"
    for name, text in SMALL.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text.lstrip())
    scripts.mkdir()
    (scripts / "table_rule.py").write_text(f"from {PACKAGE} import hub\n\nhub.uses_table()\n")
    (scripts / "plain_rule.py").write_text(f"from {PACKAGE}.hub import no_table\n\nno_table()\n")
    return package, scripts


def test_derivation_follows_every_kind_of_import_and_data_files_by_call(small_package):
    package, scripts = small_package

    def derived(rule):
        return {Path(p).relative_to(package.resolve()).as_posix() for p in rule_inputs(rule, package, scripts)}

    gpu = {"__init__.py", "gpu_jobs.py", "interrupts.py", "errors.py"}
    assert derived("first_rule") == gpu | {"first.py", "sub/__init__.py", "sub/leaf.py"}
    assert derived("second_rule") == gpu | {"sub/__init__.py", "sub/second.py", "shared.py"}
    hub = {"__init__.py", "hub.py", "shared.py", "sub/__init__.py", "sub/leaf.py"}
    assert derived("table_rule") == hub | {"sub/table.yaml"}
    assert derived("plain_rule") == hub  # leaf.py is imported, its load_table never called
    with pytest.raises(ValueError, match="rule 'nope' has no entry"):
        rule_inputs("nope", package, scripts)


def test_a_cache_of_other_sources_is_not_used(small_package):
    package, scripts = small_package
    expected = rule_inputs("table_rule", package, scripts)
    cache = package / "__pycache__" / "workflow_inputs.json"
    assert json.loads(cache.read_text())["rules"]["table_rule"] == [
        Path(p).relative_to(package.resolve()).as_posix() for p in expected]
    # Another key (other sources), then an unreadable file: both derived again, the same.
    cache.write_text(json.dumps({"key": "other", "rules": {"table_rule": ["hub.py"]}}))
    (scripts / "plain_rule.py").touch()  # a new stamp: the in-process cache does not answer either
    assert rule_inputs("table_rule", package, scripts) == expected
    cache.write_text("{not json")
    os.utime(scripts / "plain_rule.py", ns=(1, 1))
    assert rule_inputs("table_rule", package, scripts) == expected


@pytest.mark.parametrize("rule", sorted(gpu_jobs.RULES))
def test_a_gpu_rule_depends_on_no_analysis_code(declared, rule):
    """An edit of the analysis side (timeline readers, layers, matching, attribution, aggregation, reports) must
    never re-run a GPU capture or replay: their declared library inputs are the capture side and the ncu run."""
    analysis = ("timeline/", "layers.py", "matching/", "attribution/", "aggregate.py", "report/", "stages.py",
                "results.py", "ncu/plan.py")
    lib = [str(p).split(f"{PACKAGE}/", 1)[-1] for p in declared[rule]["lib"]]
    assert lib and not [p for p in lib if p.startswith(analysis)], lib


# ------------------------------------------------------------------------ a custom factory's module closure

# A user's model folder (docs/config.md#profiling-your-own-model: a factory `module:function` on PYTHONPATH):
# the factory's module imports a sibling at module level, a package's submodule (whose __init__ imports another
# through a relative import) and, inside the factory, one more sibling; two files beside them are never imported.
USER = {
    "wf_models.py": "import json\n\nimport torch\nfrom wf_layers import Stack\nfrom zoo.blocks import Block\n\n\n"
                    "def build(width):\n    from wf_init import scale\n\n"
                    "    return Stack(Block(width), scale), (torch.randn(2, width),)\n",
    "wf_layers.py": "import torch\n\n\nclass Stack(torch.nn.Sequential):\n    def __init__(self, block, scale):\n"
                    "        super().__init__(block)\n        self.scale = scale\n",
    "wf_init.py": "scale = 2.0\n",
    "wf_unrelated.py": "raise SystemExit('never imported')\n",
    "zoo/__init__.py": "from .registry import NAMES\n",
    "zoo/registry.py": "NAMES = ['block']\n",
    "zoo/blocks.py": "import torch\n\nfrom . import registry\n\n\nclass Block(torch.nn.Linear):\n"
                     "    def __init__(self, width):\n        super().__init__(width, width)\n",
    "zoo/unused.py": "raise SystemExit('never imported')\n",
}
LOADED = r"""
import importlib, json, sys
from pathlib import Path
folder = Path(sys.argv[1]).resolve()
sys.path.insert(0, str(folder))
module = importlib.import_module(sys.argv[2])
module.build(4)
print(json.dumps(sorted(str(Path(m.__file__).resolve()) for m in list(sys.modules.values())
                        if getattr(m, "__file__", None) and Path(m.__file__).resolve().is_relative_to(folder))))
"""


def _user_folder(root: Path, files: dict) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _loaded(folder: Path, module: str) -> set[str]:
    """The files of ``folder`` that Python itself loads when importing ``module`` and calling its build(4)."""
    out = subprocess.run([sys.executable, "-c", LOADED, str(folder), module], capture_output=True, text=True,
                         timeout=300, check=True)
    return set(json.loads(out.stdout))


def test_a_factory_module_s_sources_are_its_import_closure(tmp_path):
    """The factory module, what it imports of the user's code (module- and function-level,
    a package's __init__ and relative imports), followed to the end: the files Python loads when the module is
    imported and the factory called, no more; never the files beside them that nothing imports, the standard
    library (json) or an installed package (torch)."""
    from operator_profiler.workflow_inputs import module_sources

    folder = _user_folder(tmp_path / "user", USER).resolve()
    expected = {str(folder / n) for n in ("wf_models.py", "wf_layers.py", "wf_init.py", "zoo/__init__.py",
                                          "zoo/registry.py", "zoo/blocks.py")}
    assert _loaded(folder, "wf_models") == expected  # the fixture is what it says
    got = module_sources("wf_models", [str(folder), *sys.path])
    assert set(got) == expected and got == sorted(got)
    # a module inside a package: its package's __init__ runs first
    assert set(module_sources("zoo.blocks", [str(folder)])) == {str(folder / "zoo" / n) for n in
                                                                  ("__init__.py", "registry.py", "blocks.py")}
    assert module_sources("no_such_module", [str(folder)]) == []


def test_an_installed_package_is_not_followed_and_a_computed_import_takes_the_files_beside_it(tmp_path):
    """A package under site-packages is not the user's code (its edits are an install, not a model change), and
    nothing it imports is followed; a module that imports by a computed name (importlib.import_module) cannot be
    read, so every .py beside it counts, and is followed."""
    from operator_profiler.workflow_inputs import module_sources

    site = _user_folder(tmp_path / "venv" / "lib" / "site-packages", {"vendor.py": "import user_helper\n"})
    folder = _user_folder(tmp_path / "user", {
        "plain.py": "import vendor\n",
        "user_helper.py": "x = 1\n",
        "plugins.py": "import importlib\n\n\ndef build(name):\n    return importlib.import_module(name)\n",
        "plugin_a.py": "from deep.more import y\n",
        "deep/more.py": "y = 2\n",
    })
    search = [str(folder), str(site)]
    assert module_sources("plain", search) == [str((folder / "plain.py").resolve())]
    assert set(module_sources("plugins", search)) == {str((folder / n).resolve()) for n in (
        "plain.py", "user_helper.py", "plugins.py", "plugin_a.py", "deep/more.py")}


def test_nested_namespace_packages_are_followed_without_importing_them(tmp_path):
    """PEP 420 namespace packages (folders without ``__init__.py``) nested two deep: the path finder's
    ``_NamespacePath`` of ``nspkg.sub`` recomputes itself from ``sys.modules['nspkg']``, which nothing imported,
    and building the DAG failed with KeyError: 'nspkg' (a QA user's factory ``import nspkg.sub.deep``). The
    closure is what Python loads, for an import of them and for a factory inside one."""
    from operator_profiler.workflow_inputs import module_sources

    folder = _user_folder(tmp_path / "user", {
        "fac.py": "import nspkg.sub.deep as deep\n\n\ndef build(n):\n    return deep.VALUE * n\n",
        "nspkg/sub/deep.py": "from nspkg.sub import helper\nVALUE = helper.X\n",
        "nspkg/sub/helper.py": "X = 3\n",
        "nspkg/sub/unused.py": "X = 4\n",
        "onlyns/inner/m.py": "from . import sibling\n\n\ndef build(n):\n    return sibling.Y + n\n",
        "onlyns/inner/sibling.py": "Y = 1\n",
    }).resolve()
    expected = {str(folder / n) for n in ("fac.py", "nspkg/sub/deep.py", "nspkg/sub/helper.py")}
    assert _loaded(folder, "fac") == expected  # the fixture is what it says
    assert set(module_sources("fac", [str(folder), *sys.path])) == expected
    inner = {str(folder / "onlyns" / "inner" / n) for n in ("m.py", "sibling.py")}
    assert _loaded(folder, "onlyns.inner.m") == inner
    assert set(module_sources("onlyns.inner.m", [str(folder)])) == inner
