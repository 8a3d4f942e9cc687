"""A call that a PyTorch FLOP formula covers counts that formula and never also its decomposition.

Every op of ``torch.utils.flop_counter``'s registry is called here once, recorded by the real torch.profiler
(``record_shapes``: "Input Dims", "Input type", "Concrete Inputs", "Input Strides", the format of
/work/shared/docs/kineto-and-inductor.md section 1.5 and docs/formats.md) and given to
:func:`operator_profiler.work.op_calls.call_work`; the expected count is PyTorch's own, ``FlopCounterMode``
around the same call. Ops without a CPU kernel (the CUDA attention kernels, ``_scaled_mm``) are called on the
``meta`` device, which the profiler records like any other (it has no device column in record_shapes).

The eager ``scaled_dot_product_attention`` call is the case that went wrong: its meta replay takes the math path
(two ``bmm`` and the scale, mask and softmax around them), and the element-wise ops were counted on top of the
attention formula (causal, b=2, h=2, s=16, d=64: 276,736 instead of 262,144).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from operator_profiler.timeline.kineto import read_kineto
from operator_profiler.work.op_calls import call_work

aten = torch.ops.aten
B, H, S, D = 2, 2, 16, 64  # the attention call that was over-counted (276,736 FLOPs)


def _t(*shape, dtype=torch.float32, device="meta"):
    return torch.zeros(*shape, dtype=dtype, device=device)


def _registry_name(key) -> str:
    """``aten._convolution`` / ``flex_attention`` as str() gives the registry's keys -> ``aten::_convolution``."""
    name = str(key)
    return name.replace(".", "::", 1) if name.startswith("aten.") else name


def _calls() -> dict[str, tuple]:
    """One call per registry op: (overload, args, kwargs). Shapes: small, every dimension distinct where the
    formula could confuse them."""
    q = _t(B, H, S, D)
    qh = _t(B, S, H, D)  # (batch, seq, heads, dim): the layout of _flash/_efficient_attention_forward
    lse = _t(B, H, S)
    x, w, b = _t(2, 3, 9, 9), _t(4, 3, 3, 3), _t(4)
    conv = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    seed = _t((), dtype=torch.int64)
    return {
        "aten::mm": (aten.mm.default, (_t(8, 16), _t(16, 4)), {}),
        "aten::addmm": (aten.addmm.default, (_t(4), _t(8, 16), _t(16, 4)), {}),
        "aten::bmm": (aten.bmm.default, (_t(3, 8, 16), _t(3, 16, 4)), {}),
        "aten::baddbmm": (aten.baddbmm.default, (_t(3, 8, 4), _t(3, 8, 16), _t(3, 16, 4)), {}),
        "aten::convolution": (aten.convolution.default, (x, w, b, *conv), {}),
        "aten::_convolution": (aten._convolution.default, (x, w, b, *conv, False, False, True, True), {}),
        "aten::convolution_backward": (aten.convolution_backward.default,
                                       (_t(2, 4, 9, 9), x, w, [4], *conv, [True, True, True]), {}),
        "aten::_scaled_dot_product_efficient_attention": (aten._scaled_dot_product_efficient_attention.default,
                                                          (q, q, q, None, False), {}),
        "aten::_scaled_dot_product_flash_attention": (aten._scaled_dot_product_flash_attention.default,
                                                      (q, q, q), {}),
        "aten::_scaled_dot_product_cudnn_attention": (aten._scaled_dot_product_cudnn_attention.default,
                                                      (q, q, q, None, False), {}),
        "aten::_efficient_attention_forward": (aten._efficient_attention_forward.default,
                                               (qh, qh, qh, None, None, None, None, None, 0.0, 0), {}),
        "aten::_flash_attention_forward": (aten._flash_attention_forward.default,
                                           (qh, qh, qh, None, None, S, S, 0.0, False, False), {}),
        "aten::_scaled_dot_product_efficient_attention_backward": (
            aten._scaled_dot_product_efficient_attention_backward.default,
            (q, q, q, q, _t(0), q, lse, seed, seed, 0.0, [True, True, True, False]), {}),
        # cum_seq_q/k: undefined (None) in a dense call, as the forward returns them (defined: a nested call)
        "aten::_scaled_dot_product_flash_attention_backward": (
            aten._scaled_dot_product_flash_attention_backward.default,
            (q, q, q, q, q, lse, None, None, S, S, 0.0, False, seed, seed), {}),
        "aten::_scaled_dot_product_cudnn_attention_backward": (
            aten._scaled_dot_product_cudnn_attention_backward.default,
            (q, q, q, q, q, lse, seed, seed, _t(0), _t(0), _t(0), S, S, 0.0, False), {}),
        "aten::_efficient_attention_backward": (
            aten._efficient_attention_backward.default,
            (qh, qh, qh, qh, None, qh, None, None, S, S, lse, 0.0, seed, seed, 0, False), {}),
        "aten::_flash_attention_backward": (
            aten._flash_attention_backward.default,
            (qh, qh, qh, qh, qh, lse, None, None, S, S, 0.0, False, seed, seed), {}),
        "aten::_scaled_mm": (aten._scaled_mm.default,
                             (_t(16, 32, dtype=torch.float8_e4m3fn), _t(16, 32, dtype=torch.float8_e4m3fn).t(),
                              _t(()), _t(())), {"out_dtype": torch.bfloat16}),
    }


