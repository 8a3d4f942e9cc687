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
