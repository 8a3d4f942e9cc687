"""Tests for the built-in workloads, the custom-factory loader, layer discovery (operator_profiler.capture.workloads)
and one real capture through the harness (operator_profiler.capture.harness) on a tiny eager GPT-2.

Expected parameter shapes follow from nn.Linear / nn.LayerNorm semantics and the configured sizes; the capture
is checked with the Kineto reader and the layer classification downstream.
"""

from __future__ import annotations

import gzip
import json
import textwrap

import pytest
import torch
import torch.nn as nn
from conftest import torch_flags_kept

from operator_profiler.capture import harness
from operator_profiler.capture.workloads import WorkloadError, build_workload, find_layers
from operator_profiler.layers import REST_CLASS, classify_layers
from operator_profiler.timeline.kineto import read_kineto

CPU = torch.device("cpu")
GPT2_TINY = {"kind": "gpt2", "vocab_size": 32, "n_positions": 8, "n_embd": 16, "n_layer": 3, "n_head": 2,
             "batch_size": 1, "seq_len": 8}


def _block_shapes(n_embd: int) -> dict[str, list[int]]:
    """GPT-2 block parameters: Linear(in, out).weight is [out, in]."""
    e = n_embd
    return {
        "ln_1.weight": [e], "ln_1.bias": [e],
        "attn.c_attn.weight": [3 * e, e], "attn.c_attn.bias": [3 * e],
        "attn.c_proj.weight": [e, e], "attn.c_proj.bias": [e],
        "ln_2.weight": [e], "ln_2.bias": [e],
        "mlp.c_fc.weight": [4 * e, e], "mlp.c_fc.bias": [4 * e],
        "mlp.c_proj.weight": [e, 4 * e], "mlp.c_proj.bias": [e],
    }


# ------------------------------------------------------------------------------------- layers


def test_gpt2_layers_are_the_blocks():
    model, (idx,) = build_workload(GPT2_TINY, CPU)
    layers = find_layers(model)
    assert [l.path for l in layers] == ["transformer.h.0", "transformer.h.1", "transformer.h.2"]
    assert {l.cls for l in layers} == {"Block"}
    assert all(l.param_shapes == _block_shapes(16) for l in layers)
    assert tuple(idx.shape) == (1, 8) and idx.dtype == torch.long and int(idx.max()) < 32
    assert tuple(model(idx).shape) == (1, 8, 32)


def test_sdpa_layers_are_the_blocks():
    cfg = {"kind": "sdpa_attention", "d_model": 16, "n_head": 2, "n_block": 2, "causal": True, "batch_size": 1,
           "seq_len": 4}
    model, (x,) = build_workload(cfg, CPU)
    layers = find_layers(model)
    assert [(l.path, l.cls) for l in layers] == [("blocks.0", "SDPABlock"), ("blocks.1", "SDPABlock")]
    assert layers[0].param_shapes["qkv.weight"] == [48, 16]
    assert tuple(model(x).shape) == (1, 4, 16)


def test_lstm_has_no_layers():
    cfg = {"kind": "lstm", "input_size": 4, "hidden_size": 8, "num_layers": 2, "batch_size": 1, "seq_len": 3}
    model, (x,) = build_workload(cfg, CPU)
    assert find_layers(model) == []
    assert tuple(model(x).shape) == (1, 3, 4)


# ---------------------------------------------------------------------------- case-study kinds
# Tiny sizes, all different from each other, so a size read from the wrong key shows in the shapes.

CONV_TINY = {"kind": "conv_block", "in_channels": 3, "channels": 5, "n_block": 3, "image_size": 7, "batch_size": 2}
EMBED_TINY = {"kind": "embedding_projection", "vocab_size": 23, "d_model": 6, "n_block": 2, "out_features": 5,
              "batch_size": 2, "seq_len": 4}
MLP_TINY = {"kind": "mlp", "width": 6, "expansion": 3, "n_block": 3, "batch_size": 2, "seq_len": 4}
DW_TINY = {"kind": "depthwise_separable", "channels": 5, "n_block": 2, "image_size": 7, "batch_size": 3}
CASE_STUDY_TINY = (CONV_TINY, EMBED_TINY, MLP_TINY, DW_TINY)