#: Registry ops without a meta kernel: a CUDA library's kernel, a backend hook, the CPU's slow convolution (whose
#: registry formula does not even fit its signature: FlopCounterMode raises TypeError on it). None is an outermost
#: call in a trace (aten::conv2d is, and its replay dispatches aten::convolution); their work is unknown, said so.
WITHOUT_META_KERNEL = {"aten::cudnn_convolution", "aten::convolution_overrideable", "aten::_slow_conv2d_forward"}
#: The higher-order flex attention ops: no dispatcher op in a timeline (compiled graphs only, where the fused
#: kernel's FX node counts them: tests/test_work_formulas.py::test_a_fused_kernel_counts_the_registry_formula...).
HIGHER_ORDER = {"flex_attention", "flex_attention_backward"}
NOT_CALLABLE_HERE = WITHOUT_META_KERNEL | HIGHER_ORDER


def _recorded_shapes(name: str, fn) -> str:
    """The input_shapes text of the first call of op ``name`` that the real profiler records while ``fn`` runs,
    as the real Kineto reader reads it from the exported trace."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as folder:
        prof.export_chrome_trace(str(Path(folder) / "trace.json"))
        ranges = read_kineto(Path(folder) / "trace.json").ranges
    rows = ranges[ranges["name"] == name]
    assert len(rows), f"{name} not recorded"
    return rows["input_shapes"].iloc[0]


def _flop_counter(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def test_the_calls_cover_every_op_of_the_registry():
    """A torch whose registry gains an op fails here, naming it: its call must be added below."""
    registry = {_registry_name(k) for k in flop_registry}
    assert registry == set(_calls()) | NOT_CALLABLE_HERE, registry ^ (set(_calls()) | NOT_CALLABLE_HERE)


@pytest.mark.parametrize("name", sorted(_calls()))
def test_a_registry_op_counts_exactly_what_flop_counter_counts(name):
    overload, args, kwargs = _calls()[name]
    expected = _flop_counter(lambda: overload(*args, **kwargs))
    work = call_work(name, _recorded_shapes(name, lambda: overload(*args, **kwargs)))
    assert expected > 0
    assert work.flops == work.flops_formula == expected, work
    assert work.flops_rule == "pytorch_formula"


@pytest.mark.parametrize("name", sorted(WITHOUT_META_KERNEL))
def test_a_registry_op_without_a_meta_kernel_is_unknown_not_guessed(name):
    """Recorded as the profiler writes a conv2d-shaped call of it: no meta kernel, so no replay and no
    count, said so (never a guess from the ops it decomposes into)."""
    schema = getattr(aten, name.split("::")[1]).default._schema
    dims = [[2, 3, 9, 9], [4, 3, 3, 3]] + [[] for _ in schema.arguments[2:]]
    types = ["float", "float"] + ["" if "Tensor" in str(a.type) else "ScalarList" if "[]" in str(a.type)
                                  else "Scalar" for a in schema.arguments[2:]]
    concrete = ["", ""] + [("[1, 1]" if t == "ScalarList" else "1" if "int" in str(a.type) else "False")
                           if t else "" for a, t in zip(schema.arguments[2:], types[2:])]
    work = call_work(name, json.dumps([dims, types, concrete, [[243, 81, 9, 1], [27, 9, 3, 1]] + dims[2:]]))
    assert work.flops is None and work.flops_formula is None
    assert work.note.startswith("not replayable on the meta device")


# ------------------------------------------------------------------ the eager SDPA entry points


def _sdpa_by_hand(b, h_q, s_q, s_k, d, d_v) -> int:
    """q @ k^T and attention @ v over the full s_q x s_k square: 2*b*h*s_q*s_k*d + 2*b*h*s_q*s_k*d_v."""
    return 2 * b * h_q * s_q * s_k * d + 2 * b * h_q * s_q * s_k * d_v


@pytest.mark.parametrize("case", ["causal", "mask", "gqa", "cross"])
def test_eager_sdpa_counts_the_attention_formula_and_not_its_math_path(case):
    """The over-counted call (causal, b=2, h=2, s=16, d=64) is 262,144 FLOPs: flop_counter counts the full square
    whether causal or not (docs/work.md). Recorded on CPU tensors as an eager model calls it; flop_counter's
    own count of the same call is taken on the meta device, where the composite takes the math path (its
    registry lacks CPU flash attention)."""
    s_k = 24 if case == "cross" else S
    h_kv = 1 if case == "gqa" else H
    q = torch.randn(B, H, S, D)
    k, v = torch.randn(B, h_kv, s_k, D), torch.randn(B, h_kv, s_k, 32 if case == "cross" else D)
    kwargs = {"is_causal": case == "causal", "enable_gqa": case == "gqa"}
    if case == "mask":
        kwargs["attn_mask"] = torch.ones(S, s_k, dtype=torch.bool).tril()

    def call(device="cpu"):
        moved = {k_: (x.to(device) if isinstance(x, torch.Tensor) else x) for k_, x in kwargs.items()}
        return F.scaled_dot_product_attention(q.to(device), k.to(device), v.to(device), **moved)

    work = call_work("aten::scaled_dot_product_attention",
                     _recorded_shapes("aten::scaled_dot_product_attention", call))
    expected = _sdpa_by_hand(B, H, S, s_k, D, v.shape[-1])
    assert work.flops == work.flops_formula == expected == _flop_counter(lambda: call("meta"))
    if case == "causal":
        assert expected == 262_144
    assert work.bytes_read == 4 * (q.numel() + k.numel() + v.numel()) + (S * s_k if case == "mask" else 0)
    assert work.bytes_written == 4 * B * H * S * v.shape[-1]


@pytest.mark.parametrize("name", ["aten::_scaled_dot_product_attention_math",
                                  "aten::_scaled_dot_product_flash_attention_for_cpu"])
def test_the_math_and_cpu_attention_ops_count_the_attention_formula(name):
    q = torch.randn(B, H, S, D)
    op = getattr(aten, name.split("::")[1]).default
    work = call_work(name, _recorded_shapes(name, lambda: op(q, q, q, is_causal=True) if "math" in name
                                            else op(q, q, q, 0.0, True)))
    assert work.flops == work.flops_formula == 262_144


# ------------------------------------------------------------------ compiled: the extern calls a graph makes

COMPILED_MODELS = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    """Causal attention (b=2, h=2, s=16, d=64) after a projection: compiled, Inductor calls CPU flash
    attention as a fallback kernel and the projection's GEMM as an extern kernel, both dispatcher ops."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 64)

    def forward(self, x):
        q = self.proj(x)
        return F.scaled_dot_product_attention(q, x, x, is_causal=True)


