"""The change vocabulary: canonical order, preconditions on this machine and on written cpuinfo files, the
compile settings, prepare and the forward context, variants' numerics against FP32 eager, and the freezing
check that catches Inductor's silent no-op (``options={"freezing": True}`` does not freeze in torch 2.13).
Inductor compiles take seconds here: the compiled variants are module-scoped and few."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from operator_profiler.capture.workloads import GPT2, ConvStack, LSTMEncoder
from operator_profiler.errors import WorkloadError
from operator_profiler.transforms import changes as ch
from operator_profiler.optimize.numerics import (
    DEFAULT_TOLERANCES,
    compare_outputs,
    variant_dtype,
)

IDS = ["compile", "max_autotune", "cuda_graphs", "freezing", "bf16_autocast", "tf32", "channels_last",
       "sdpa_rewrite", "conv_bn_fold", "cast_pair_cancel", "keep_rnn_library", "int8_dynamic"]


def _this_cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _cpuinfo(tmp_path: Path, flags: str) -> str:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: test\nflags\t\t: fpu sse2 avx2 {flags}\n\n")
    return str(path)


def _mlp() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).eval()


# ------------------------------------------------------------------------------------------ vocabulary


def test_the_vocabulary_and_its_canonical_order():
    assert list(ch.CHANGES) == IDS
    assert {c.kind for c in ch.CHANGES.values()} == {"setting", "compiler", "rewrite"}
    assert ch.canonical(["sdpa_rewrite", "freezing", "compile", "freezing"]) == ("compile", "freezing",
                                                                                   "sdpa_rewrite")
    with pytest.raises(WorkloadError, match="unknown change.*'fast'.*known: compile, max_autotune"):
        ch.canonical(["compile", "fast"])
    assert ch.precondition_problems(["fast"], "cpu", "infer", {})[0].startswith("unknown change 'fast'; known: ")


def test_compile_settings():
    assert ch.compile_settings([]) == {"compile": False, "options": {}, "freezing": False, "allow_rnn": None,
                                       "rewrites": [], "needs_backend": False}
    settings = ch.compile_settings(["keep_rnn_library", "cuda_graphs", "max_autotune", "freezing", "compile",
                                    "cast_pair_cancel", "sdpa_rewrite", "conv_bn_fold"])
    assert settings["options"] == {"max_autotune": True, "triton.cudagraphs": True}
    assert settings["freezing"] is True and settings["allow_rnn"] is False and settings["compile"] is True
    assert settings["rewrites"] == ["sdpa_rewrite", "cast_pair_cancel"]  # conv_bn_fold acts in prepare
    assert ch.compile_settings(["sdpa_rewrite"])["needs_backend"] is True
    assert ch.compile_settings(["sdpa_rewrite"])["compile"] is False


# ----------------------------------------------------------------------------------------- preconditions


def test_native_bf16_is_read_from_the_cpu_flags(tmp_path):
    with_flag = ch.machine_features("cpu", _cpuinfo(tmp_path, "avx512f avx512_bf16"))
    assert with_flag["native_bf16"] is True
    assert ch.precondition_problems(["bf16_autocast"], "cpu", "infer", with_flag) == []
    amx = ch.machine_features("cpu", _cpuinfo(tmp_path, "amx_tile amx_bf16"))
    assert amx["native_bf16"] is True
    without = ch.machine_features("cpu", _cpuinfo(tmp_path, "avx512f avx512_vnni"))
    problems = ch.precondition_problems(["bf16_autocast"], "cpu", "infer", without)
    assert len(problems) == 1 and problems[0].startswith("bf16_autocast needs native bf16")
    assert "avx512_bf16" in problems[0] and "amx_bf16" in problems[0]
    unreadable = ch.machine_features("cpu", str(tmp_path / "missing"))
    assert unreadable["native_bf16"] is False and "unreadable" in unreadable["native_bf16_source"]


def test_preconditions_on_this_machine():
    features = ch.machine_features("cpu")
    native = bool(_this_cpu_flags() & {"avx512_bf16", "amx_bf16"})
    assert features["native_bf16"] is native
    bf16 = ch.precondition_problems(["bf16_autocast"], "cpu", "infer", features)
    if native:
        assert bf16 == []
    else:  # this VM: Ice Lake without avx512_bf16 (docs/optimize.md)
        assert len(bf16) == 1 and "avx512_bf16" in bf16[0]
        with pytest.raises(WorkloadError, match="bf16_autocast needs native bf16"):
            ch.build_variant(_mlp(), (torch.randn(2, 32),), ["bf16_autocast"], "cpu")
    for change in ("tf32", "cuda_graphs"):
        problems = ch.precondition_problems(["compile", change], "cpu", "infer", features)
        assert problems and all(p.startswith(change) for p in problems)
        assert any("only on cuda, not on cpu" in p for p in problems)
    if not torch.cuda.is_available():  # this machine: a CPU build of torch
        on_cuda = ch.machine_features("cuda")
        assert on_cuda["cuda"] is False and on_cuda["native_bf16"] is False
        assert ch.precondition_problems(["tf32", "bf16_autocast"], "cuda", "infer", on_cuda) == [
            "bf16_autocast needs native bf16 on cuda (no CUDA device): bf16 would be emulated and slower than fp32",
            "tf32 needs a usable CUDA device"]
    train = ch.precondition_problems(["compile", "freezing"], "cpu", "train", features)
    assert train == ["freezing needs inference (mode infer): in mode train it would change what is trained"]
    assert ch.precondition_problems(["max_autotune"], "cpu", "infer", features) == [
        "max_autotune needs torch.compile: add the change 'compile'"]
    assert ch.precondition_problems(["compile", "cuda_graphs"], "cuda", "infer",
                                    {"cuda": True, "native_bf16": True}, static_shapes=False) == [
        "cuda_graphs needs static input shapes (a CUDA graph replays fixed shapes)"]
    assert ch.precondition_problems(["compile", "max_autotune", "freezing", "channels_last", "sdpa_rewrite",
                                     "conv_bn_fold", "cast_pair_cancel", "keep_rnn_library"],
                                    "cpu", "infer", features) == []


# ---------------------------------------------------------------------------------- settings and prepare


def test_bf16_forward_context_and_tf32_process_setting():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with ch.forward_context(["bf16_autocast"], "cpu"):
        assert (a @ b).dtype is torch.bfloat16
    with ch.forward_context(["compile"], "cpu"):
        assert (a @ b).dtype is torch.float32
    before = ch.apply_process_settings(["tf32"], "cpu")  # cuda only: nothing changes on cpu
    assert torch.backends.cuda.matmul.allow_tf32 is before["cuda.matmul.allow_tf32"]
    assert variant_dtype(["compile", "bf16_autocast", "tf32"]) == "bfloat16"
    assert variant_dtype(["tf32"]) == "tf32" and variant_dtype(["compile"]) == "float32"


def test_bf16_variant_is_judged_at_bf16_and_really_runs_in_bf16():
    """bf16 is emulated on a CPU without avx512_bf16: the precondition is overridden here (features) to check
    the variant's numerics, not its speed."""
    model, x = _mlp(), torch.randn(6, 32)
    with torch.no_grad():
        reference = model(x)
    variant = ch.build_variant(model, (x,), ["bf16_autocast"], "cpu",
                               features={"native_bf16": True, "native_bf16_source": "test"})
    out = variant.run()
    assert out.dtype is torch.bfloat16 and variant.backend is None
    judged = compare_outputs(reference, out, variant_dtype(variant.changes))
    assert judged.dtype == "bfloat16" and judged.ok, judged
    assert not compare_outputs(reference, out, "float32").ok  # bf16 rounding is far above fp32's tolerance