def _case_study_expectations(cfg: dict) -> tuple[dict, int, tuple, tuple]:
    """(one block's parameter shapes, total parameter count, input shape, output shape) of a case-study kind,
    from nn.Conv2d/BatchNorm2d/Linear/Embedding semantics: Conv2d weight [out, in / groups, k, k] (no bias: the
    BatchNorm's shift replaces it), BatchNorm2d weight and bias [C], Linear weight [out, in] and bias [out]."""
    b = cfg.get("batch_size")
    if cfg["kind"] == "conv_block":
        cin, c, n, s = cfg["in_channels"], cfg["channels"], cfg["n_block"], cfg["image_size"]
        block = {"conv.weight": [c, c, 3, 3], "bn.weight": [c], "bn.bias": [c]}
        stem = cin * c * 9 + 2 * c
        return block, stem + n * (c * c * 9 + 2 * c), (b, cin, s, s), (b, c, s, s)
    if cfg["kind"] == "embedding_projection":
        v, d, n, o, t = cfg["vocab_size"], cfg["d_model"], cfg["n_block"], cfg["out_features"], cfg["seq_len"]
        block = {"linear.weight": [d, d], "linear.bias": [d]}
        return block, v * d + n * (d * d + d) + d * o + o, (b, t), (b, t, o)
    if cfg["kind"] == "mlp":
        w, h, n, t = cfg["width"], cfg["expansion"] * cfg["width"], cfg["n_block"], cfg["seq_len"]
        block = {"fc1.weight": [h, w], "fc1.bias": [h], "fc2.weight": [w, h], "fc2.bias": [w]}
        return block, n * (w * h + h + h * w + w), (b, t, w), (b, t, w)
    if cfg["kind"] == "depthwise_separable":
        c, n, s = cfg["channels"], cfg["n_block"], cfg["image_size"]
        block = {"depthwise.weight": [c, 1, 3, 3], "bn1.weight": [c], "bn1.bias": [c],
                 "pointwise.weight": [c, c, 1, 1], "bn2.weight": [c], "bn2.bias": [c]}
        return block, n * (c * 9 + 2 * c + c * c + 2 * c), (b, c, s, s), (b, c, s, s)
    raise AssertionError(cfg["kind"])


@pytest.mark.parametrize("cfg", CASE_STUDY_TINY, ids=lambda c: c["kind"])
def test_case_study_kind_builds_the_configured_sizes(cfg):
    model, inputs = build_workload(cfg, CPU)
    block, n_params, in_shape, out_shape = _case_study_expectations(cfg)
    assert sum(p.numel() for p in model.parameters()) == n_params
    assert len(inputs) == 1 and tuple(inputs[0].shape) == in_shape
    if cfg["kind"] == "embedding_projection":  # token ids in [0, vocab_size)
        assert inputs[0].dtype == torch.long and 0 <= int(inputs[0].min()) and int(inputs[0].max()) < cfg["vocab_size"]
    else:
        assert inputs[0].dtype == torch.float32
    # The n_block blocks are the layers, one class (same module class, same parameter shapes); a conv_block's
    # stem (in_channels -> channels) is outside the list, so it is no layer even when in_channels == channels.
    layers = find_layers(model)
    assert [l.path for l in layers] == [f"blocks.{i}" for i in range(cfg["n_block"])]
    assert len({l.cls for l in layers}) == 1 and all(l.param_shapes == block for l in layers)
    model.eval()
    with torch.no_grad():
        out = model(*inputs)
    assert tuple(out.shape) == out_shape and bool(torch.isfinite(out).all())


def test_conv_block_stem_is_no_layer_even_with_equal_channels():
    model, _ = build_workload(dict(CONV_TINY, in_channels=5), CPU)
    assert [l.path for l in find_layers(model)] == ["blocks.0", "blocks.1", "blocks.2"]


@pytest.mark.parametrize("cfg", CASE_STUDY_TINY, ids=lambda c: c["kind"])
def test_case_study_kind_trains(cfg):
    """mode: train's step on each kind: the default loss of its output reaches every parameter."""
    from operator_profiler.capture.training import default_loss

    model, inputs = build_workload(cfg, CPU)
    model.train()
    default_loss(model(*inputs)).backward()
    assert all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in model.parameters())


class _CaseStudies(nn.Module):
    """The four case-study models side by side: one torch.compile (one Inductor C++ build) checks them all (a
    compile costs seconds on 2 cores, mostly the C++ compiler)."""

    def __init__(self, models):
        super().__init__()
        self.models = nn.ModuleList(models)

    def forward(self, *inputs):
        return tuple(m(x) for m, x in zip(self.models, inputs))


# Inductor's own code calls torch.jit.script_method while it compiles (torch's warning, not the models').
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_case_study_kinds_compile_whole_and_agree_with_eager():
    """torch.compile (Inductor) of each case-study model traces as one graph (fullgraph: a graph break raises) and
    its forward matches eager's within float32 rounding."""
    torch.manual_seed(0)
    built = [build_workload(cfg, CPU) for cfg in CASE_STUDY_TINY]
    model = _CaseStudies([m.eval() for m, _ in built])
    inputs = tuple(x for _, (x,) in built)
    torch._dynamo.reset()
    with torch.no_grad():
        eager = model(*inputs)
        compiled = torch.compile(model, fullgraph=True)(*inputs)
    torch._dynamo.reset()
    for cfg, e, c in zip(CASE_STUDY_TINY, eager, compiled):
        assert e.shape == c.shape, cfg["kind"]
        torch.testing.assert_close(c, e, rtol=1e-4, atol=1e-5, msg=lambda m, k=cfg["kind"]: f"{k}: {m}")