def attention():
    torch.manual_seed(0)
    return Attention().eval(), (torch.randn(2, 2, 16, 64),)
'''


def test_compiled_attention_and_gemm_count_the_registry_formulas(tmp_path):
    """The compiled run through the workflow's own capture and stages: per iteration the attention call counts
    262,144 FLOPs and the projection 2*m*n*k, the same formulas as the eager calls (only the ops PyTorch's
    formulas count: the fused kernels add their per-element FLOPs apart, in ``flops`` not ``flops_formula``)."""
    from conftest import importable_module, torch_flags_kept
    from workflow_runs import analyse_compiled_capture

    from operator_profiler.capture import jobs as capture

    workload = {"kind": "custom", "factory": "formula_models:attention", "kwargs": {}, "compile": True}
    iterations = 2
    out = tmp_path / "run"
    with importable_module(tmp_path, "formula_models", COMPILED_MODELS), torch_flags_kept():
        capture.compile_artifacts(workload, {"seed": 0, "warmup": 1, "iterations": 1}, "cpu", out / "inductor")
        capture.capture_timeline("a", workload, {"seed": 0, "warmup": 1, "iterations": iterations}, "cpu", "torch",
                                 out / "trace.json.gz", out / "run.json", out / "layers.json", out / "clocks.json",
                                 out_shapes=out / "shapes.json.gz")
    attribution, work = analyse_compiled_capture(out)
    by_op = attribution[["kernel_id", "operator"]].merge(work, on="kernel_id")
    formula = (by_op[by_op["flops_formula"] > 0].groupby("operator")["flops_formula"].sum() / iterations).to_dict()
    assert formula.pop("aten::_scaled_dot_product_flash_attention_for_cpu") == 262_144, by_op.to_string()
    # the projection: an extern GEMM (addmm, or mm with the bias in a generated kernel, as Inductor chooses)
    assert set(formula) <= {"aten::addmm", "aten::mm"}
    assert sum(formula.values()) == 2 * (2 * 2 * 16) * 64 * 64
    assert by_op["flops"].notna().all(), by_op.loc[by_op["flops"].isna(), "work_note"].unique()


# ------------------------------------------------------------------ compiled: registry ops inside generated kernels

#: A post-grad FX graph as Inductor's debug directory writes it (``fx_graph_transformed.py``: one node per line,
#: ``name: "<dtype>[<sizes>]" = torch.ops.<ns>.<op>.<overload>(args);  <dels>``, higher-order ops as
#: ``torch.ops.higher_order.<op>(...)`` without an annotation when they return a tuple; docs/formats.md
#: #inductor-directory-layout). Written here from that description: a GEMM template with a bias and a ReLU
#: epilogue (max-autotune), flex attention, a user Triton kernel, and a GEMM whose node two kernels list.
FX_GRAPH = '''
class <lambda>(torch.nn.Module):
    def forward(self, arg0_1: "f32[48, 64]", arg1_1: "f32[48]", arg2_1: "f32[32, 64]", arg3_1: "bf16[2, 4, 128, 64]", arg4_1: "f32[8, 8]"):
        # File: model.py:9 in forward, code: return torch.relu(self.lin(x))
        permute: "f32[64, 48]" = torch.ops.aten.permute.default(arg0_1, [1, 0]);  arg0_1 = None
        addmm: "f32[32, 48]" = torch.ops.aten.addmm.default(arg1_1, arg2_1, permute);  arg1_1 = arg2_1 = permute = None
        relu: "f32[32, 48]" = torch.ops.aten.relu.default(addmm);  addmm = None
        sdpa_score0 = self.sdpa_score0
        sdpa_mask0 = self.sdpa_mask0
        flex_attention = torch.ops.higher_order.flex_attention(arg3_1, arg3_1, arg3_1, sdpa_score0, (1, 1, None, None, None, None, None, None, None, None, None, None, None, None, 1073741824, 1073741824, sdpa_mask0), 0.125, {'BACKEND': 'AUTO', 'PRESCALE_QK': False}, (), ());  sdpa_score0 = sdpa_mask0 = None
        getitem: "bf16[2, 4, 128, 64]" = flex_attention[0];  flex_attention = None
        triton_kernel_wrapper_functional_proxy = torch.ops.higher_order.triton_kernel_wrapper_functional(kernel_idx = 0, constant_args_idx = 0, grid = [(1, 1, 1)], tma_descriptor_metadata = {}, kwargs = {'x': arg4_1}, tensors_to_clone = ['x']);  arg4_1 = None
        mm: "f32[32, 48]" = torch.ops.aten.mm.default(relu, relu_t);  relu_t = None
        return (relu, getitem)