def test_conv_variant_folds_every_bn_and_goes_channels_last():
    torch.manual_seed(4)
    model = ConvStack(in_channels=3, channels=8, n_block=2)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_var.uniform_(0.5, 2)
                module.running_mean.uniform_(-1, 1)
    model.eval()
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        reference = model(x)
    variant = ch.build_variant(model, (x,), ["channels_last", "conv_bn_fold"], "cpu")
    assert variant.name == "channels_last+conv_bn_fold"
    assert [r["module_path"] for r in variant.rewrites] == ["stem.conv", "blocks.0.conv", "blocks.1.conv"]
    assert variant.inputs[0].is_contiguous(memory_format=torch.channels_last)
    convs = [m for m in variant.model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 3 and all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)
    assert not [m for m in variant.model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]  # the original is untouched
    result = compare_outputs(reference, variant.run(), "float32")
    assert result.ok and result.max_rel < 1e-5, result


# ----------------------------------------------------------------------------------------- compiled variants


@pytest.fixture(scope="module")
def frozen_gpt2():
    """GPT-2 (one tiny layer) with compile + freezing + the SDPA rewrite: one Inductor compile shared."""
    torch._dynamo.reset()
    torch.manual_seed(7)
    model = GPT2(vocab_size=50, n_positions=16, n_embd=32, n_layer=1, n_head=2).eval()
    idx = torch.randint(0, 50, (1, 10))
    with torch.no_grad():
        reference = model(idx)
    variant = ch.build_variant(model, (idx,), ["sdpa_rewrite", "freezing", "compile"], "cpu")
    return model, reference, variant, variant.run()


