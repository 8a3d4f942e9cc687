"""A whole-model compile captured outside the workflow: ``opprof attribute --inductor-dir`` on a
plain ``TORCH_COMPILE_DEBUG=1`` run and its torch.profiler trace gives compiled kernels their module from what the
debug directory holds (the TORCH_TRACE log's Dynamo graph and the provenance JSON,
docs/formats.md#inductor-torch_trace-log), never one the evidence does not fix.

One real compile on the CPU, in a child process started with ``TORCH_COMPILE_DEBUG=1`` (the TORCH_TRACE log is set
up when torch is imported). The same run also records the workflow's own module paths
(``opprof_module_paths.json``, operator_profiler.capture.fx_module_paths, from ``nn_module_stack``): that record
is the oracle, and the "imported" copy of the debug directory is the run without it. The model makes every
kernel's layer checkable without the code under test as well: each block multiplies by its own constant and has
its own LayerNorm eps, and the code before the blocks multiplies by 11, so the literals in a generated kernel's
C++ source say which modules' code it computes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from conftest import importable_module, run_opprof

from operator_profiler import layers
from operator_profiler.attribution import inductor
from operator_profiler.capture.workloads import find_layers
from operator_profiler.naming import MODULE_PATHS_JSON

ROOT = Path(__file__).resolve().parents[1]
MODEL = '''
import torch
import torch.nn as nn

BLOCKS = ((3.0, 0.001), (5.0, 0.002))  # (scale, LayerNorm eps) of blocks.0, blocks.1


class Blk(nn.Module):
    def __init__(self, d, k, eps):
        super().__init__()
        self.norm = nn.LayerNorm(d, eps=eps)
        self.up = nn.Linear(d, d)
        self.down = nn.Linear(d, d)
        self.k = k

    def forward(self, x):
        h = self.up(self.norm(x))
        h = torch.tanh(h) * self.k
        return x + self.down(h)


class Net(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.blocks = nn.ModuleList([Blk(d, k, eps) for k, eps in BLOCKS])
        self.out = nn.Linear(d, d)

    def forward(self, x):
        x = self.inp(x) * 11.0
        for block in self.blocks:
            x = block(x)
        return self.out(x)
'''
# What a user runs (plus the workflow's recorder, the oracle): compile the whole model, warm up, profile.
SCRIPT = '''
import sys
import torch
from operator_profiler.capture import fx_module_paths
from imported_model import Net

torch.manual_seed(0)
torch._inductor.config.cpp.enable_kernel_profile = True  # C++ kernels in the profiler (docs/formats.md)
model = Net()
x = torch.randn(4, 8)
with fx_module_paths.recording(), torch.no_grad():
    fx_module_paths.bind(model)
    compiled = torch.compile(model)
    for _ in range(2):
        compiled(x)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            compiled(x)
prof.export_chrome_trace(sys.argv[1])
'''
MARKERS = {"3.0": "blocks.0", "0.001": "blocks.0", "5.0": "blocks.1", "0.002": "blocks.1", "11.0": None}
_LITERAL_RE = re.compile(r"static_cast<float>\(([0-9.e+-]+)\)")


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """``(folder, recorded debug root, imported debug root, model module)``: the run, its debug tree as written
    (with the recorder's files) and a copy without them (what a run outside the workflow leaves)."""
    folder = tmp_path_factory.mktemp("imported")
    (folder / "imported_model.py").write_text(textwrap.dedent(MODEL))
    (folder / "run.py").write_text(textwrap.dedent(SCRIPT))
    # a cache of its own: a hit on an earlier run's compiled graph writes no debug dir
    env = {**os.environ, "TORCH_COMPILE_DEBUG": "1", "TORCH_COMPILE_DEBUG_DIR": str(folder / "debug"),
           "TORCHINDUCTOR_CACHE_DIR": str(folder / "cache"),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(folder)])}
    done = subprocess.run([sys.executable, str(folder / "run.py"), str(folder / "trace.json")], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    recorded = folder / "debug" / "torch_compile_debug"
    imported = folder / "imported" / "torch_compile_debug"
    shutil.copytree(recorded, imported, ignore=shutil.ignore_patterns(MODULE_PATHS_JSON))
    assert list(imported.rglob("dedicated_log_torch_trace_*.log"))  # TORCH_COMPILE_DEBUG=1 wrote the log
    assert [inductor.graph_kind(d.name) for d in inductor.find_graph_dirs(imported)] == ["inference"]
    with importable_module(folder, "imported_model", textwrap.dedent(MODEL)):
        import imported_model

        yield folder, recorded, imported, imported_model


def test_the_layers_the_log_shows_are_the_capture_s(captured):
    """The layer instances inferred from the log's parameter paths and shapes are those the capture's own rule
    finds on the model object (capture.workloads.find_layers)."""
    _, _, imported, model_module = captured
    fusion = inductor.load_fusion_map(imported)
    expected = find_layers(model_module.Net())
    assert [e["path"] for e in fusion.attrs["layers"]] == [layer.path for layer in expected] == ["blocks.0", "blocks.1"]
    assert all(e["param_shapes"] == {k: list(v) for k, v in layer.param_shapes.items()}
               for e, layer in zip(fusion.attrs["layers"], expected))


def test_each_call_site_s_layer_is_the_recorders_or_unknown(captured):
    """Per call site of the forward graph: the layer membership from the log's module paths equals the one from
    the workflow's record (nn_module_stack), or is unknown; never another answer. The sites that the evidence
    fixes (the four block GEMMs, the tanh*k kernels between a block's two Linears) are answered."""
    _, recorded, imported, _ = captured
    with_record = inductor.load_fusion_map(recorded).set_index(["graph", "call_index"])
    derived = inductor.load_fusion_map(imported).set_index(["graph", "call_index"])
    assert with_record.index.equals(derived.index)
    paths = {"blocks.0", "blocks.1"}
    answered = []
    for key, row in derived.iterrows():
        mine = layers.site_membership(list(row["module_paths"]), row["module_paths_scope"], paths)
        truth = layers.site_membership(list(with_record.loc[key, "module_paths"]),
                                       with_record.loc[key, "module_paths_scope"], paths)
        assert mine is None or mine == truth, (key, row["kernel"], list(row["module_paths"]), mine, truth)
        if mine is not None:
            answered.append((row["kernel"], mine[1]))
    gemms = [layer for kernel, layer in answered if kernel == "extern_kernels.addmm"]
    assert gemms == [None, "blocks.0", "blocks.0", "blocks.1", "blocks.1", None]
    assert sorted(layer for kernel, layer in answered if "tanh" in kernel and "layer_norm" not in kernel) == \
        ["blocks.0", "blocks.1"]


def test_opprof_attribute_gives_compiled_kernels_their_module(captured, tmp_path):
    """The command as docs/cli.md shows it, on the imported copy: kernels get the module the evidence fixes
    (checked against the literals of their C++ source, and the GEMMs against the model's call order); the others
    say `unknown`, with no module."""
    folder, _, imported, _ = captured
    for args in (("timeline", "--kineto", folder / "trace.json", "--out", tmp_path / "tl"),
                 ("attribute", "--timeline", tmp_path / "tl", "--inductor-dir", imported, "--out",
                  tmp_path / "attribution.parquet")):
        done = run_opprof(*args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    attribution = pd.read_parquet(tmp_path / "attribution.parquet")
    kernels = pd.read_parquet(tmp_path / "tl" / "kernels.parquet")
    attribution = attribution.merge(kernels[["kernel_id", "parent_kernel_id", "start_ns"]], on="kernel_id")
    code = {}
    for graph in inductor.find_graph_dirs(imported):
        text = (graph / "output_code.py").read_text()
        starts = list(re.finditer(r"^(cpp_fused_\w+) = async_compile\.", text, re.M))
        code.update({m.group(1): text[m.start():(starts[i + 1].start() if i + 1 < len(starts) else len(text))]
                     for i, m in enumerate(starts)})
    generated = attribution[attribution["name"].str.match(r"^graph_\d+_cpp_fused_")]
    placed = 0
    for row in generated.itertuples(index=False):
        marks = {MARKERS[lit] for lit in _LITERAL_RE.findall(code[re.sub(r"^graph_\d+_", "", row.name)])
                 if lit in MARKERS}
        if row.membership == "fx_nodes":
            assert marks <= {row.module} and row.module == row.layer, (row.name, marks, row.module)
            placed += 1
        else:
            assert row.membership == "unknown" and pd.isna(row.module), (row.name, row.membership, row.module)
    assert placed == 4  # the tanh*k kernel of each block, in each of the two profiled iterations
    top = attribution[attribution["parent_kernel_id"].isna() & (attribution["name"] == "aten::addmm")]
    for _, rows in top.groupby("iteration"):
        modules = rows.sort_values("start_ns")["module"].tolist()
        assert [None if pd.isna(m) else m for m in modules] == [None, "blocks.0", "blocks.0", "blocks.1",
                                                                "blocks.1", None]
    assert set(attribution.loc[attribution["module"].isna(), "membership"]) <= {"unknown", "outside_layers"}
    # the documented classify step with an empty layers.json takes the same layer instances (and says so)
    (tmp_path / "layers.json").write_text("[]")
    for args in (("fusion-map", "--inductor-dir", imported, "--out", tmp_path / "fusion_map.parquet"),
                 ("classify", "--timeline", tmp_path / "tl", "--layers", tmp_path / "layers.json", "--fusion-map",
                  tmp_path / "fusion_map.parquet", "--out", tmp_path / "layers")):
        done = run_opprof(*args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    assert "names no layer: using the 2 layer instances" in done.stderr
    kl = pd.read_parquet(tmp_path / "layers" / "kernel_layers.parquet").set_index("kernel_id")
    mine = attribution.set_index("kernel_id")
    assert kl["module"].reindex(mine.index).fillna("-").tolist() == mine["module"].fillna("-").tolist()
    assert kl["membership"].reindex(mine.index).tolist() == mine["membership"].tolist()


def test_a_debug_dir_without_its_torch_trace_log_gets_no_module_paths(captured, tmp_path):
    """Without the TORCH_TRACE log nothing says a node's module: the fusion map has no paths (and no layers)."""
    _, _, imported, _ = captured
    bare = tmp_path / "bare"
    shutil.copytree(imported, bare, ignore=shutil.ignore_patterns("dedicated_log_torch_trace_*.log"))
    fusion = inductor.load_fusion_map(bare)
    assert fusion["module_paths"].map(len).eq(0).all() and fusion["module_paths_scope"].isna().all()
    assert fusion.attrs["layers"] == []


def test_an_inductor_dir_that_does_not_exist_is_named_as_such(captured, tmp_path):
    """A mistyped --inductor-dir said "no Inductor debug directory (no output_code.py) found", as for a folder
    without compiled graphs (a QA user's finding): it now says the folder does not exist, in one line, exit 1."""
    folder = captured[0]
    assert run_opprof("timeline", "--kineto", folder / "trace.json", "--out", tmp_path / "tl",
                      cwd=tmp_path).returncode == 0
    done = run_opprof("attribute", "--timeline", tmp_path / "tl", "--inductor-dir", tmp_path / "no_such_dir",
                      "--out", tmp_path / "attribution.parquet", cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"{tmp_path / 'no_such_dir'}: no such folder" in done.stderr
    assert not (tmp_path / "attribution.parquet").exists()
