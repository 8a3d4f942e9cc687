"""Load and validate the workflow config against ``schemas/config.schema.yaml`` (draft 2020-12).

Defaults from the schema are filled in first (also inside ``if``/``then`` branches, which is how the
per-kind workload sizes get theirs), then the result is validated. Errors name the key, the file and
the fix, in one paragraph.

Types are YAML's, checked strictly (:func:`_validator_class`): an ``integer`` setting takes a whole number written
without a decimal point (``2``; not ``2.0``, ``"2"`` or ``true``), a ``number`` setting an integer or a float (not a
quoted one, not a boolean). Only the values of ``snakemake --config`` overrides, which Snakemake hands over as
text, are converted to the schema's type first (:func:`coerce_strings`), and a number setting reads an exponent
that YAML 1.1 leaves as text (``1e-4``, ``1.0e4``) as the number it spells.
"""

from __future__ import annotations

import copy
import math
import functools
import difflib
import re
import sys
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from .errors import ConfigError
from .transforms.variants import COMPILER_CHANGES

# jsonschema is imported only where a config is validated (_matches, validate_config): importing it costs
# 0.1-1 s (more on a loaded machine), which every command and job importing this module would pay otherwise.
if TYPE_CHECKING:
    import jsonschema


#: Workload keys of the train step (schema: only with ``mode: train``).
TRAIN_KEYS = ("optimizer", "lr", "loss_fn")


def load_schema() -> dict:
    text = resources.files("operator_profiler").joinpath("schemas/config.schema.yaml").read_text()
    return yaml.safe_load(text)