def test_compile_freezing_and_sdpa_prepack_every_linear_and_keep_numerics(frozen_gpt2):
    model, reference, variant, out = frozen_gpt2
    assert variant.name == "compile+freezing+sdpa_rewrite" and variant.backend.inner == "inductor"
    n_linear = sum(isinstance(m, nn.Linear) for m in model.modules())
    assert n_linear == 5 and variant.checks["freezing"] == {
        "graphs": 1, "frozen": 1, "param_constants": len(list(model.parameters())), "prepacked": n_linear}
    assert [r["new_op"] for r in variant.rewrites] == ["aten::scaled_dot_product_attention"]
    assert "scaled_dot_product_attention" in variant.backend.graphs[0]["targets"]
    assert "softmax" not in variant.backend.graphs[0]["targets"]
    result = compare_outputs(reference, out, variant_dtype(variant.changes), DEFAULT_TOLERANCES)
    assert result.ok and result.max_rel < 1e-5, result
    variant.warm_up(2)
    torch.testing.assert_close(variant.run(), reference, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def mlp_and_input():
    model = _mlp()
    x = torch.randn(5, 32)
    with torch.no_grad():
        return model, x, model(x)


def test_freezing_as_a_compile_option_silently_does_nothing_and_the_check_says_so(mlp_and_input):
    """The torch 2.13 pitfall: ``options={"freezing": True}`` compiles fine, but no weight is frozen."""
    model, x, reference = mlp_and_input
    torch._dynamo.reset()
    before = ch._prepack_counters()
    with torch.no_grad():
        out = torch.compile(model, options={"freezing": True})(x)
    assert ch._prepack_counters() - before == 0  # nothing prepacked: not frozen
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)  # ...and nothing looks wrong

    torch._dynamo.reset()
    backend = ch.RewriteBackend(["compile"], options={"freezing": True}, freezing=False)
    with torch.no_grad():
        torch.compile(model, backend=backend)(x)
    with pytest.raises(ch.FreezingNotApplied, match="freezing: graph\\(s\\) \\[0\\] compiled without Inductor freezing"):
        ch.freezing_applied(backend, model)
    with pytest.raises(ch.FreezingNotApplied, match="no graph was compiled"):
        ch.freezing_applied(ch.RewriteBackend(["compile"], freezing=True), model)


def test_freezing_with_grad_enabled_fails_loudly(mlp_and_input):
    model, x, _reference = mlp_and_input
    torch._dynamo.reset()
    backend = ch.RewriteBackend(["compile", "freezing"], freezing=True)
    torch.compile(model, backend=backend)(x)  # grad mode on: Inductor compiles without freezing
    assert backend.graphs[0]["freezing_on"] is False and backend.graphs[0]["prepacked"] == 0
    with pytest.raises(ch.FreezingNotApplied, match="grad mode off"):
        ch.freezing_applied(backend, model)