def test_find_layers_rules():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            # two same-shape Linear + one odd one out + parameter-free repeats
            self.seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
            self.single = nn.ModuleList([nn.Linear(2, 2)])
            self.outer = nn.ModuleList([nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)) for _ in range(2)])

    layers = find_layers(Net())
    # The outer container wins over the repeats nested in its children; ReLU (no parameters) and the
    # unique Linear(4, 2) are no layers; a one-element list is no repeat.
    assert [(l.path, l.cls) for l in layers] == [("seq.0", "Linear"), ("seq.2", "Linear"),
                                                 ("outer.0", "Sequential"), ("outer.1", "Sequential")]


def test_gpt2_size_errors():
    with pytest.raises(WorkloadError, match="n_head"):
        build_workload(dict(GPT2_TINY, n_embd=15), CPU)
    with pytest.raises(WorkloadError, match="n_positions"):
        build_workload(dict(GPT2_TINY, seq_len=9), CPU)


def test_unknown_kind():
    with pytest.raises(WorkloadError, match="resnet"):
        build_workload({"kind": "resnet"}, CPU)


# ----------------------------------------------------------------------------- custom factories


@pytest.fixture
def factories(tmp_path, monkeypatch):
    mod = "opprof_test_factories_mod"
    (tmp_path / f"{mod}.py").write_text(textwrap.dedent("""
        import torch
        import torch.nn as nn

        def good(width=3):
            return nn.Linear(width, 2), torch.zeros(1, width)

        def raises(**kw):
            raise RuntimeError("boom from the factory")

        def wrong_type():
            return [nn.Linear(2, 2), (torch.zeros(1, 2),)]

        def no_module():
            return "model", (torch.zeros(1),)

        NOT_CALLABLE = 3
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return mod


def test_custom_factory_ok(factories):
    model, inputs = build_workload({"kind": "custom", "factory": f"{factories}:good", "kwargs": {"width": 5}}, CPU)
    assert isinstance(model, nn.Linear) and model.in_features == 5
    assert isinstance(inputs, tuple) and tuple(inputs[0].shape) == (1, 5)


@pytest.mark.parametrize(
    "spec, words",
    [
        ("nomodule_opprof_xyz:fn", ["cannot import", "nomodule_opprof_xyz"]),
        ("os:nonexistent", ["no callable", "nonexistent"]),
        ("no_colon_here", ["package.module:function"]),
        (":fn", ["package.module:function"]),
        ("{mod}:NOT_CALLABLE", ["no callable"]),
        ("{mod}:raises", ["RuntimeError", "boom from the factory"]),
        ("{mod}:wrong_type", ["must return", "list"]),
        ("{mod}:no_module", ["must return", "tuple"]),
    ],
)
def test_custom_factory_errors_name_the_spec(factories, spec, words):
    spec = spec.format(mod=factories)
    with pytest.raises(WorkloadError) as err:
        build_workload({"kind": "custom", "factory": spec, "kwargs": {}}, CPU)
    msg = str(err.value)
    assert repr(spec) in msg
    for w in words:
        assert w in msg


# ---------------------------------------------------------------------------------- the harness


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    """One real torch.profiler capture of a tiny eager GPT-2 (2 blocks, 1 warm-up, 2 measured iterations)."""
    out = tmp_path_factory.mktemp("capture")
    workload = dict(GPT2_TINY, n_layer=2, compile=False, mode="inference")
    with torch_flags_kept():  # run_capture sets process-wide torch flags; keep other tests unaffected
        run = harness.run_capture(workload, {"seed": 0, "warmup": 1, "iterations": 2}, "cpu",
                                  out / "trace.json.gz", out / "layers.json", out / "run.json")
    return out, workload, run


def test_capture_writes_a_gzipped_kineto_trace(capture):
    out, _, _ = capture
    trace = out / "trace.json.gz"
    assert trace.is_file()
    with gzip.open(trace, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    names = [e.get("name") for e in events if e.get("ph") == "X"]
    assert names.count("opprof.iteration:0") == 1 and names.count("opprof.iteration:1") == 1
    assert names.count("opprof.layer:transformer.h.0") == 2 and names.count("opprof.layer:transformer.h.1") == 2
    assert not list(out.glob("*.tmp.json"))  # the uncompressed export is removed


def test_capture_ranges_nest_layers_in_iterations(capture):
    out, _, _ = capture
    t = read_kineto(out / "trace.json.gz")
    r = t.ranges
    its = r[r["iteration"].notna()].sort_values("start_ns")
    assert list(its["name"]) == ["opprof.iteration:0", "opprof.iteration:1"]
    assert list(its["iteration"].astype(int)) == [0, 1]
    layer_ranges = r[r["layer"].notna()]
    for it in its.itertuples(index=False):
        inside = layer_ranges[(layer_ranges["start_ns"] >= it.start_ns) & (layer_ranges["end_ns"] <= it.end_ns)]
        assert sorted(inside["name"]) == ["opprof.layer:transformer.h.0", "opprof.layer:transformer.h.1"]
        assert sorted(inside["layer"]) == ["transformer.h.0", "transformer.h.1"]
    # Every kernel of the capture belongs to a measured iteration, half in each.
    counts = t.kernels["iteration"].value_counts(dropna=False)
    assert set(counts.index) == {0, 1} and counts[0] == counts[1] > 0


def test_capture_classifies_one_block_class(capture):
    out, _, _ = capture
    t = read_kineto(out / "trace.json.gz")
    layers = json.loads((out / "layers.json").read_text())
    kl, instances, classes = classify_layers(t.kernels, t.ranges, layers)
    blocks = [c for n, c in classes.items() if n != REST_CLASS]
    assert len(blocks) == 1
    assert blocks[0]["module_class"] == "Block"
    assert blocks[0]["instances"] == ["transformer.h.0", "transformer.h.1"]
    assert blocks[0]["representative"] == "transformer.h.0"
    # Both blocks run the same kernels in both iterations.
    per = kl[kl["layer"].notna()].merge(t.kernels[["kernel_id", "name", "iteration"]], on="kernel_id")
    seqs = {key: list(g["name"]) for key, g in per.groupby(["layer", "iteration"])}
    assert len(seqs) == 4 and len({tuple(s) for s in seqs.values()}) == 1
    assert blocks[0]["kernel_count"] == len(next(iter(seqs.values())))
    assert {"aten::linear", "aten::layer_norm", "aten::gelu"} <= set(next(iter(seqs.values())))  # outermost calls


def test_capture_layers_json(capture):
    out, workload, _ = capture
    layers = json.loads((out / "layers.json").read_text())
    assert [l["path"] for l in layers] == ["transformer.h.0", "transformer.h.1"]
    assert all(l["class"] == "Block" for l in layers)
    assert all(l["param_shapes"] == _block_shapes(workload["n_embd"]) for l in layers)


def test_capture_run_json(capture):
    out, workload, run = capture
    on_disk = json.loads((out / "run.json").read_text())
    assert on_disk == json.loads(json.dumps(run))
    assert on_disk["versions"]["torch"] == torch.__version__
    assert on_disk["versions"]["device"] == "cpu"
    assert on_disk["workload"] == workload
    assert on_disk["harness"] == {"seed": 0, "warmup": 1, "iterations": 2}
    assert on_disk["compiled"] is False and on_disk["compile_mode"] is None and on_disk["compile_scope"] is None
    assert on_disk["layer_ranges"] is True and on_disk["compile_notes"] == []
    assert on_disk["layers"] == 2 and on_disk["mode"] == "inference" and on_disk["profiler"] == "torch"
    assert on_disk["nvtx"] == "none"


def test_resolve_device():
    assert harness.resolve_device("cpu") == "cpu"
    assert harness.resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="cuda"):
            harness.resolve_device("cuda")


def test_workload_error_during_capture_is_reported(tmp_path, monkeypatch, factories):
    """A model whose forward raises is a WorkloadError naming the phase, not a traceback."""
    mod = tmp_path / "opprof_test_broken_model.py"
    mod.write_text(textwrap.dedent("""
        import torch
        import torch.nn as nn

        class Broken(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(2, 2)

            def forward(self, x):
                raise ValueError("forward is broken")

        def make():
            return Broken(), (torch.zeros(1, 2),)
    """))
    wl = {"kind": "custom", "factory": "opprof_test_broken_model:make", "kwargs": {}, "compile": False}
    with torch_flags_kept(), pytest.raises(WorkloadError) as err:
        harness.run_capture(wl, {"seed": 0, "warmup": 1, "iterations": 1}, "cpu", tmp_path / "t.json.gz",
                            tmp_path / "layers.json", tmp_path / "run.json")
    assert "warm-up" in str(err.value) and "forward is broken" in str(err.value)
    assert not (tmp_path / "t.json.gz").exists() and not (tmp_path / "run.json").exists()