@functools.lru_cache(maxsize=1)
def _validator_class():
    """Draft 2020-12 with YAML's types: ``integer`` is a Python int that is not a bool (jsonschema's own check also
    takes a float with no fractional part, ``2.0``, as an integer); ``number`` a finite int or float (not ``.nan``
    or ``.inf``), not a bool."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine_many({
        "integer": lambda _checker, value: isinstance(value, int) and not isinstance(value, bool),
        # finite: a NaN tolerance compares False with everything, so it would pass every variant's numerics
        "number": lambda _checker, value: isinstance(value, (int, float)) and not isinstance(value, bool)
        and math.isfinite(value),
    })
    return jsonschema.validators.extend(base, type_checker=checker)


def _matches(condition: dict, instance) -> bool:
    """Whether ``instance`` is valid against the schema ``condition`` (an ``if`` branch)."""
    return _validator_class()(condition).is_valid(instance)


def _resolve(schema: dict, root: dict) -> dict:
    ref = schema.get("$ref")
    if ref and ref.startswith("#/"):
        node = root
        for part in ref[2:].split("/"):
            node = node[part]
        return node
    return schema


def fill_defaults(instance, schema: dict, root: dict | None = None):
    """Fill ``default`` values of ``schema`` into ``instance`` (in place) and return it."""
    root = root or schema
    schema = _resolve(schema, root)
    if not isinstance(instance, dict):
        return instance
    for key, sub in schema.get("properties", {}).items():
        sub = _resolve(sub, root)
        if key not in instance and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        if key in instance:
            fill_defaults(instance[key], sub, root)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for key in list(instance):
            if key not in schema.get("properties", {}):
                fill_defaults(instance[key], extra, root)
    for branch in schema.get("allOf", []):
        condition = branch.get("if")
        if condition is not None and _matches(condition, instance):
            fill_defaults(instance, branch.get("then", {}), root)
    return instance


_TRUE, _FALSE = {"true", "yes", "on"}, {"false", "no", "off"}


def _coerce_scalar(value: str, types: list[str]):
    """A string from the command line (Snakemake passes nested ``--config`` values as text)."""
    text = value.strip()
    if "integer" in types and re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    if "number" in types:
        try:
            return float(text)
        except ValueError:
            pass
    if "boolean" in types and text.lower() in _TRUE | _FALSE:
        return text.lower() in _TRUE
    if "null" in types and text.lower() in {"null", "none", "~"}:
        return None
    return value


#: A number in exponent notation that YAML 1.1 (PyYAML, which Snakemake reads config files with) leaves as text:
#: ``1e-4`` and ``1.0e4`` (it reads only ``1.0e-4``, with a point and a signed exponent, as a float).
_EXPONENT_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)[eE][+-]?\d+")


def coerce_strings(instance, schema: dict, root: dict | None = None, only=None):
    """Convert string leaves to the scalar type the schema asks for, in place; returns ``instance``.

    ``snakemake --config harness='{iterations: 5}'`` delivers ``{"iterations": "5"}``; without this
    the override would be rejected as "'5' is not of type 'integer'". ``only``: the overrides (a dict shaped like
    the config): only the leaves at the key paths where it holds a string are converted, so a value quoted in a
    config file stays text (and the schema refuses it where a number or boolean is wanted), except a number in
    exponent notation at a number setting (:data:`_EXPONENT_NUMBER`: YAML 1.1 reads ``1e-4`` as text), which is
    read as the number it spells; None converts every string leaf.
    """
    root = root or schema
    schema = _resolve(schema, root)
    if not isinstance(instance, dict) or (only is not None and not isinstance(only, dict)):
        return instance
    subschemas = dict(schema.get("properties", {}))
    for branch in schema.get("allOf", []):
        condition = branch.get("if")
        if condition is not None and _matches(condition, instance):
            for key, sub in branch.get("then", {}).get("properties", {}).items():
                subschemas[key] = {**_resolve(subschemas.get(key, {}), root), **sub}
    extra = schema.get("additionalProperties")
    for key in list(instance):
        sub = subschemas.get(key, extra if isinstance(extra, dict) else None)
        if sub is None:
            continue
        sub = _resolve(sub, root)
        given = None if only is None else only.get(key)
        value = instance[key]
        if isinstance(value, str):
            types = sub.get("type", [])
            types = [types] if isinstance(types, str) else types
            if only is None or isinstance(given, str):
                instance[key] = _coerce_scalar(value, types)
            elif "number" in types and _EXPONENT_NUMBER.fullmatch(value.strip()):
                instance[key] = float(value.strip())
        else:
            coerce_strings(value, sub, root, None if only is None else (given if isinstance(given, dict) else {}))
    return instance


def _allowed_keys(error: jsonschema.ValidationError, instance: dict, root: dict) -> set[str]:
    schema = _resolve(error.schema, root)
    allowed = set(schema.get("properties", {}))
    for branch in schema.get("allOf", []):
        condition = branch.get("if")
        if condition is not None and _matches(condition, instance):
            allowed |= set(branch.get("then", {}).get("properties", {}))
    return allowed


def _describe(error: jsonschema.ValidationError, root: dict) -> str:
    where = ".".join(str(p) for p in error.absolute_path) or "(top level)"
    if error.validator in ("additionalProperties", "unevaluatedProperties") and isinstance(error.instance, dict):
        allowed = _allowed_keys(error, error.instance, root)
        unknown = sorted(k for k in error.instance if k not in allowed)
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            if key in TRAIN_KEYS:
                hints.append(f"'{key}' (only with mode: train)")
                continue
            hints.append(f"'{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
        return f"at '{where}': unknown key {', '.join(hints)}; allowed keys here: {', '.join(sorted(allowed))}"
    message = error.message
    description = _resolve(error.schema, root).get("description")
    if error.validator in ("pattern", "enum", "const") and description:
        message += f" (expected: {description})"
    if error.validator == "type":
        message += _type_advice(error, root)
    return f"at '{where}': {message}"


def _example(schema: dict, wanted: str) -> int | float:
    """A value of type ``wanted`` the setting ``schema`` accepts: its default, else its minimum, else 1."""
    for key in ("default", "minimum"):
        value = schema.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value) if wanted == "integer" else value
    low = schema.get("exclusiveMinimum")
    return 1 if low is None or low < 1 else int(low) + 1


def _type_advice(error: jsonschema.ValidationError, root: dict) -> str:
    """What to write instead of a value of the wrong type at a numeric setting (a float where a whole number is
    wanted, quoted text, a boolean), e.g. ``: a whole number is needed, without a decimal point; write threads:
    2``; "" for a setting that is not numeric."""
    types = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
    key = str(error.absolute_path[-1]) if error.absolute_path else "the key"
    value = error.instance
    if types == ["boolean"]:
        return f": write {key}: true or {key}: false (a YAML boolean, not quoted)"
    wanted = "integer" if "integer" in types else "number" if "number" in types else None
    if wanted is None:
        return ""
    kind = "a whole number" if wanted == "integer" else "a number"
    null = " (or null, or leave the key out)" if "null" in types else ""
    example = f"write {kind}, e.g. {key}: {_example(_resolve(error.schema, root), wanted)}{null}"
    if isinstance(value, bool):
        return f": {kind} is needed, and {str(value).lower()} is a boolean; {example}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return f": {kind} is needed, and {value!r} is not a finite number; {example}"
        if value.is_integer():
            return (f": {kind} is needed, without a decimal point (YAML reads {value!r} as a float); write {key}: "
                    f"{int(value)}")
        return f": {kind} is needed, and {value!r} has a fractional part; {example}"
    if isinstance(value, str):
        parsed = _coerce_scalar(value, [wanted])
        if isinstance(parsed, (int, float)) and not isinstance(parsed, bool) and math.isfinite(parsed):
            return f": {kind} is needed, and {value!r} is quoted text; write it without quotes: {key}: {value.strip()}"
        return f": {kind} is needed; {example}"
    return f": {kind} is needed; {example}"


def _consequence(error: jsonschema.ValidationError, errors: list) -> bool:
    """An ``unevaluatedProperties`` error caused by another error at or below its path: a failed
    per-kind ``if``/``then`` branch evaluates none of its properties, so every valid key of that
    workload would be reported as unexpected instead of the real problem (e.g. a wrong type)."""
    if error.validator != "unevaluatedProperties":
        return False
    path = list(error.absolute_path)
    return any(
        other.validator != "unevaluatedProperties" and list(other.absolute_path)[: len(path)] == path
        for other in errors
    )


COMPILE_KEYS = ("compile_scope", "compile_mode", "compile_options")


def _cross_field_problems(config: dict, given: dict | None = None) -> list[str]:
    """Constraints between keys that JSON Schema cannot say: shapes the model cannot be built with, and compile
    settings the user wrote (``given``: the config before defaults) for a workload that does not compile."""
    problems = []
    given_workloads = (given or {}).get("workloads") or {}
    for name, w in config.get("workloads", {}).items():
        where = f"workloads.{name}"
        written = given_workloads.get(name) if isinstance(given_workloads.get(name), dict) else {}
        ignored = [k for k in COMPILE_KEYS if k in written]
        if ignored and w.get("compile") is False:
            problems.append(f"at '{where}': {', '.join(ignored)} {'has' if len(ignored) == 1 else 'have'} no effect "
                            "with compile: false (the model runs eager); set compile: true or remove "
                            f"{'it' if len(ignored) == 1 else 'them'}")
        compiler = [c for c in w.get("changes", []) if c in COMPILER_CHANGES]
        if compiler and w.get("compile") is False:
            problems.append(f"at '{where}.changes': {', '.join(compiler)} need{'s' if len(compiler) == 1 else ''} "
                            "torch.compile, and this workload has compile: false; set compile: true or remove "
                            f"{'it' if len(compiler) == 1 else 'them'}")
        if w.get("kind") == "gpt2":
            if w["n_embd"] % w["n_head"]:
                problems.append(f"at '{where}': n_embd ({w['n_embd']}) must be a multiple of n_head ({w['n_head']})")
            if w["seq_len"] > w["n_positions"]:
                problems.append(f"at '{where}': seq_len ({w['seq_len']}) exceeds n_positions ({w['n_positions']}); "
                                "lower seq_len or raise n_positions")
        elif w.get("kind") == "transformers":
            problems += _transformers_problems(where, w)
        elif w.get("kind") == "sdpa_attention" and w["d_model"] % w["n_head"]:
            problems.append(f"at '{where}': d_model ({w['d_model']}) must be a multiple of n_head ({w['n_head']})")
    known = config.get("workloads", {})
    for index, name in enumerate(config.get("optimize", {}).get("workloads", [])):
        if name not in known:
            problems.append(f"at 'optimize.workloads[{index}]': {name!r} is not a workload of this config (known: "
                            f"{', '.join(sorted(known)) or 'none'}); name one under workloads")
    h = config.get("harness", {})
    if isinstance(h.get("warmup"), int) and isinstance(h.get("warmup_max"), int) and h["warmup_max"] < h["warmup"]:
        problems.append(f"at 'harness': warmup_max ({h['warmup_max']}) is below warmup ({h['warmup']}), the least "
                        "warm-up; raise warmup_max or lower warmup")
    problem = threads_problem(h.get("threads"))
    if problem:
        problems.append(f"at 'harness.threads': {problem}")
    for index, pattern in enumerate(config.get("nvtx", {}).get("ignore_ranges", [])):
        try:
            re.compile(pattern)
        except re.error as exc:
            problems.append(f"at 'nvtx.ignore_ranges[{index}]': {pattern!r} is not a regular expression ({exc})")
    return problems


def usable_cpus() -> int | None:
    """The CPUs this process may run on (its affinity: a cgroup or SLURM allocation narrows it); None if unknown."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def threads_problem(threads, usable: int | None = None) -> str | None:
    """Why ``harness.threads`` cannot run here (below 1, or more than the usable CPUs), or None (null: the default;
    a value of the wrong type is the schema's to report)."""
    if threads is None or isinstance(threads, bool) or not isinstance(threads, int):
        return None
    if threads < 1:
        return f"{threads} threads: give 1 or more, or leave it out (the default)"
    usable = usable if usable is not None else usable_cpus()
    if usable is not None and threads > usable:
        return (f"{threads} threads, more than the {usable} CPUs this process may use (its affinity): threads beyond "
                f"the cores wait for each other at every operator; give at most {usable}, or leave it out (the "
                "default)")
    return None


