"""The optimizer's FX passes on tiny models: numerics equal to the unrewritten model (fp32), the graph really
changed (node targets counted), the records name what was replaced; unsafe candidates are left alone with a
``skipped`` record. Dynamo's graph is captured with an eager backend (no Inductor compile: fast)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from operator_profiler.capture.workloads import GPT2, ConvStack
from operator_profiler.transforms import passes
from operator_profiler.optimize.numerics import DEFAULT_TOLERANCES, compare_outputs


def _dynamo_rewrite(model: nn.Module, inputs: tuple, fx_pass) -> tuple[list[dict], list[fx.GraphModule], object]:
    """Run ``fx_pass`` on Dynamo's graph(s) of ``model`` (eager backend); returns records, graphs, output."""
    records, graphs = [], []

    def backend(gm, example_inputs):
        records.extend(fx_pass(gm))
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(model, backend=backend)(*inputs)
    return records, graphs, out


def _count(graphs: list[fx.GraphModule], target) -> int:
    return sum(1 for gm in graphs for n in gm.graph.nodes if n.target is target or n.target == target)


def _assert_fp32_equal(reference, candidate):
    result = compare_outputs(reference, candidate, "float32")
    assert result.ok, result.reason
    # independent check: torch's own fp32 closeness
    torch.testing.assert_close(candidate, reference, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------ attention


@pytest.fixture(scope="module")
def gpt2_rewritten():
    torch.manual_seed(0)
    n_layer = 3
    model = GPT2(vocab_size=64, n_positions=16, n_embd=32, n_layer=n_layer, n_head=4).eval()
    idx = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        reference = model(idx)
    records, graphs, out = _dynamo_rewrite(model, (idx,), passes.attention_to_sdpa)
    return n_layer, reference, records, graphs, out


def test_gpt2_attention_becomes_one_causal_sdpa_per_layer(gpt2_rewritten):
    n_layer, reference, records, graphs, out = gpt2_rewritten
    done = [r for r in records if "new_node" in r]
    assert len(done) == n_layer and len(records) == n_layer
    assert _count(graphs, F.scaled_dot_product_attention) == n_layer
    assert _count(graphs, torch.Tensor.softmax) + _count(graphs, "softmax") == 0
    assert _count(graphs, "masked_fill") == 0 and _count(graphs, torch.ones) == 0
    for layer, record in enumerate(done):
        assert record["replaced_ops"] == ["aten::matmul", "aten::mul", "aten::masked_fill", "aten::softmax",
                                          "aten::matmul"]
        assert record["new_op"] == "aten::scaled_dot_product_attention"
        assert record["is_causal"] is True and record["attn_mask"] is None
        assert record["scale"] == pytest.approx(1 / math.sqrt(32 // 4))
        assert record["module_path"] == f"transformer.h.{layer}.attn"
    sdpa_nodes = [n for gm in graphs for n in gm.graph.nodes if n.target is F.scaled_dot_product_attention]
    assert all(n.meta.get("nn_module_stack") and n.meta.get("stack_trace") for n in sdpa_nodes)
    _assert_fp32_equal(reference, out)


class _Attention(nn.Module):
    """Explicit attention with a configurable mask, dropout and reuse of the scores (for the pass's limits)."""

    def __init__(self, mask: str = "causal", dropout: float = 0.0, reuse: bool = False, divide: bool = False,
                 fill: float = float("-inf")):
        super().__init__()
        self.mask, self.reuse, self.divide, self.fill = mask, reuse, divide, fill
        self.drop = nn.Dropout(dropout) if dropout else None

    def forward(self, q, k, v, extra):
        scores = q @ k.transpose(-2, -1)
        scores = scores / math.sqrt(q.shape[-1]) if self.divide else scores * 0.125
        seq = q.shape[-2]
        if self.mask == "causal":
            scores = scores.masked_fill(~torch.ones(seq, seq, dtype=torch.bool).tril(), self.fill)
        elif self.mask == "bool":
            scores = scores.masked_fill(extra, self.fill)
        elif self.mask == "additive":
            scores = scores + extra
        probs = F.softmax(scores, dim=-1)
        if self.drop is not None:
            probs = self.drop(probs)
        out = probs @ v
        return (out, probs.sum()) if self.reuse else out


def _qkv(seq: int = 6):
    torch.manual_seed(1)
    return [torch.randn(2, 3, seq, 8) for _ in range(3)]


@pytest.mark.parametrize("mask", ["causal", "bool", "additive", "none"])
def test_each_mask_form_rewrites_to_an_equal_sdpa(mask):
    q, k, v = _qkv()
    if mask == "bool":
        extra = torch.rand(6, 6) > 0.6
        extra.fill_diagonal_(False)  # no fully masked row (eager gives NaN there)
    else:
        extra = torch.randn(6, 6)
    model = _Attention(mask=mask, divide=(mask == "none"))
    with torch.no_grad():
        reference = model(q, k, v, extra)
    records, graphs, out = _dynamo_rewrite(model, (q, k, v, extra), passes.attention_to_sdpa)
    assert [r.get("skipped") for r in records] == [None]
    assert _count(graphs, F.scaled_dot_product_attention) == 1
    record = records[0]
    assert record["is_causal"] is (mask == "causal")
    assert (record["attn_mask"] is not None) is (mask in ("bool", "additive"))
    assert record["scale"] == pytest.approx(0.125 if mask != "none" else 1 / math.sqrt(8))
    _assert_fp32_equal(reference, out)


@pytest.mark.parametrize("case, reason_part", [
    ({"reuse": True}, "also used"),
    ({"fill": -1e4}, "not -inf"),
])
def test_unsafe_attention_is_not_rewritten_and_says_why(case, reason_part):
    q, k, v = _qkv()
    model = _Attention(**case).eval()
    with torch.no_grad():
        reference = model(q, k, v, torch.zeros(1))
    records, graphs, out = _dynamo_rewrite(model, (q, k, v, torch.zeros(1)), passes.attention_to_sdpa)
    assert len(records) == 1 and reason_part in records[0]["skipped"]
    assert "new_node" not in records[0]
    assert _count(graphs, F.scaled_dot_product_attention) == 0
    torch.testing.assert_close(out, reference, rtol=0, atol=0)


def test_dropout_that_drops_is_not_rewritten_and_dropout_in_eval_mode_is():
    """Dropout between softmax and the second matmul: in training mode it drops (SDPA without dropout_p would
    differ: skipped); in eval mode (training=False in Dynamo's graph) it is the identity, part of the chain."""
    q, k, v = _qkv()
    model = _Attention(dropout=0.1).train()
    records, graphs, _ = _dynamo_rewrite(model, (q, k, v, torch.zeros(1)), passes.attention_to_sdpa)
    assert len(records) == 1 and "dropout" in records[0]["skipped"]
    assert _count(graphs, F.scaled_dot_product_attention) == 0
    model.eval()
    with torch.no_grad():
        reference = model(q, k, v, torch.zeros(1))
    records, graphs, out = _dynamo_rewrite(model, (q, k, v, torch.zeros(1)), passes.attention_to_sdpa)
    assert [r.get("skipped") for r in records] == [None] and "aten::dropout" in records[0]["replaced_ops"]
    assert _count(graphs, F.scaled_dot_product_attention) == 1 and _count(graphs, F.dropout) == 0
    _assert_fp32_equal(reference, out)


class _HFEagerAttention(nn.Module):
    """Hugging Face's eager attention as transformers 5 writes it (``eager_attention_forward`` of Llama, BERT,
    ViT; GPT-2's casts with ``.type``): scale by a float, additive float mask, ``softmax(dim=-1, dtype=float32)``,
    a cast back to q's dtype, ``dropout(p, training=self.training)``, then the second matmul."""

    def __init__(self, softmax_dtype=torch.float32, cast: str = "to", p: float = 0.1):
        super().__init__()
        self.softmax_dtype, self.cast, self.p = softmax_dtype, cast, p

    def forward(self, q, k, v, mask):
        scores = torch.matmul(q, k.transpose(2, 3)) * 0.125 + mask
        probs = F.softmax(scores, dim=-1, dtype=self.softmax_dtype)
        probs = probs.to(q.dtype) if self.cast == "to" else probs.type(v.dtype)
        probs = F.dropout(probs, p=self.p, training=self.training)
        return torch.matmul(probs, v)


@pytest.mark.parametrize("cast", ["to", "type"])
def test_hugging_face_eager_attention_becomes_sdpa(cast):
    q, k, v = _qkv()
    mask = torch.zeros(2, 1, 6, 6).masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), torch.finfo(torch.float32).min)
    model = _HFEagerAttention(cast=cast).eval()
    with torch.no_grad():
        reference = model(q, k, v, mask)
    records, graphs, out = _dynamo_rewrite(model, (q, k, v, mask), passes.attention_to_sdpa)
    assert [r.get("skipped") for r in records] == [None]
    assert records[0]["replaced_ops"][:4] == ["aten::matmul", "aten::mul", "aten::add", "aten::softmax"]
    assert records[0]["attn_mask"] is not None and records[0]["scale"] == 0.125 and not records[0]["is_causal"]
    assert _count(graphs, F.scaled_dot_product_attention) == 1 and _count(graphs, F.softmax) == 0
    _assert_fp32_equal(reference, out)


def test_hugging_face_attention_in_bf16_with_an_fp32_softmax_is_not_rewritten():
    """softmax(dtype=float32) of bf16 scores, cast back: SDPA in bf16 is not provably that computation."""
    q, k, v = (t.to(torch.bfloat16) for t in _qkv())
    mask = torch.zeros(2, 1, 6, 6, dtype=torch.bfloat16)
    records, graphs, _ = _dynamo_rewrite(_HFEagerAttention().eval(), (q, k, v, mask), passes.attention_to_sdpa)
    assert len(records) == 1 and "softmax with dtype=torch.float32" in records[0]["skipped"]
    assert _count(graphs, F.scaled_dot_product_attention) == 0


def test_attention_sdpa_cannot_express_is_not_rewritten():
    q, k, v = _qkv()
    broadcast_k, broadcast_v = k[:, :1], v[:, :1]  # one k/v head for 3 q heads: matmul broadcasts, SDPA does not
    model = _Attention(mask="none")
    reference = model(q, broadcast_k, broadcast_v, None)
    records, graphs, out = _dynamo_rewrite(model, (q, broadcast_k, broadcast_v, None), passes.attention_to_sdpa)
    assert len(records) == 1 and "batch dimensions differ" in records[0]["skipped"]
    torch.testing.assert_close(out, reference, rtol=0, atol=0)
    bf16_mask = torch.randn(6, 6).to(torch.bfloat16)  # eager promotes scores + mask to fp32
    model = _Attention(mask="additive")
    records, graphs, _ = _dynamo_rewrite(model, (q, k, v, bf16_mask), passes.attention_to_sdpa)
    assert len(records) == 1 and "eager promotes, SDPA refuses" in records[0]["skipped"]
    assert _count(graphs, F.scaled_dot_product_attention) == 0


# ------------------------------------------------------------------------------------------------- conv-BN


def test_conv_bn_fold_removes_every_batchnorm_and_keeps_the_output():
    torch.manual_seed(2)
    model = ConvStack(in_channels=3, channels=8, n_block=2)
    with torch.no_grad():  # non-trivial running statistics, so the fold has something to fold
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-1, 1)
                module.running_var.uniform_(0.5, 2)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
    model.eval()
    x = torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        reference = model(x)
    gm = fx.symbolic_trace(model)
    records = passes.fold_conv_bn(gm)
    assert [r["module_path"] for r in records] == ["stem.conv", "blocks.0.conv", "blocks.1.conv"]
    assert all(r["replaced_ops"] == ["aten::conv2d", "aten::batch_norm"] for r in records)
    assert not [m for m in gm.modules() if isinstance(m, nn.BatchNorm2d)]
    assert sum(1 for n in gm.graph.nodes if n.op == "call_module") == 6  # 3 conv + 3 relu, was 9
    with torch.no_grad():
        _assert_fp32_equal(reference, gm(x))


