"""``compile: true`` compiles the whole model, and compiled kernels get their layer from the FX
nodes they were generated from (real torch.compile on the CPU, real Inductor debug dirs).

One module-scoped run of a small model, in train mode (forward and backward graphs), compiled whole by the
pipeline's own stages. The model makes every kernel's layer checkable without the code under test: each block
multiplies by its own constant and has its own LayerNorm eps, and the code before the blocks multiplies by 11, so
the literals in a generated kernel's C++ source (``static_cast<float>(3.0)``) say which modules' FX nodes it
computes. The GEMMs (``aten::addmm``/``aten::mm``, no generated source) are checked against the model's call order.
"""

from __future__ import annotations

import json
import re
import shutil
import textwrap

import pandas as pd
import pytest
from conftest import importable_module, torch_flags_kept

from operator_profiler import layers, stages, tables
from operator_profiler.attribution import inductor
from operator_profiler.capture import harness
from operator_profiler.capture import jobs as capture
from operator_profiler.errors import WorkloadError
from operator_profiler.naming import LAYER_PREFIX, MODEL_RANGE, MODULE_PATHS_JSON
from operator_profiler.results import ReportPaths

MODELS = '''
import torch
import torch.nn as nn

BLOCKS = ((3.0, 0.001), (5.0, 0.002))  # (residual scale, LayerNorm eps) of blocks.0, blocks.1
OUTSIDE = 11.0                          # the scale of the code before the blocks


class Blk(nn.Module):
    def __init__(self, d, k, eps):
        super().__init__()
        self.norm = nn.LayerNorm(d, eps=eps)
        self.lin = nn.Linear(d, d)
        self.k = k

    def forward(self, x):
        # a constant mask, the same in every block: the train graph computes it once (common subexpressions
        # merged), so blocks.1's kernel reads nodes that Dynamo recorded under blocks.0
        keep = torch.ones(x.shape, dtype=torch.bool, device=x.device).tril()
        return x + self.k * torch.tanh(self.lin(self.norm(x))).masked_fill(~keep, 0.0)


class Net(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.blocks = nn.ModuleList([Blk(d, k, eps) for k, eps in BLOCKS])
        self.out = nn.Linear(d, d)

    def forward(self, x):
        x = self.inp(x) * OUTSIDE
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def compiled_net():  # what users often return: torch.compile(model)
    torch.manual_seed(0)
    return torch.compile(Net()), (torch.randn(4, 8),)


def net_with_compiled_block():
    model = Net()
    model.blocks[1].forward = torch.compile(model.blocks[1].forward)
    return model, (torch.randn(4, 8),)


@torch.compile(backend="eager")  # compiles a graph without Inductor (fast)
def _scaled(x):
    return x * 2


class CompilesInside(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return _scaled(self.lin(x))


def compiles_inside():
    return CompilesInside(), (torch.randn(4, 8),)
'''

# literal in generated C++ -> the layer instance (or outside every layer) whose FX nodes computed it
MARKERS = {"3.0": "blocks.0", "0.001": "blocks.0", "5.0": "blocks.1", "0.002": "blocks.1",
           "11.0": layers.OUTSIDE_LAYERS}
_LITERAL_RE = re.compile(r"static_cast<float>\(([0-9.e+-]+)\)")
WORKLOAD = {"kind": "custom", "factory": "wmc_models:compiled_net", "kwargs": {}, "compile": True, "mode": "train"}
ITERATIONS = 2


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    with importable_module(tmp_path_factory.mktemp("wmc_models"), "wmc_models", textwrap.dedent(MODELS)) as root:
        yield root


@pytest.fixture
def keep_settings():
    with torch_flags_kept():
        yield


@pytest.fixture(scope="module")
def run(models, tmp_path_factory):
    """The capture (with the Inductor debug output of its own compile) + the analysis stages, as the workflow runs
    them (one process here)."""
    out = tmp_path_factory.mktemp("wmc")
    with torch_flags_kept():
        capture.capture_timeline("wmc", WORKLOAD, {"seed": 0, "warmup": 1, "iterations": ITERATIONS}, "cpu", "torch",
                                 out / "trace.json.gz", out / "run.json", out / "layers.json", out / "clocks.json",
                                 out_debug=out / "inductor")
    stages.build_fusion_map(out / "inductor", out / "fusion_map.parquet")
    stages.export_timeline(out / "trace.json.gz", out / "timeline")
    stages.classify(out / "timeline", out / "layers.json", out / "instances.parquet", out / "kernel_layers.parquet",
                    out / "classes.json", out / "classes", fusion_map=out / "fusion_map.parquet")
    stages.attribute_files(out / "timeline", out / "kernel_layers.parquet", out / "fusion_map.parquet",
                           out / "attribution.parquet")
    stages.aggregate_files(out / "attribution.parquet", out / "instances.parquet", out / "classes.json",
                           {"per_iteration": True, "device": "cpu"}, out / "operators.parquet", out / "operators.csv",
                           out / "modules.parquet", out / "layer_classes.parquet", out / "coverage.json")
    stages.report_files("wmc", ReportPaths(out / "coverage.json", out / "operators.parquet", out / "modules.parquet",
                                           out / "layer_classes.parquet", run=out / "run.json"),
                        {"top_operators": 20}, out / "report.md")
    return out