def resolved_threads(threads: int | None, usable: int | None = None) -> int:
    """The verification's thread count: ``harness.threads`` when set (refused with ConfigError when
    :func:`threads_problem` finds one), else every usable CPU."""
    problem = threads_problem(threads, usable)
    if problem:
        raise ConfigError(f"at 'harness.threads': {problem}")
    if threads:
        return int(threads)
    usable = usable if usable is not None else usable_cpus()
    return usable or 1


#: The package extra that installs transformers (kept equal to capture/hf.py's EXTRA, which imports torch).
TRANSFORMERS_EXTRA = "pip install -e '.[transformers]'"


def _transformers_problems(where: str, w: dict) -> list[str]:
    """A ``kind: transformers`` workload's problems the config can tell without importing torch or transformers:
    the package missing (naming the extra), a ``path`` that is not a local checkpoint folder (a hub name: nothing is
    downloaded)."""
    import importlib.util
    import os

    problems = []
    if importlib.util.find_spec("transformers") is None:
        problems.append(f"at '{where}': kind transformers needs the transformers package, which is not installed in "
                        f"this Python environment; install the project's extra: {TRANSFORMERS_EXTRA}")
    path = w.get("path")
    if not w.get("model_type") and not path:
        problems.append(f"at '{where}': kind transformers needs model_type (a transformers model type, e.g. gpt2, "
                        "llama, bert, vit, resnet: built from its config) or path (a local checkpoint folder)")
    if path and not os.path.isdir(path):
        problems.append(f"at '{where}.path': {path!r} is not a local folder; Operator Profiler never downloads a "
                        "model (a hub name is refused): download it yourself and set path to its folder, or build "
                        "it from its config with model_type and no path")
    return problems