def test_conv_bn_fold_refuses_training_mode_and_a_shared_conv_output():
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)

        def forward(self, x):
            y = self.conv(x)
            return self.bn(y) + y

    gm = fx.symbolic_trace(Shared().eval())
    records = passes.fold_conv_bn(gm)
    assert len(records) == 1 and "also used" in records[0]["skipped"]
    gm_train = fx.symbolic_trace(ConvStack(3, 4, 0).train())
    records = passes.fold_conv_bn(gm_train)
    assert len(records) == 1 and "training" in records[0]["skipped"]
    assert [m for m in gm_train.modules() if isinstance(m, nn.BatchNorm2d)]


# ----------------------------------------------------------------------------------------------- cast pairs


class _Casts(nn.Module):
    def __init__(self, wide: torch.dtype):
        super().__init__()
        self.wide = wide

    def forward(self, x):
        return (x.to(self.wide).to(x.dtype) * 3).sum(-1)


@pytest.mark.parametrize("source, wide", [(torch.float32, torch.float64), (torch.bfloat16, torch.float32)])
def test_an_exact_round_trip_is_cancelled(source, wide):
    x = torch.randn(4, 5).to(source)
    model = _Casts(wide)
    reference = model(x)
    records, graphs, out = _dynamo_rewrite(model, (x,), passes.cancel_cast_pairs)
    assert len(records) == 1 and "skipped" not in records[0]
    assert records[0]["dtypes"] == [str(source), str(wide)]
    assert _count(graphs, "to") == 0
    assert out.dtype == source
    torch.testing.assert_close(out, reference, rtol=0, atol=0)