def _kernel_code(graph_dir) -> dict[str, str]:
    """Generated kernel name -> its C++ source (the ``async_compile.cpp_pybinding(...)`` definition)."""
    text = (graph_dir / "output_code.py").read_text()
    starts = list(re.finditer(r"^(cpp_fused_\w+) = async_compile\.", text, re.M))
    return {m.group(1): text[m.start():(starts[i + 1].start() if i + 1 < len(starts) else len(text))]
            for i, m in enumerate(starts)}


def _attributed(run) -> pd.DataFrame:
    attribution = tables.read_table(run / "attribution.parquet")
    attribution["layer"] = attribution["layer"].astype(object).where(attribution["layer"].notna(), None)
    kernels = tables.read_table(run / "timeline" / "kernels.parquet")
    return attribution.merge(kernels[["kernel_id", "parent_kernel_id", "start_ns"]], on="kernel_id")


def test_whole_model_is_compiled_and_the_run_says_so(run):
    recorded = json.loads((run / "run.json").read_text())
    assert recorded["compile_scope"] == "model" and recorded["compile_mode"] == "default"
    assert recorded["layer_ranges"] is False
    # the factory returned torch.compile(Net()): unwrapped, compiled as the config says, and said so
    assert len(recorded["compile_notes"]) == 1 and "torch.compile(model)" in recorded["compile_notes"][0]
    names = pd.read_parquet(run / "timeline" / "ranges.parquet")["name"]
    assert not names.str.startswith(LAYER_PREFIX).any()  # no layer hook breaks the user's graph
    assert (names == MODEL_RANGE).sum() == ITERATIONS
    graphs = inductor.find_graph_dirs(run / "inductor")
    # one Dynamo frame: one forward and one backward graph (a layer range would have broken the graph)
    assert sorted(inductor.graph_kind(g.name) for g in graphs) == ["backward", "forward"]
    for graph in graphs:
        record = json.loads((graph / MODULE_PATHS_JSON).read_text())
        assert record["scope"] == "model" and record["frame_module"] == ""
    report = (run / "report.md").read_text()
    assert "compile scope **model**" in report and "torch.compile(model)" in report


def test_no_generated_kernel_is_given_to_a_layer_whose_code_it_does_not_hold_alone(run):
    code = {name: src for g in inductor.find_graph_dirs(run / "inductor") for name, src in _kernel_code(g).items()}
    attributed = _attributed(run)
    generated = attributed[attributed["name"].str.match(r"^graph_\d+_cpp_fused_")]
    assert len(generated) > 0
    spans_seen = []
    for row in generated.itertuples(index=False):
        kernel = re.sub(r"^graph_\d+_", "", row.name)
        marks = {MARKERS[lit] for lit in _LITERAL_RE.findall(code[kernel]) if lit in MARKERS}
        if row.membership == "fx_nodes":
            assert marks <= {row.layer}, (row.name, marks, row.layer)
        elif row.membership == "outside_layers":
            assert marks <= {layers.OUTSIDE_LAYERS}, (row.name, marks)
        else:
            assert row.membership == "cross_layer" and pd.isna(row.layer), (row.name, row.membership)
            assert marks <= set(row.layers_spanned) and len(row.layers_spanned) >= 2, (row.name, marks)
        if len(marks) > 1:
            spans_seen.append(row.name)
            assert row.membership == "cross_layer"  # code of two modules: never one layer's
    assert spans_seen  # the model does fuse across layer boundaries (forward and backward)
    assert any("backward" in name for name in spans_seen)