def _plain(value):
    """``value`` with every mapping a dict (Snakemake's ``--config`` overrides are an immutable map)."""
    from collections.abc import Mapping

    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def validate_config(config: dict, source: str = "config", overrides=None) -> dict:
    """Return a validated copy of ``config`` with defaults filled.

    ``overrides``: the ``snakemake --config`` values merged into ``config`` (Snakemake hands nested ones over as
    text): the strings there are converted to the schema's type first (:func:`coerce_strings`); every other value
    must have its YAML type already (module docstring: ``threads: 2``, not ``2.0``, ``"2"`` or ``true``).

    Raises:
        ConfigError: unknown key, wrong type or value; the message gives the key path (e.g.
            ``workloads.gpt2.n_layr``), what is wrong, and the fix (for a value of the wrong type, what to write
            instead).
    """
    import jsonschema

    schema = load_schema()
    filled = copy.deepcopy(config or {})
    coerce_strings(filled, schema, only=_plain(overrides) if overrides else {})
    filled = fill_defaults(filled, schema)
    validator = _validator_class()(schema)
    errors = sorted(validator.iter_errors(filled), key=lambda e: (len(e.absolute_path), e.message))
    errors = [e for e in errors if not _consequence(e, errors)]
    if errors:
        best = jsonschema.exceptions.best_match(errors)
        others = [_describe(e, schema) for e in errors[:5] if e is not best]
        more = f" Also: {'; '.join(others)}." if others else ""
        raise ConfigError(
            f"invalid configuration in {source} {_describe(best, schema)}.{more} "
            "Fix the key in the config file (or the --config override); the accepted keys, types "
            "and defaults are listed in workflow/schemas/config.schema.yaml and docs/config.md."
        )
    problems = _cross_field_problems(filled, config)
    if problems:
        raise ConfigError(f"invalid configuration in {source} {'; '.join(problems)}. Fix the value in "
                          "the config file (or the --config override).")
    return filled