'''


def test_a_fused_kernel_counts_the_registry_formula_of_a_node_it_alone_lists(tmp_path):
    from operator_profiler.work.fused_kernels import _fx_nodes, _node_flops

    (tmp_path / "fx_graph_transformed.py").write_text(FX_GRAPH)
    nodes, placeholders = _fx_nodes(tmp_path)
    listing = {"permute": 1, "addmm": 1, "relu": 1, "flex_attention": 1, "getitem": 1,
               "triton_kernel_wrapper_functional_proxy": 1, "mm": 2}
    m, n, k = 32, 48, 64
    gemm = _node_flops({"post_grad_nodes": ["permute", "addmm", "relu"]}, nodes, placeholders, listing)
    with FlopCounterMode(display=False) as counter:
        aten.addmm.default(_t(n), _t(m, k), _t(k, n))
    assert gemm == (2 * m * n * k + m * n, "float32", None, 2 * m * n * k)
    assert counter.get_total_flops() == 2 * m * n * k
    flex = _node_flops({"post_grad_nodes": ["flex_attention", "getitem"]}, nodes, placeholders, listing)
    attention = _sdpa_by_hand(2, 4, 128, 128, 64, 64)  # the full square: flex attention's block mask is not read
    assert flex == (attention, "bfloat16", None, attention)
    # a node two kernels list (a layout copy and the template): neither gets it, and it is said so
    shared = _node_flops({"post_grad_nodes": ["mm"]}, nodes, placeholders, listing)
    assert shared[0] is None and "node mm is listed by 2 generated kernels" in shared[2]
    # a higher-order op without a formula (a user Triton kernel) was dropped silently before: now unknown
    user = _node_flops({"post_grad_nodes": ["triton_kernel_wrapper_functional_proxy"]}, nodes, placeholders, listing)
    assert user[0] is None and "no FLOP rule for higher_order::triton_kernel_wrapper_functional" in user[2]


#: Template kernels as output_code.py defines and calls them (docs/formats.md#inductor-output-code; written here
#: from a torch 2.13 max-autotune compile): a C++ GEMM template names its operands X, W and Y, a Triton template
#: arg_A and arg_B; before, only in_ptr/out_ptr parameters were counted and X, W, Y silently moved nothing.
TEMPLATE_CODE = """
cpp_fused_addmm_relu_0 = async_compile.cpp_pybinding(['const float*', 'const float*', 'const float*', 'float*'], r'''
#include <torch/csrc/inductor/cpp_prefix.h>
inline void kernel_micro_gemm_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C)
{
}
extern "C"
void kernel(const float* X, const float* W, const float* in_ptr2, float* Y)
{
}
''')

triton_tem_fused_addmm_1 = async_compile.triton('triton_tem_fused_addmm_1', '''
@triton_heuristics.template(
    triton_meta={'signature': {'in_ptr0': '*fp32', 'arg_A': '*fp32', 'arg_B': '*fp32', 'out_ptr0': '*fp32', 'ks0': 'i32'}},
)
@triton.jit
def triton_tem_fused_addmm_1(in_ptr0, arg_A, arg_B, out_ptr0, ks0):
    pass