def test_a_constant_shared_by_the_blocks_does_not_make_their_kernels_cross_layer(run):
    """A value that depends on no input (the mask's fill value, the mask itself) is one set of FX nodes
    once the graph's common subexpressions are merged, recorded under blocks.0, so blocks.1's masked_fill kernel
    read blocks.0's nodes and was called cross-layer. Such nodes no longer count toward membership."""
    graph = next(g for g in inductor.find_graph_dirs(run / "inductor") if inductor.graph_kind(g.name) == "forward")
    shared = [n for n, path in json.loads((graph / MODULE_PATHS_JSON).read_text())["post_grad"].items()
              if path == "blocks.0" and n.startswith("full_default")]
    fusion = pd.read_parquet(run / "fusion_map.parquet")
    forward = fusion[fusion["graph"] == graph.name]
    # the case: a kernel of blocks.1's code (the oracle: its literals) computing a node recorded under blocks.0
    code = _kernel_code(graph)
    case = [r.profiler_name for r in forward.itertuples()
            if set(r.post_grad_nodes) & set(shared) and r.kind == "cpp"
            and {MARKERS[lit] for lit in _LITERAL_RE.findall(code[r.kernel]) if lit in MARKERS} == {"blocks.1"}]
    assert case, "the model no longer shares a constant between the blocks"
    attributed = _attributed(run)
    for name in case:
        rows = attributed[attributed["name"] == name]
        assert len(rows) == ITERATIONS and set(rows["membership"]) == {"fx_nodes"}, name
        assert set(rows["layer"]) == {"blocks.1"}, name


def test_gemms_belong_to_the_linear_they_run(run):
    attributed = _attributed(run)
    top = attributed[attributed["parent_kernel_id"].isna() & attributed["name"].isin(["aten::addmm", "aten::mm"])]
    for iteration, rows in top.groupby("iteration"):
        forward = rows[rows["forward_operator"].isna()].sort_values("start_ns")
        backward = rows[rows["forward_operator"].notna()].sort_values("start_ns")
        # forward: inp, blocks.0.lin, blocks.1.lin, out; backward in reverse, two GEMMs per Linear (input and
        # weight gradient) except inp, whose input needs no gradient
        assert forward["layer"].tolist() == [None, "blocks.0", "blocks.1", None]
        assert backward["layer"].tolist() == [None, None, "blocks.1", "blocks.1", "blocks.0", "blocks.0", None]
        assert set(rows.loc[rows["layer"].isna(), "membership"]) == {"outside_layers"}


def test_every_layer_instance_has_kernels_and_coverage_is_complete(run):
    found = [entry["path"] for entry in json.loads((run / "layers.json").read_text())]
    assert found == ["blocks.0", "blocks.1"]
    instances = pd.read_parquet(run / "instances.parquet")
    for iteration in range(ITERATIONS):
        mine = instances[instances["iteration"] == iteration].set_index("layer")["kernel_count"]
        assert all(mine.get(path, 0) > 0 for path in found)
    coverage = json.loads((run / "coverage.json").read_text())
    assert coverage["coverage_time"] >= 0.99
    attribution = tables.read_table(run / "attribution.parquet")
    # the harness's loss and its backward run outside the model range: outside the layers, not unknown
    assert not (attribution["membership"] == "unknown").any()
    by = coverage["layer_membership"]["by_membership"]
    assert sum(v["kernels"] for v in by.values()) == len(attribution)
    cross = attribution[attribution["membership"] == "cross_layer"]
    listed = coverage["layer_membership"]["cross_layer"]
    assert sum(c["count"] for c in listed) == len(cross) > 0
    modules = pd.read_parquet(run / "modules.parquet").set_index("module")
    assert modules.loc["(cross-layer)", "kernels"] == len(cross)
    report = (run / "report.md").read_text()
    assert "**cross-layer**" in report and all(f"`{c['name'][:40]}" in report for c in listed[:3])


def test_layer_classes_come_from_the_fx_membership(run):
    kl = pd.read_parquet(run / "kernel_layers.parquet")
    classes = json.loads((run / "classes.json").read_text())
    named = kl[kl["layer"].notna()]
    assert set(named["membership"]) <= {"fx_nodes"}
    assert (kl.loc[kl["layer"].isna(), "layer_class"] == layers.REST_CLASS).all()
    # each instance's signature is its first-iteration kernels in launch order
    kernels = tables.read_table(run / "timeline" / "kernels.parquet")
    first = named.merge(kernels[["kernel_id", "iteration", "match_key"]], on="kernel_id")
    first = first[first["iteration"] == first["iteration"].min()]
    for entry in (c for n, c in classes.items() if n != layers.REST_CLASS):
        for instance in entry["instances"]:
            ids = first[first["layer"] == instance].sort_values("kernel_id")
            assert [s[0] for s in entry["signature"]] == ids["match_key"].tolist()