def load_config(path: Path) -> dict:
    """Read a YAML config file and validate it.

    Raises:
        ConfigError: unreadable file, invalid YAML, or invalid content.
    """
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from None
    return validate_config(raw, str(path))


def _top_level_names(tree) -> set[str]:
    """Names a module's source binds at top level: def, class, plain assignment, import (a name bound any other
    way, in an ``if``/``try`` block, by ``from x import *`` or ``globals()``, is not seen: then the module is
    imported to look it up)."""
    import ast

    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {alias.asname or alias.name.partition(".")[0] for alias in node.names if alias.name != "*"}
    return names


def _check_callable(spec: str, what: str, import_module: bool) -> str | None:
    """Why ``spec`` (``package.module:function``) does not name a callable, or None when it does.

    The module is found on the path and its source parsed; with ``import_module`` it is then imported (its
    top-level code runs; the function is never called). Without it the import happens only when the parsed
    source does not show the name at top level, to tell a missing name from one bound at run time."""
    import ast
    import importlib
    import importlib.util
    import os
    import traceback

    module_name, _, attr = spec.partition(":")
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):  # a parent package that is missing or not a package
        found = None
    if found is None:
        return (f"{what} {spec!r}: no module {module_name!r} on the Python path; put the folder holding it on "
                "PYTHONPATH (e.g. PYTHONPATH=/path/to/folder snakemake ... or opprof ...) or install it")
    origin = found.origin if found.origin and found.origin.endswith(".py") else None
    if origin is not None:
        try:
            with open(origin, "rb") as f:
                tree = ast.parse(f.read(), filename=origin)
        except SyntaxError as exc:
            return (f"{what} {spec!r}: module {module_name!r} has a SyntaxError at {exc.filename}:{exc.lineno}: "
                    f"{exc.msg}; fix the module")
        except OSError as exc:
            return f"{what} {spec!r}: cannot read {origin} ({exc.strerror or exc})"
        if attr in _top_level_names(tree) and not import_module:
            return None
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the module's own code: name its file and line
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
        where = ""
        if isinstance(exc, SyntaxError) and exc.filename:
            where = f" at {exc.filename}:{exc.lineno}"
        elif frames:
            where = f" at {frames[-1].filename}:{frames[-1].lineno}"
        first = (str(exc).splitlines() or [""])[0]
        return (f"{what} {spec!r}: importing module {module_name!r} raised {type(exc).__name__}{where}: {first}; "
                "fix the module (or install what it imports)")
    value = getattr(module, attr, None)
    location = getattr(module, "__file__", None) or module_name
    if value is None:
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        close = difflib.get_close_matches(attr, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else (f"; it defines {', '.join(names[:8])}" if names else "")
        shown = os.path.relpath(location) if os.path.isabs(location) else location
        return f"{what} {spec!r}: module {module_name!r} ({shown}) has no {attr!r}{hint}"
    if not callable(value):
        return f"{what} {spec!r}: {attr!r} in module {module_name!r} is a {type(value).__name__}, not a function"
    return None


def inductor_option_problems(options: dict) -> dict[str, str]:
    """Why torch.compile would refuse each bad key of ``options`` (``torch.compile(options=...)``): ``"unknown"``
    for a name not in ``torch._inductor.list_options()``, else torch's own message for a value of the wrong type
    (the check torch.compile runs, ``_TorchCompileInductorWrapper.apply_options``). Imports torch."""
    import torch
    import torch._inductor

    known = set(torch._inductor.list_options())
    problems = {}
    for key, value in options.items():
        if key.replace("-", "_") not in known:
            problems[key] = "unknown"
            continue
        try:
            torch._TorchCompileInductorWrapper("default", {key: value}, False)
        except Exception as exc:  # torch's RuntimeError for a value of the wrong type
            problems[key] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return problems


@functools.lru_cache(maxsize=1)
def _inductor_option_names() -> tuple[str, ...]:
    import torch._inductor

    return tuple(sorted(torch._inductor.list_options()))


def _compile_option_problems(options: dict, in_process: bool) -> tuple[dict[str, str], tuple[str, ...]] | None:
    """:func:`inductor_option_problems` and the known names, here or (``in_process`` False: the DAG build, which
    imports no torch) in a child Python; None when torch cannot say."""
    if in_process:
        return inductor_option_problems(options), _inductor_option_names()
    import json
    import subprocess

    code = ("import json, sys, torch._inductor; from operator_profiler.config import inductor_option_problems; "
            "print(json.dumps([inductor_option_problems(json.loads(sys.argv[1])), torch._inductor.list_options()]))")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(options)], capture_output=True, text=True,
                          check=False)
    try:
        problems, names = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return problems, tuple(names)