''')

triton_tem_fused_odd_2 = async_compile.triton('triton_tem_fused_odd_2', '''
@triton.jit
def triton_tem_fused_odd_2(weights, out_ptr0):
    pass
''', triton_meta={'signature': {'weights': '*fp32', 'out_ptr0': '*fp32'}})
"""


def test_template_kernels_count_the_bytes_of_their_own_operands():
    from operator_profiler.work.fused_kernels import _argument_bytes, _kernel_params

    params = _kernel_params(TEMPLATE_CODE)
    m, n, k = 32, 48, 64
    buffers = {"x": ((m, k), "float32"), "w": ((k, n), "float32"), "bias": ((n,), "float32"),
               "buf0": ((m, n), "float32")}
    expected = (4 * (m * k + k * n + n), 4 * m * n, None)
    assert _argument_bytes("cpp_fused_addmm_relu_0(x, w, bias, buf0)", "cpp_fused_addmm_relu_0",
                           params["cpp_fused_addmm_relu_0"], buffers) == expected
    assert _argument_bytes("triton_tem_fused_addmm_1.run(bias, x, w, buf0, 32, stream=stream0)",
                           "triton_tem_fused_addmm_1", params["triton_tem_fused_addmm_1"], buffers) == expected
    odd = _argument_bytes("triton_tem_fused_odd_2.run(w, buf0)", "triton_tem_fused_odd_2",
                          params["triton_tem_fused_odd_2"], buffers)
    assert odd[:2] == (None, None) and "pointer parameter weights is not known" in odd[2]