def test_an_nsys_timeline_takes_the_membership_of_the_torch_profiler_run(run, tmp_path):
    """The classify stage on an nsys timeline carries each kernel's membership over from the torch.profiler run
    of the same program (paired by invocation order). The nsys table here is the real Kineto table relabelled
    ``source: nsys`` (no GPU on this machine), so every kernel pairs with itself."""
    shutil.copytree(run / "timeline", tmp_path / "nsys")
    kernels = tables.read_table(tmp_path / "nsys" / "kernels.parquet").assign(source="nsys")
    tables.write_table(kernels, tables.KERNELS, tmp_path / "nsys" / "kernels.parquet")
    stages.classify(tmp_path / "nsys", run / "layers.json", tmp_path / "i.parquet", tmp_path / "kl.parquet",
                    tmp_path / "c.json", tmp_path / "c", fusion_map=run / "fusion_map.parquet",
                    kineto_timeline=run / "timeline")
    carried = pd.read_parquet(tmp_path / "kl.parquet").set_index("kernel_id")
    original = pd.read_parquet(run / "kernel_layers.parquet").set_index("kernel_id")
    for column in ("layer", "membership", "layer_class"):
        assert carried[column].equals(original[column]), column


def test_fusion_map_module_paths_and_a_broken_record(run, tmp_path):
    fusion = pd.read_parquet(run / "fusion_map.parquet")
    assert (fusion["module_paths_scope"] == "model").all() and fusion["module_paths"].map(len).gt(0).all()
    graph = next(g for g in inductor.find_graph_dirs(run / "inductor") if inductor.graph_kind(g.name) == "forward")
    broken = tmp_path / graph.name
    shutil.copytree(graph, broken)
    (broken / MODULE_PATHS_JSON).write_text("{not json")
    with pytest.raises(inductor.InductorArtifactError, match="unreadable"):
        inductor.parse_output_code(broken)
    (broken / MODULE_PATHS_JSON).unlink()
    without = inductor.parse_output_code(broken)  # a debug dir of another tool: no paths, no layer claims
    assert without["module_paths"].map(len).eq(0).all() and without["module_paths_scope"].isna().all()


# --- refusals and options (no Inductor compile) ----------------------------------------------------------------


def _capture(workload, tmp_path):
    return harness.run_capture(workload, {"seed": 0, "warmup": 1, "iterations": 1}, "cpu", None,
                               tmp_path / "layers.json", tmp_path / "run.json", profiler="none", workload_name="mine")


def test_an_already_compiled_model_under_compile_false_is_refused(models, tmp_path, keep_settings):
    with pytest.raises(WorkloadError, match=r"already compiled model \(the model is torch\.compile.*set compile: true"):
        _capture({**WORKLOAD, "compile": False, "mode": "inference"}, tmp_path)
    with pytest.raises(WorkloadError, match=r"the forward of module 'blocks\.1' is torch\.compile'd.*return it uncompiled"):
        _capture({**WORKLOAD, "factory": "wmc_models:net_with_compiled_block", "mode": "inference"}, tmp_path)
    assert not (tmp_path / "run.json").exists()


def test_a_model_that_compiles_inside_under_compile_false_is_refused(models, tmp_path, keep_settings):
    workload = {"kind": "custom", "factory": "wmc_models:compiles_inside", "kwargs": {}, "compile": False}
    with pytest.raises(WorkloadError, match=r"compile: false, but torch\.compile compiled 1 graph"):
        _capture(workload, tmp_path)
    assert not (tmp_path / "run.json").exists()


def test_compile_mode_and_options():
    assert harness.compile_kwargs({}) == {"mode": "default"}
    assert harness.compile_kwargs({"compile_mode": "max-autotune"}) == {"mode": "max-autotune"}
    assert harness.compile_kwargs({"compile_options": {"max_autotune": True}}) == {"options": {"max_autotune": True}}
    with pytest.raises(WorkloadError, match="cannot both be set"):
        harness.compile_kwargs({"compile_mode": "max-autotune", "compile_options": {"max_autotune": True}})
    with pytest.raises(WorkloadError, match="'no_such_option' not known to torch._inductor"):
        harness.compile_kwargs({"compile_options": {"no_such_option": 1}})


def test_module_paths_name_layer_instances():
    paths = {"blocks.0", "blocks.1", "experts.0"}
    assert layers.layer_of_module("blocks.1.lin", paths) == "blocks.1"
    assert layers.layer_of_module("blocks.0#1.lin#1", paths) == "blocks.0#1"  # the module's second call
    assert layers.layer_of_module("experts.0.up", paths) == "experts.0"
    assert layers.layer_of_module("", paths) is None and layers.layer_of_module("inp", paths) is None
    assert layers.site_membership(["blocks.0.norm", "blocks.0.lin"], "model", paths) == ("fx_nodes", "blocks.0", [])
    assert layers.site_membership(["inp", "blocks.0.norm"], "model", paths) == (
        "cross_layer", None, [layers.OUTSIDE_LAYERS, "blocks.0"])
    assert layers.site_membership(["", "out"], "model", paths) == ("outside_layers", None, [])
    assert layers.site_membership(["lin"], "frame", paths) is None  # relative paths of a regional graph
    assert layers.site_membership([], "model", paths) is None