def test_a_narrowing_round_trip_is_never_cancelled():
    x = torch.randn(4, 5) * 1.001  # values bf16 cannot hold exactly
    model = _Casts(torch.bfloat16)
    reference = model(x)
    assert not torch.equal(x.to(torch.bfloat16).to(torch.float32), x)  # the round trip really rounds
    records, graphs, out = _dynamo_rewrite(model, (x,), passes.cancel_cast_pairs)
    assert len(records) == 1 and "changes values" in records[0]["skipped"]
    assert _count(graphs, "to") == 2
    torch.testing.assert_close(out, reference, rtol=0, atol=0)


def test_numerics_tolerances_cover_each_dtype():
    assert set(DEFAULT_TOLERANCES) == {"float32", "bfloat16", "float16", "tf32", "int8"}


def test_a_float_padding_mask_inverted_by_logical_not_stays_inverted():
    """QA: ``masked_fill(logical_not(pad.float()), -inf)``: SDPA takes a float mask as an additive bias, so the
    inversion must stay (attend where logical_not(...) is False), never be stripped to the float tensor."""
    import torch
    import torch.nn.functional as F

    from operator_profiler.transforms import passes

    class PadAttention(torch.nn.Module):
        def forward(self, q, k, v, pad):
            s = (q @ k.transpose(-2, -1)) * 0.5
            s = s.masked_fill(torch.logical_not(pad.float()[:, None, None, :]), float("-inf"))
            return s.softmax(dim=-1) @ v

    q, k, v = (torch.randn(2, 2, 5, 4) for _ in range(3))
    pad = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
    model = PadAttention()
    reference = model(q, k, v, pad)
    records = []

    def backend(gm, example_inputs):
        records.extend(passes.attention_to_sdpa(gm))
        return gm.forward

    out = torch.compile(model, backend=backend, fullgraph=True)(q, k, v, pad)
    assert any(not r.get("skipped") for r in records)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()
    assert F.scaled_dot_product_attention  # the op the rewrite inserts