def check_callables(config: dict, source: str = "config", import_modules: bool = True) -> None:
    """Check that every custom workload's ``factory`` and every ``loss_fn`` of a validated config names a
    callable of a module on the Python path, without calling it, and that every ``compile_options`` key of a
    compiled workload is an option of the installed torch._inductor with a value of its type
    (:func:`inductor_option_problems`).

    ``import_modules`` (``opprof validate-config``): import each module (its top-level code runs, so a missing
    dependency shows). Off (the DAG build, ``workflow/common.smk``: no user code, and no torch import, in the
    Snakemake process): the module is found and parsed, and imported only when its source does not show the
    name at top level; a dependency it lacks then shows in the capture job, in one line.

    Raises:
        ConfigError: one line per problem, naming the workload, the key and what to fix (PYTHONPATH for a
            module that is not found, the file and line of a syntax error or of an import that raised).
    """
    problems = []
    for name, w in config.get("workloads", {}).items():
        for key, what in (("factory", "factory"), ("loss_fn", "loss_fn")):
            spec = w.get(key)
            if isinstance(spec, str) and spec:
                why = _check_callable(spec, what, import_modules)
                if why:
                    problems.append(f"workloads.{name}.{key}: {why}")
        options = w.get("compile_options") or {}
        found = _compile_option_problems(options, in_process=import_modules) if options and w.get("compile") else None
        for key, why in sorted((found or ({}, ()))[0].items()):
            if why == "unknown":
                close = difflib.get_close_matches(key, found[1], n=1)
                problems.append(f"workloads.{name}.compile_options: {key!r} is not an option of the installed "
                                "torch._inductor (torch._inductor.list_options())"
                                + (f"; did you mean {close[0]!r}?" if close else ""))
            else:
                problems.append(f"workloads.{name}.compile_options: {key!r}: {why}")
    if problems:
        raise ConfigError(f"in {source}: {'; '.join(problems)}")