def test_gpt2_sdpa_variant_rewrites_each_layer_and_equals_eager():
    torch.manual_seed(5)
    n_layer = 2
    model = GPT2(vocab_size=50, n_positions=16, n_embd=32, n_layer=n_layer, n_head=2).eval()
    idx = torch.randint(0, 50, (1, 10))
    with torch.no_grad():
        reference = model(idx)
    torch._dynamo.reset()
    variant = ch.build_variant(model, (idx,), ["sdpa_rewrite"], "cpu")
    out = variant.run()
    assert variant.backend.inner == "eager"  # a rewrite without compile: Dynamo graph, eager kernels
    done = [r for r in variant.rewrites if "new_node" in r]
    assert len(done) == n_layer == len(variant.rewrites)
    assert all(r["change"] == "sdpa_rewrite" and r["scale"] == pytest.approx(1 / math.sqrt(16)) for r in done)
    result = compare_outputs(reference, out, "float32")
    assert result.ok and result.max_rel < 1e-5, result


def test_keep_rnn_library_leaves_the_lstm_out_of_the_compiled_graph():
    torch.manual_seed(6)
    model = LSTMEncoder(input_size=8, hidden_size=16, num_layers=1).eval()
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        reference = model(x)
    torch._dynamo.reset()
    variant = ch.build_variant(model, (x,), ["compile", "keep_rnn_library"], "cpu")
    out = variant.run()
    assert variant.settings["allow_rnn"] is False
    # Dynamo stopped at nn.LSTM (run as the library call): no compiled graph holds the LSTM...
    assert not [t for g in variant.backend.graphs for t in g["targets"] if "lstm" in t], variant.backend.graphs
    # ...where allow_rnn=True puts it into Dynamo's graph, for Inductor to decompose (eager inner: no compile)
    torch._dynamo.reset()
    backend = ch.RewriteBackend([], inner="eager")
    with torch._dynamo.config.patch(allow_rnn=True), torch.no_grad():
        torch.compile(model, backend=backend)(x)
    assert "lstm" in backend.graphs[0]["targets"]
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)


def test_a_variant_whose_weights_were_not_prepacked_fails_at_its_first_run(mlp_and_input, monkeypatch):
    """Simulates Inductor compiling with the setting on but prepacking nothing (what an unfrozen graph gives):
    the variant must not be timed as if frozen."""
    model, x, _reference = mlp_and_input
    monkeypatch.setattr(ch, "_prepack_counters", lambda: 0)
    torch._dynamo.reset()
    variant = ch.build_variant(model, (x,), ["compile", "freezing"], "cpu")
    with pytest.raises(ch.FreezingNotApplied, match="^freezing: the model has Linear/Conv layers but Inductor "
                                                    "prepacked no weight"):
        variant.run()
    assert "freezing" not in variant.checks


def test_freezing_set_only_around_inductors_compile_freezes_nothing_and_the_check_says_so(mlp_and_input):
    """Set after Dynamo traced (around compile_fx only), the setting comes too late: the parameters are already
    graph inputs, nothing is prepacked."""
    model, x, reference = mlp_and_input
    from torch._inductor import config as inductor_config

    class LateFreezing(ch.RewriteBackend):
        def __call__(self, gm, example_inputs):
            with inductor_config.patch(freezing=True):
                return super().__call__(gm, example_inputs)

    torch._dynamo.reset()
    backend = LateFreezing(["compile", "freezing"], freezing=True)
    with torch.no_grad():
        out = torch.compile(model, backend=backend)(x)
    assert backend.graphs[0]["param_inputs"] == len(list(model.parameters())) and backend.graphs[0]["prepacked"] == 0
    with pytest.raises(ch.FreezingNotApplied, match="still take parameters as inputs: not frozen"):
        ch.freezing_applied(backend, model)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)
