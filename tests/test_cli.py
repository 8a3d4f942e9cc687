"""Tests for the ``opprof`` command line (operator_profiler.cli), run as a subprocess like a user would.

The attribution check reads the written parquet with pandas and compares with counts taken from the raw trace.
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import REAL_DATA, need_real

COMPILED = REAL_DATA / "inductor-cpu" / "traces" / "trace_compiled_cpu.json.gz"
INDUCTOR_DIR = REAL_DATA / "inductor-cpu" / "torchinductor"


def opprof(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "operator_profiler.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def _error_lines(stderr: str) -> list[str]:
    return [l for l in stderr.splitlines() if l.strip()]


@pytest.mark.parametrize("content", [b"not json at all", b"\x1f\x8b\x08\x00truncated", b'{"no": "events"}'])
def test_timeline_bad_file_is_one_line_error(tmp_path, content):
    bad = tmp_path / ("bad.json.gz" if content.startswith(b"\x1f\x8b") else "bad.json")
    bad.write_bytes(content)
    out = tmp_path / "x"
    res = opprof("timeline", "--kineto", bad, "--out", out, cwd=tmp_path)
    assert res.returncode == 1
    lines = _error_lines(res.stderr)
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("opprof timeline: error:") and str(bad) in lines[0]
    assert "Traceback" not in res.stderr and res.stdout == ""
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [bad.name]


def test_timeline_missing_file(tmp_path):
    res = opprof("timeline", "--kineto", tmp_path / "missing.json", "--out", tmp_path / "x", cwd=tmp_path)
    assert res.returncode == 1
    lines = _error_lines(res.stderr)
    assert len(lines) == 1 and "error:" in lines[0] and "missing.json" in lines[0]
    assert not (tmp_path / "x").exists()


def test_attribute_missing_timeline_is_a_user_error(tmp_path):
    res = opprof("attribute", "--timeline", tmp_path / "nothing", "--out", tmp_path / "a.parquet", cwd=tmp_path)
    assert res.returncode == 1
    assert "Traceback" not in res.stderr and "error:" in res.stderr
    assert not (tmp_path / "a.parquet").exists()


def test_validate_config_bad_key(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("workloads:\n  gpt2:\n    kind: gpt2\n    n_layr: 3\n")
    res = opprof("validate-config", cfg, cwd=tmp_path)
    assert res.returncode == 1
    lines = _error_lines(res.stderr)
    assert len(lines) == 1 and "n_layr" in lines[0] and "workloads.gpt2" in lines[0]


def test_validate_config_prints_defaults(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("device: cpu\n")
    res = opprof("validate-config", cfg, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    printed = json.loads(res.stdout)
    assert printed["device"] == "cpu" and printed["workloads"]["gpt2"]["n_layer"] == 4


def test_every_option_of_every_subcommand_has_help():
    import argparse

    from operator_profiler.cli import build_parser

    parser = build_parser()
    missing, seen = [], 0
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helped = {choice.dest for choice in action._choices_actions if choice.help}
            missing += [f"{name} (the subcommand)" for name in action.choices if name not in helped]
            for name, sub in action.choices.items():
                for option in sub._actions:
                    if isinstance(option, argparse._HelpAction):
                        continue
                    seen += 1
                    if not (option.help or "").strip():
                        missing.append(f"{name} {'/'.join(option.option_strings) or option.dest}")
        elif not isinstance(action, argparse._HelpAction) and not (action.help or "").strip():
            missing.append("/".join(action.option_strings) or action.dest)
    assert seen > 50 and not missing, missing


CUSTOM = "workloads:\n  mine:\n    kind: custom\n    factory: {factory}\n"


@pytest.mark.parametrize("factory, module, expected", [
    ("nowhere_models:build", None, "no module 'nowhere_models' on the Python path; put the folder holding it on "
                                   "PYTHONPATH"),
    ("cfg_models:biuld", "def build():\n    pass\n", "module 'cfg_models' (cfg_models.py) has no 'biuld' "
                                                        "(did you mean 'build'?)"),
    ("cfg_models:build", "def build(:\n", "module 'cfg_models' has a SyntaxError at "),
    ("cfg_models:build", "import not_installed_dependency\n", "importing module 'cfg_models' raised "
                                                                "ModuleNotFoundError at "),
    ("cfg_models:build", "build = 3\n", "'build' in module 'cfg_models' is a int, not a function"),
])
def test_validate_config_checks_that_the_factory_imports(tmp_path, monkeypatch, factory, module, expected):
    from conftest import run_opprof

    if module is not None:
        (tmp_path / "cfg_models.py").write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cfg_models", raising=False)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CUSTOM.format(factory=factory))
    res = run_opprof("validate-config", cfg, cwd=tmp_path)
    lines = _error_lines(res.stderr)
    assert res.returncode == 1 and len(lines) == 1, res.stderr
    assert lines[0].startswith(f"opprof validate-config: error: in {cfg}: workloads.mine.factory: factory {factory!r}")
    assert expected in lines[0]
    if "SyntaxError" in expected:
        assert f"cfg_models.py:1" in lines[0]
    # --no-imports checks the config only
    assert run_opprof("validate-config", "--no-imports", cfg, cwd=tmp_path).returncode == 0


def test_validate_config_checks_loss_fn_and_accepts_a_good_factory(tmp_path, monkeypatch):
    from conftest import run_opprof

    (tmp_path / "cfg_models2.py").write_text("def build():\n    raise SystemExit('never called')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CUSTOM.format(factory="cfg_models2:build"))
    res = run_opprof("validate-config", cfg, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["workloads"]["mine"]["factory"] == "cfg_models2:build"
    cfg.write_text(CUSTOM.format(factory="cfg_models2:build") + "    mode: train\n    loss_fn: cfg_models2:loss\n")
    res = run_opprof("validate-config", cfg, cwd=tmp_path)
    assert res.returncode == 1 and "workloads.mine.loss_fn: loss_fn 'cfg_models2:loss'" in res.stderr
    cfg.write_text(CUSTOM.format(factory="cfg_models2:build") + "    optimizer: sgd\n")
    res = run_opprof("validate-config", cfg, cwd=tmp_path)
    assert res.returncode == 1 and "unknown key 'optimizer' (only with mode: train)" in res.stderr


def test_attribute_with_an_inductor_dir_without_graphs_fails(tmp_path):
    d = tmp_path / "d"
    res = opprof("timeline", "--kineto", COMPILED, "--out", d, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (tmp_path / "nothing").mkdir()  # a folder, without compiled graphs (a missing one is named as such)
    res = opprof("attribute", "--timeline", d, "--out", d / "attr.parquet", "--inductor-dir", tmp_path / "nothing",
                 cwd=tmp_path)
    assert res.returncode == 1 and "no Inductor debug directory" in res.stderr and "Traceback" not in res.stderr
    assert not (d / "attr.parquet").exists()


def test_attribute_on_a_folder_without_a_timeline_names_the_missing_files(tmp_path):
    res = opprof("attribute", "--timeline", tmp_path / "empty", "--out", tmp_path / "a.parquet", cwd=tmp_path)
    assert res.returncode == 1
    assert "missing input" in res.stderr and "kernels.parquet" in res.stderr and "opprof timeline" in res.stderr


def test_timeline_then_attribute_real_compiled_trace(tmp_path):
    need_real(COMPILED, INDUCTOR_DIR)
    with gzip.open(COMPILED, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    cpp_calls = sum(1 for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"
                    and re.match(r"^graph_\d+_cpp_", e["name"]))

    d = tmp_path / "d"
    res = opprof("timeline", "--kineto", COMPILED, "--out", d, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert {p.name for p in d.iterdir()} == {"kernels.parquet", "launches.parquet", "ranges.parquet",
                                             "gpu_activities.parquet", "diagnostics.json"}
    assert len(pd.read_parquet(d / "gpu_activities.parquet")) == 0  # a CPU trace: no memcpy/memset
    kernels = pd.read_parquet(d / "kernels.parquet")
    assert f"{len(kernels)} kernels" in res.stdout

    res = opprof("attribute", "--timeline", d, "--out", d / "attr.parquet", "--inductor-dir", INDUCTOR_DIR,
                 cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    attr = pd.read_parquet(d / "attr.parquet")
    assert not (d / "fusion_map.parquet").exists()  # built in memory: nothing written beside --out
    assert len(attr) == len(kernels)
    assert sorted(attr["kernel_id"]) == sorted(kernels["kernel_id"])
    assert (attr["path"] != "unattributed").all()
    assert attr["operator"].notna().all()
    assert (attr["path"] == "inductor").sum() == cpp_calls > 0
    assert f"{len(attr)} of {len(attr)} kernels attributed" in res.stdout
    # The contract columns come first, in order.
    from operator_profiler import tables

    assert list(attr.columns[: len(tables.ATTRIBUTION.names)]) == tables.ATTRIBUTION.names

    # Without the Inductor directory the C++ kernels are visible but unattributed.
    res = opprof("attribute", "--timeline", d, "--out", d / "attr_plain.parquet", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    plain = pd.read_parquet(d / "attr_plain.parquet")
    assert len(plain) == len(kernels)
    assert (plain["reason"] == "no_fusion_map").sum() == cpp_calls


def test_malformed_stage_inputs_are_one_line_errors(tmp_path):
    """Wrong or broken files given to the stage commands: one line naming the file, exit 1, no traceback."""
    d = tmp_path / "tl"
    assert opprof("timeline", "--kineto", COMPILED, "--out", d, cwd=tmp_path).returncode == 0
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "obj.json").write_text("{}")
    (tmp_path / "entry.json").write_text('[{"path": 1}]')
    (tmp_path / "corrupt.parquet").write_bytes(b"not parquet")
    cases = [
        (["classify", "--timeline", d, "--layers", tmp_path / "bad.json", "--out", tmp_path / "c"], "not valid JSON"),
        (["classify", "--timeline", d, "--layers", tmp_path / "obj.json", "--out", tmp_path / "c"], "expected a list"),
        (["classify", "--timeline", d, "--layers", tmp_path / "entry.json", "--out", tmp_path / "c"], "entry 0"),
        (["attribute", "--timeline", d, "--kernel-layers", tmp_path / "corrupt.parquet", "--out", tmp_path / "a.parquet"],
         "not a readable parquet file"),
        (["aggregate", "--attribution", d / "kernels.parquet", "--instances", d / "kernels.parquet", "--classes",
          tmp_path / "obj.json", "--out", tmp_path / "agg"], "is not an attribution table"),
    ]
    for args, fragment in cases:
        res = opprof(*args, cwd=tmp_path)
        assert res.returncode == 1, args
        assert fragment in res.stderr and "Traceback" not in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "c").exists() and not (tmp_path / "a.parquet").exists() and not (tmp_path / "agg").exists()


def test_a_trace_without_kernels_goes_through_every_stage(tmp_path):
    # A profiler window in which nothing ran: one annotation, no op, no kernel. (A trace with no
    # event at all is refused: test_kineto_cases.test_trace_without_any_event_is_a_clear_error.)
    (tmp_path / "empty.json").write_text('{"traceEvents": [{"ph": "X", "cat": "user_annotation", '
                                         '"name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]}')
    (tmp_path / "layers.json").write_text("[]")
    steps = [
        ["timeline", "--kineto", "empty.json", "--out", "tl"],
        ["classify", "--timeline", "tl", "--layers", "layers.json", "--out", "lay"],
        ["attribute", "--timeline", "tl", "--kernel-layers", "lay/kernel_layers.parquet", "--out", "a.parquet"],
        ["aggregate", "--attribution", "a.parquet", "--instances", "lay/instances.parquet", "--classes",
         "lay/classes.json", "--out", "agg"],
    ]
    for step in steps:
        res = opprof(*step, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
    coverage = json.loads((tmp_path / "agg" / "coverage.json").read_text())
    assert coverage["kernel_count"] == 0 and coverage["coverage_time"] == 0.0


def test_tables_of_another_timeline_are_refused(tmp_path):
    """QA findings: aggregate took instances/classes of another trace (layer figures of 19,370 kernels
    beside modules of 79), --counters took an attribution table (a traceback), --kernel-layers took an
    attribution table (silently). Each is now a one-line error naming the file, exit 1."""
    from conftest import real_file

    (tmp_path / "layers.json").write_text("[]")
    for name, trace in (("a", "hta_critical_path_alexnet__trace.json.gz"), ("b", "hta_triton_example.json.gz")):
        for step in (["timeline", "--kineto", real_file("kineto", trace), "--out", f"tl_{name}"],
                     ["classify", "--timeline", f"tl_{name}", "--layers", "layers.json", "--out", f"lay_{name}"]):
            assert opprof(*step, cwd=tmp_path).returncode == 0
    assert opprof("attribute", "--timeline", "tl_a", "--out", "a.parquet", cwd=tmp_path).returncode == 0
    cases = [
        (["aggregate", "--attribution", "a.parquet", "--instances", "lay_b/instances.parquet", "--classes",
          "lay_b/classes.json", "--out", "agg1"], "does not describe the timeline of"),
        (["aggregate", "--attribution", "a.parquet", "--instances", "lay_a/instances.parquet", "--classes",
          "lay_a/classes.json", "--counters", "a.parquet", "--out", "agg2"], "ncu_id"),
        (["attribute", "--timeline", "tl_a", "--kernel-layers", "a.parquet", "--out", "a2.parquet"], "position"),
    ]
    for args, needle in cases:
        res = opprof(*args, cwd=tmp_path)
        assert res.returncode == 1, (args, res.stderr)
        lines = _error_lines(res.stderr)
        assert len(lines) == 1 and needle in lines[0] and "Traceback" not in res.stderr, res.stderr
    assert not (tmp_path / "agg1").exists() and not (tmp_path / "agg2").exists()
    assert not (tmp_path / "a2.parquet").exists()


@pytest.mark.parametrize("edit", ["self parent", "two-range cycle", "repeated id"])
def test_attribute_refuses_a_ranges_table_whose_parents_never_end(tmp_path, edit):
    """A hand-edited ranges.parquet whose parent_id chains run in a cycle (or whose range ids repeat) is refused
    with one line naming the file and the range: the attribution walks up parents and would never stop.
    A filtered and renumbered table whose chains all end is still attributed."""
    need_real(COMPILED)
    d = tmp_path / "d"
    assert opprof("timeline", "--kineto", COMPILED, "--out", d, cwd=tmp_path).returncode == 0
    ranges = pd.read_parquet(d / "ranges.parquet")
    child = int(ranges.index[ranges["parent_id"].notna()][0])
    parent = int(ranges.loc[child, "parent_id"])
    if edit == "self parent":
        ranges.loc[child, "parent_id"] = ranges.loc[child, "range_id"]
    elif edit == "two-range cycle":
        ranges.loc[ranges["range_id"] == parent, "parent_id"] = ranges.loc[child, "range_id"]
    else:
        ranges.loc[child, "range_id"] = parent
    ranges.to_parquet(d / "ranges.parquet")
    res = opprof("attribute", "--timeline", d, "--out", d / "attr.parquet", cwd=tmp_path)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    said = "names more than one range" if edit == "repeated id" else "never ends (the parents form a cycle)"
    assert "ranges.parquet" in res.stderr and said in res.stderr, res.stderr
    assert not (d / "attr.parquet").exists()


@pytest.mark.parametrize("edit", ["filtered", "renumbered", "renumbered 0..n-1 after a filter"])
def test_attribute_of_an_edited_ranges_table(tmp_path, edit):
    """A filtered ranges.parquet (a parent dropped: the ranges above it are lost to its children, whose operator
    would silently change) or one whose ids were renumbered without their parents is refused with one line; one
    renumbered consistently (parents with larger ids than their children) is attributed like the original."""
    need_real(COMPILED)
    d = tmp_path / "d"
    assert opprof("timeline", "--kineto", COMPILED, "--out", d, cwd=tmp_path).returncode == 0
    assert opprof("attribute", "--timeline", d, "--out", d / "want.parquet", cwd=tmp_path).returncode == 0
    ranges = pd.read_parquet(d / "ranges.parquet")
    dropped = ranges.index[ranges["parent_id"].notna()][:1]  # a range with a parent and, below it, children
    dropped = ranges.index[ranges["range_id"] == int(ranges.loc[dropped[0], "parent_id"])]
    if edit == "filtered":
        ranges = ranges.drop(index=dropped)
    elif edit == "renumbered":  # (the CPU kernels name their op's range: renumbered with it)
        top = int(ranges["range_id"].max()) + 1
        ranges["range_id"], ranges["parent_id"] = top - ranges["range_id"], top - ranges["parent_id"]
        kernels = pd.read_parquet(d / "kernels.parquet")
        kernels["range_id"] = top - kernels["range_id"]
        kernels.to_parquet(d / "kernels.parquet")
    else:
        ranges = ranges.drop(index=dropped).reset_index(drop=True)
        ranges["range_id"] = range(len(ranges))
    ranges.to_parquet(d / "ranges.parquet")
    res = opprof("attribute", "--timeline", d, "--out", d / "attr.parquet", cwd=tmp_path)
    if edit == "renumbered":
        assert res.returncode == 0, res.stderr
        got, want = pd.read_parquet(d / "attr.parquet"), pd.read_parquet(d / "want.parquet")
        assert got["operator"].equals(want["operator"]) and got["path"].equals(want["path"])
        return
    assert res.returncode == 1 and "Traceback" not in res.stderr and not (d / "attr.parquet").exists()
    said = ["names no range of the table"] if edit == "filtered" else ["has depth", "never ends", "names no range"]
    assert "ranges.parquet" in res.stderr and any(s in res.stderr for s in said), res.stderr
