"""FLOP counts for the ATen ops PyTorch's FLOP formulas do not cover: one documented count per element.

PyTorch's ``torch.utils.flop_counter`` counts matrix products, convolutions and attention only. Every
other op that computes is counted here as ``per_element`` FLOPs times the elements of its ``basis``:

========================  ==========  =====  =====================================================
class                     basis       count  why
========================  ==========  =====  =====================================================
pointwise                 output      1      one arithmetic result per output element, whatever
                                             the instruction cost of the function (gelu, exp ...)
two-operation pointwise   output      2      addcmul, addcdiv, lerp: a multiply and an add
reduction                 input       1      one accumulation per element read
softmax (+ backward)      input       5      max, subtract, exp, sum, divide
normalization forward     input       5      mean, variance (2), normalize, affine
normalization backward    input       8      the forward's terms plus the gradient reductions
data movement, views      -           0      copies, concatenation, indexing, factories
========================  ==========  =====  =====================================================

An op in none of these classes has no rule: the work of a call that runs it is unknown (and said so),
never guessed. In-place (``add_``) and foreach (``_foreach_add``: every tensor of the list) variants use
their base op's rule. docs/work.md states the same table for readers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FlopRule:
    per_element: float
    basis: str  # "output" | "input"


def _ops(text: str) -> frozenset[str]:
    return frozenset("aten::" + op for op in text.split())


POINTWISE = _ops("""
    add sub rsub mul div neg abs exp exp2 log log2 log10 log1p expm1 sqrt rsqrt reciprocal pow square sin cos
    tan tanh sigmoid relu relu6 gelu silu mish erf erfc erfinv clamp clamp_min clamp_max maximum minimum fmax fmin
    where masked_fill threshold threshold_backward gelu_backward silu_backward sigmoid_backward tanh_backward
    hardtanh hardtanh_backward leaky_relu leaky_relu_backward elu elu_backward softplus softplus_backward
    hardswish hardswish_backward hardsigmoid hardsigmoid_backward mish_backward sign sgn floor ceil round trunc
    frac eq ne lt le gt ge logical_and logical_or logical_not logical_xor bitwise_and bitwise_or bitwise_not
    bitwise_xor fmod remainder atan2 atan asin acos sinh cosh asinh acosh atanh isnan isinf nan_to_num
    dropout native_dropout native_dropout_backward bernoulli log_sigmoid_forward log_sigmoid_backward
    mse_loss mse_loss_backward nll_loss_backward nll_loss2d_backward upsample_nearest2d upsample_bilinear2d
    upsample_nearest2d_backward upsample_bilinear2d_backward glu glu_backward prelu xlogy
    """)
TWO_OPERATION_POINTWISE = _ops("addcmul addcdiv lerp")
REDUCTIONS = _ops("""
    sum mean amax amin max min prod var var_mean std std_mean norm linalg_vector_norm logsumexp cumsum cumprod
    argmax argmin all any nll_loss_forward nll_loss2d_forward max_pool2d_with_indices max_pool3d_with_indices
    avg_pool2d avg_pool3d adaptive_avg_pool2d _adaptive_avg_pool2d adaptive_max_pool2d max_pool2d_with_indices_backward
    avg_pool2d_backward _adaptive_avg_pool2d_backward adaptive_avg_pool2d_backward embedding_dense_backward
    """)
SOFTMAX = _ops("""
    _softmax softmax log_softmax _log_softmax _softmax_backward_data _log_softmax_backward_data _safe_softmax
    """)
NORMALIZATION_FORWARD = _ops("""
    native_layer_norm layer_norm native_batch_norm batch_norm _native_batch_norm_legit
    _native_batch_norm_legit_no_training _native_batch_norm_legit_functional native_group_norm group_norm
    rms_norm _fused_rms_norm instance_norm _batch_norm_impl_index _batch_norm_with_update
    _batch_norm_no_update
    """)
NORMALIZATION_BACKWARD = _ops("""
    native_layer_norm_backward native_batch_norm_backward native_group_norm_backward _fused_rms_norm_backward
    batch_norm_backward _batch_norm_impl_index_backward
    """)
#: Views and tensor (re)descriptions: no arithmetic, no bytes moved.
VIEWS = _ops("""
    view _unsafe_view _reshape_alias as_strided t transpose permute expand expand_as squeeze unsqueeze
    select slice narrow split split_with_sizes chunk unbind detach alias lift_fresh resolve_conj resolve_neg
    view_as unfold diagonal movedim numpy_T _conj _neg_view view_as_real view_as_complex
    unsafe_split unsafe_chunk unsafe_split_with_sizes broadcast_to unflatten t_ swapaxes
    empty empty_like empty_strided new_empty new_empty_strided set_ resize_ _local_scalar_dense item
    is_nonzero is_same_size size stride sym_size sym_stride sym_numel sym_storage_offset storage_offset
    _has_compatible_shallow_copy_type cudnn_is_acceptable record_stream
    """)
#: Data movement: bytes moved, no arithmetic (reshape/flatten copy a tensor whose strides need it).
MOVEMENT = _ops("""
    reshape flatten    copy_ copy clone contiguous _to_copy to cat stack hstack vstack index index_select gather scatter
    scatter_add embedding fill fill_ zero_ zeros zeros_like ones ones_like full full_like new_zeros new_ones
    new_full arange linspace iota scalar_tensor lift_fresh_copy constant_pad_nd pad repeat flip roll tril triu
    slice_scatter select_scatter as_strided_scatter diagonal_scatter index_put index_put_ _unsafe_index
    _unsafe_index_put split_copy split_with_sizes_copy unbind_copy masked_select masked_scatter index_copy
    index_fill take put col2im im2col rand randn randint normal uniform random _fused_dropout
    slice_backward select_backward diagonal_backward unfold_backward index_select_backward gather_backward
    narrow_copy permute_copy transpose_copy view_copy repeat_interleave
    """)

#: In-place ops that overwrite their ``self`` without reading it (its bytes are written, not read).
OVERWRITING_OPS = frozenset({"aten::copy_", "aten::zero_", "aten::fill_", "aten::normal_", "aten::uniform_",
                             "aten::random_", "aten::bernoulli_", "aten::exponential_", "aten::set_"})

#: Ops that only move or describe data: never the kernel that carries a call's work (.assign).
DATA_ONLY_OPS = VIEWS | MOVEMENT

def is_data_only(op) -> bool:
    """Whether ``op`` (``aten::as_strided_``, ``aten::copy_``) only moves or describes data, in-place and foreach
    variants included."""
    return isinstance(op, str) and (op in DATA_ONLY_OPS or base_op(op)[0] in DATA_ONLY_OPS)


#: Ops whose call is a view or a description: skipped by :mod:`.op_calls` without a meta replay.
NO_WORK_OPS = VIEWS

_RULES: dict[str, FlopRule] = {}
for _ops_set, _rule in (
    (POINTWISE, FlopRule(1, "output")), (TWO_OPERATION_POINTWISE, FlopRule(2, "output")),
    (REDUCTIONS, FlopRule(1, "input")), (SOFTMAX, FlopRule(5, "input")),
    (NORMALIZATION_FORWARD, FlopRule(5, "input")), (NORMALIZATION_BACKWARD, FlopRule(8, "input")),
    (VIEWS, FlopRule(0, "output")), (MOVEMENT, FlopRule(0, "output")),
):
    for _op in _ops_set:
        _RULES[_op] = _rule


def base_op(op: str) -> tuple[str, bool]:
    """``aten::_foreach_add_`` -> (``aten::add``, True); ``aten::mul_`` -> (``aten::mul``, False)."""
    ns, _, name = op.partition("::")
    foreach = name.startswith("_foreach_")
    if foreach:
        name = name[len("_foreach_"):]
    if name.endswith("_") and not name.endswith("__") and f"{ns}::{name}" not in _RULES:
        name = name[:-1]
    return f"{ns}::{name}", foreach


#: prims ops (in post-grad graphs) that are not named like their aten counterpart.
PRIMS = {"prims::iota": FlopRule(0, "output"), "prims::convert_element_type": FlopRule(0, "output"),
         "prims::broadcast_in_dim": FlopRule(0, "output"), "prims::device_put": FlopRule(0, "output"),
         "prims::inductor_random": FlopRule(0, "output"), "prims::inductor_seeds": FlopRule(0, "output"),
         "prims::inductor_lookup_seed": FlopRule(0, "output"), "prims::fma": FlopRule(2, "output"),
         "prims::inductor_force_stride_order": FlopRule(0, "output"),
         # Inductor's max pooling (the max and the offset of the max in its window): one comparison per input
         # element, as aten::max_pool2d_with_indices above; turning offsets into indices moves data
         "prims::_low_memory_max_pool_with_offsets": FlopRule(1, "input"),
         "prims::_low_memory_max_pool_offsets_to_indices": FlopRule(0, "output")}


def rule_for(op: str) -> FlopRule | None:
    """The per-element rule of ``op`` (``aten::add_``, ``prims::sum``), or None when the op has none."""
    rule = _RULES.get(op) or PRIMS.get(op)
    if rule is not None:
        return rule
    if op.startswith("prims::"):
        op = "aten::" + op[len("prims::"):]
        rule = _RULES.get(op)
        if rule is not None:
            return rule
    return _RULES.get(base_op(op)[0])
