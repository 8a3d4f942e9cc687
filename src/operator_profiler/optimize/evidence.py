"""The evidence the advisor reads: named measures over one attributed profile (a results folder).

Each measure is a number with the operators that make it up, quoted as they will appear in the advice
("aten::addmm 49.9% of kernel time, fp32, 25% of fp32 GEMM peak"). A share is a fraction of the attributed
kernel time (``operators.parquet`` ``time_share``); a measure that cannot be computed from this profile is
``None`` with a note saying why (the rule reading it then does not fire, visibly). Operator sets below name
ATen ops as the profiler spells them; a fused Inductor kernel's operator ("aten::add+aten::mm") counts as a
member when one of its ops is. The GEMM measures count each GEMM once, on the operator that runs it: an operator
that only dispatches (:data:`DISPATCH_ONLY_GEMM_OPS`, aten::linear around its aten::addmm) is left out, and the
measure's note names it with its share.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import pandas as pd

#: GEMM-like work: matrix multiplies, convolutions, fused attention and library RNN layers (their inner loops
#: are GEMMs). What bf16/TF32, freezing (weight prepacking) and autotuning act on.
GEMM_OPS = frozenset({
    "aten::addmm", "aten::mm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm", "aten::addbmm",
    "aten::_addmm_activation", "aten::einsum", "aten::addmv", "aten::mv",
    "aten::convolution", "aten::_convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d",
    "aten::mkldnn_convolution", "aten::cudnn_convolution", "aten::conv_transpose1d", "aten::conv_transpose2d",
    "aten::conv_transpose3d", "aten::_convolution_pointwise", "mkldnn::_convolution_pointwise",
    "mkldnn::_convolution_pointwise_", "mkldnn::_convolution_transpose_pointwise",
    # the backends aten::_convolution dispatches to besides oneDNN and cuDNN: the slow (thnn) path runs every
    # 1x1 convolution of a batch-1 input on one thread (HF ResNet's bottlenecks: 87 % of a 1-thread capture)
    "aten::_slow_conv2d_forward", "aten::thnn_conv2d", "aten::slow_conv3d", "aten::slow_conv3d_forward",
    "aten::slow_conv_dilated2d", "aten::slow_conv_dilated3d", "aten::slow_conv_transpose2d",
    "aten::slow_conv_transpose3d", "aten::_nnpack_spatial_convolution", "aten::_conv_depthwise2d",
    "aten::conv_depthwise3d", "aten::mkldnn_convolution_transpose", "aten::cudnn_convolution_transpose",
    "aten::cudnn_convolution_relu", "aten::cudnn_convolution_add_relu", "aten::miopen_convolution",
    "aten::miopen_depthwise_convolution", "aten::miopen_convolution_transpose", "aten::convolution_overrideable",
    "mkldnn::_linear_pointwise", "mkl::_mkl_linear",
    "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_attention_math",
    "aten::mkldnn_rnn_layer", "aten::_cudnn_rnn",
})
CONV_OPS = frozenset(op for op in GEMM_OPS if "conv" in op)
#: GEMM-like operators that only decompose into other operators (CompositeImplicitAutograd in torch's dispatcher:
#: aten::linear runs aten::addmm or aten::mm, aten::matmul aten::mm or aten::bmm, aten::conv2d aten::convolution):
#: no kernel is ever theirs. A CPU profile gives each its own (exclusive) time beside the operator it calls: no
#: nanosecond is counted twice, but that own time is dispatch and the views it makes (aten::t), not GEMM work, and
#: it has no dtype (the work model puts the call's work on the operator that runs it). Counted as GEMM time, one
#: GEMM call would be counted in two operators (and a float32 share could not count the second). The GEMM measures
#: leave these out and say so in their note.
DISPATCH_ONLY_GEMM_OPS = frozenset({
    "aten::linear", "aten::matmul", "aten::einsum", "aten::conv1d", "aten::conv2d", "aten::conv3d",
    "aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d", "aten::thnn_conv2d",
    "aten::slow_conv3d", "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_attention_math",
})
#: GEMMs with a weight operand (a parameter): what freezing constant-folds and prepacks.
WEIGHT_GEMM_OPS = frozenset({"aten::addmm", "aten::mm", "aten::matmul", "aten::linear", "aten::_addmm_activation",
                             "aten::addmv", "aten::mv", "mkldnn::_linear_pointwise", "mkl::_mkl_linear"}) | CONV_OPS
#: GEMMs Inductor's max-autotune chooses implementations for (mm, bmm, addmm and convolution templates).
AUTOTUNED_OPS = WEIGHT_GEMM_OPS | {"aten::bmm", "aten::baddbmm"}
#: Library RNN layers: one call runs a whole layer's recurrence (oneDNN on CPU, cuDNN on CUDA).
RNN_OPS = frozenset({"aten::lstm", "aten::gru", "aten::rnn_tanh", "aten::rnn_relu", "aten::mkldnn_rnn_layer",
                     "aten::_cudnn_rnn"})
BATCH_NORM_OPS = frozenset({"aten::batch_norm", "aten::_batch_norm_impl_index", "aten::native_batch_norm",
                            "aten::_native_batch_norm_legit_no_training", "aten::cudnn_batch_norm",
                            "aten::miopen_batch_norm"})
SOFTMAX_OPS = frozenset({"aten::softmax", "aten::_softmax", "aten::_safe_softmax"})
ATTENTION_MATMUL_OPS = frozenset({"aten::bmm", "aten::matmul", "aten::baddbmm"})
SDPA_OPS = frozenset(op for op in GEMM_OPS if "scaled_dot_product" in op)
CAST_OPS = frozenset({"aten::_to_copy", "aten::to", "prims::convert_element_type",
                      "aten::_autocast_to_reduced_precision", "aten::_autocast_to_full_precision"})
#: A non-GEMM operator whose calls average under this is "short" (eager launch/dispatch overhead dominates
#: a chain of them; Inductor fuses such chains). ns.
SHORT_CALL_NS = 50_000
#: A GEMM below this fraction of its ceiling is "far below" it (autotuning may find a better kernel).
FAR_BELOW_CEILING = 0.5
QUOTED_ITEMS = 4


@dataclass
class Profile:
    """What one results folder says, as the measures need it."""

    operators: pd.DataFrame            # operators.parquet
    kernels: pd.DataFrame              # attribution/kernels.parquet (operator, module, duration_ns, ...)
    run: dict                          # capture/run.json
    coverage: dict                     # coverage.json
    conv_layouts: dict[str, int] = field(default_factory=dict)   # layout -> calls ("nchw"/"channels_last"), shapes
    shapes_note: str | None = None     # why conv_layouts is empty when it is

    @property
    def device(self) -> str:
        return (self.run.get("versions") or {}).get("device") or "cpu"

    @property
    def compiled(self) -> bool:
        return bool(self.run.get("compiled"))

    @property
    def mode(self) -> str:
        return self.run.get("mode") or "inference"


@dataclass
class Measure:
    """A measure's value (None: not computable here, ``note`` says why), what it is, and its quoted items;
    ``interval``: its spread over the measured iterations (:func:`iteration_interval`), None until computed or
    when the profile has too few iterations (``interval_note`` says so)."""

    name: str
    value: float | None
    unit: str
    items: list[dict] = field(default_factory=list)
    note: str | None = None
    interval: dict | None = None
    interval_note: str | None = None

    def quote(self) -> str:
        """The evidence in words: the value and the operators that make it up."""
        if self.value is None:
            return f"{self.name}: unknown ({self.note})"
        head = f"{self.name} = {_fmt(self.value, self.unit)}"
        parts = [item["text"] for item in self.items[:QUOTED_ITEMS]]
        more = f" (+{len(self.items) - QUOTED_ITEMS} more)" if len(self.items) > QUOTED_ITEMS else ""
        return head + (": " + "; ".join(parts) + more if parts else "") + (f" [{self.note}]" if self.note else "")

    def interval_text(self) -> str:
        """``[low, high] over N iterations`` in the measure's unit, or why there is none."""
        if self.interval is None:
            return f"no per-iteration interval ({self.interval_note or 'not computed'})"
        low, high = self.interval["low"], self.interval["high"]
        fmt = (lambda v: f"{v:.1%}") if self.unit == "share" else (lambda v: f"{v:.3g}")
        return f"[{fmt(low)}, {fmt(high)}] over {self.interval['iterations']} iterations (interquartile range)"

    def to_json(self) -> dict:
        return {"value": self.value, "unit": self.unit, "items": self.items, "note": self.note,
                "interval": self.interval, "interval_note": self.interval_note, "text": self.quote()}


def _fmt(value: float, unit: str) -> str:
    return f"{value:.1%} of kernel time" if unit == "share" else f"{value:.3g} {unit}"


def _components(operator: str) -> set[str]:
    return set(str(operator).split("+"))


def _member(operator: str, ops: frozenset) -> bool:
    return bool(_components(operator) & ops)


def _item(row: pd.Series, extra: str = "") -> dict:
    share = float(row["time_share"])
    text = f"{row['operator']} {share:.1%}"
    dtype = row.get("work_dtype")
    if isinstance(dtype, str):
        text += f" ({dtype})"
    if extra:
        text += f", {extra}"
    return {"operator": row["operator"], "share": share, "mean_call_ns": _num(row.get("mean_kernel_ns")),
            "dtype": dtype if isinstance(dtype, str) else None, "text": text}


def _num(value) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _ceiling_text(row: pd.Series) -> str:
    fraction, ceiling = _num(row.get("ceiling_fraction")), row.get("ceiling")
    return f"{fraction:.0%} of {ceiling}" if fraction is not None and isinstance(ceiling, str) else ""


def _share_of(profile: Profile, mask: pd.Series, name: str, extra: Callable[[pd.Series], str] | None = None,
              note: str | None = None) -> Measure:
    rows = profile.operators[mask].sort_values("time_share", ascending=False)
    items = [_item(r, extra(r) if extra else "") for _, r in rows.iterrows()]
    return Measure(name, float(rows["time_share"].sum()), "share", items, note)


def _ops(profile: Profile, ops: frozenset) -> pd.Series:
    return profile.operators["operator"].map(lambda op: _member(op, ops))


def _gemm_ops(profile: Profile, ops_set: frozenset) -> tuple[pd.Series, pd.Series]:
    """(members, dispatch_only): the operators of ``ops_set`` that run GEMM work, and apart those that only
    dispatch (every op of theirs in :data:`DISPATCH_ONLY_GEMM_OPS`; a fused kernel computing one is a member)."""
    member = _ops(profile, ops_set)
    dispatch = profile.operators["operator"].map(lambda op: _components(op) <= DISPATCH_ONLY_GEMM_OPS)
    return member & ~dispatch, member & dispatch


def _listed(profile: Profile, mask: pd.Series) -> str:
    """The operators of ``mask`` with their shares, largest first (QUOTED_ITEMS of them, then how many more)."""
    rows = profile.operators[mask].sort_values("time_share", ascending=False)
    named = "; ".join(f"{r['operator']} {float(r['time_share']):.1%}" for _, r in rows.head(QUOTED_ITEMS).iterrows())
    return named + (f" (+{len(rows) - QUOTED_ITEMS} more)" if len(rows) > QUOTED_ITEMS else "")


def _left_out_notes(profile: Profile, dispatch: pd.Series, unknown: pd.Series | None = None,
                    unknown_why: str = "") -> list[str]:
    """What a GEMM measure did not count, and why: the operators that only dispatch (their GEMM is the operator
    they call, counted there) and those of ``unknown`` (``unknown_why`` says what is unknown)."""
    notes = []
    if dispatch.any():
        one = int(dispatch.sum()) == 1
        notes.append(f"not counted, {_listed(profile, dispatch)}: "
                     f"{'it only dispatches' if one else 'these only dispatch'} to the GEMM "
                     f"{'it calls' if one else 'they call'} ({'its' if one else 'their'} own time is dispatch "
                     "overhead; the GEMM is counted on the operator that runs it)")
    if unknown is not None and unknown.any():
        notes.append(f"not counted, {_listed(profile, unknown)}: {unknown_why}")
    return notes


def _joined(notes: list[str]) -> str | None:
    return "; ".join(notes) if notes else None


def _fp32_share(profile: Profile, ops_set: frozenset, name: str) -> Measure:
    """The share of the operators in ``ops_set`` that run GEMM work (:func:`_gemm_ops`) computing in float32
    (``work_dtype``, from the recorded shapes). Not counted, and named in the note with their shares: the operators
    that only dispatch, and those of unknown dtype (no ``work_dtype``: the shapes of their calls were not
    recorded or their work is unknown)."""
    ops = profile.operators
    member, dispatch = _gemm_ops(profile, ops_set)
    dtype = ops.get("work_dtype", pd.Series(None, index=ops.index))
    unknown = member & dtype.isna()
    note = _joined(_left_out_notes(profile, dispatch, unknown, "dtype unknown (no work_dtype in operators.parquet), "
                                                                "so not known to be float32"))
    return _share_of(profile, member & (dtype == "float32"), name, _ceiling_text, note)


def fp32_gemm_share(profile: Profile) -> Measure:
    """GEMM-like operators (GEMM_OPS) computing in float32 (dtype from the recorded shapes: ``work_dtype``); those
    that only dispatch and those of unknown dtype are not counted (the note names them: :func:`_fp32_share`)."""
    return _fp32_share(profile, GEMM_OPS, "fp32_gemm_share")


#: A GEMM whose tensor pipes are active under this % of peak (ncu ``tensor_pipe_active``) leaves them idle.
TENSOR_IDLE_PCT = 5.0


def tensor_idle_gemm_share(profile: Profile) -> Measure:
    """CUDA, with ncu counters: GEMM-like operators whose tensor pipes are active under TENSOR_IDLE_PCT % of peak
    (fp32 GEMMs run on the FMA pipes; TF32/bf16 move them to the tensor cores). None without the counters."""
    ops = profile.operators
    if "tensor_pipe_active" not in ops:
        return Measure("tensor_idle_gemm_share", None, "share", [],
                       "no tensor pipe counters (ncu's sm__pipe_tensor_cycles_active; CUDA runs with counters only)")
    member, dispatch = _gemm_ops(profile, GEMM_OPS)
    idle = member & (ops["tensor_pipe_active"] < TENSOR_IDLE_PCT)
    return _share_of(profile, idle, "tensor_idle_gemm_share",
                     lambda r: f"tensor pipes {_num(r['tensor_pipe_active']):.1f}% active",
                     _joined(_left_out_notes(profile, dispatch)))


def spill_share(profile: Profile) -> Measure:
    """CUDA, with ncu counters: operators whose kernels load or store local memory (register spills)."""
    ops = profile.operators
    if "local_load_bytes" not in ops:
        return Measure("spill_share", None, "share", [], "no local-memory counters (ncu; CUDA runs only)")
    stores = ops["local_store_bytes"] if "local_store_bytes" in ops else pd.Series(0.0, index=ops.index)
    spilled = (ops["local_load_bytes"].fillna(0) + stores.fillna(0)) > 0
    return _share_of(profile, spilled, "spill_share",
                     lambda r: f"{_num(r['local_load_bytes']) or 0:,.0f} local bytes loaded")


def weight_gemm_share(profile: Profile) -> Measure:
    """GEMMs with a weight operand (WEIGHT_GEMM_OPS) that run GEMM work, in any dtype (one of unknown dtype counts):
    their weights are what freezing prepacks. Operators that only dispatch (aten::linear around its aten::addmm)
    are not counted and the note names them; the per-iteration casts (``aten::_to_copy``) are quoted there too."""
    member, dispatch = _gemm_ops(profile, WEIGHT_GEMM_OPS)
    notes = _left_out_notes(profile, dispatch)
    casts = profile.operators[_ops(profile, CAST_OPS)]
    if len(casts):
        notes.append(f"casts per iteration: {casts['time_share'].sum():.1%} of kernel time")
    return _share_of(profile, member, "weight_gemm_share", _ceiling_text, _joined(notes))


#: GEMMs of a linear layer (a weight operand, no convolution): what int8_dynamic quantizes.
LINEAR_GEMM_OPS = WEIGHT_GEMM_OPS - CONV_OPS


def fp32_linear_share(profile: Profile) -> Measure:
    """GEMMs of linear layers (LINEAR_GEMM_OPS: a weight operand, no convolution) that run GEMM work, computing in
    float32 (``work_dtype``): what dynamic int8 quantization of nn.Linear moves to int8 GEMMs. The operators of
    :func:`weight_gemm_share` less the convolutions and less those not known to be float32 (the note names what
    is left out: :func:`_fp32_share`)."""
    return _fp32_share(profile, LINEAR_GEMM_OPS, "fp32_linear_share")


def eager_small_op_share(profile: Profile) -> Measure:
    """Non-GEMM operators whose calls average under SHORT_CALL_NS: what fusion removes (eager runs only)."""
    ops = profile.operators
    short = ~_ops(profile, GEMM_OPS) & ~_ops(profile, RNN_OPS) & (ops["mean_kernel_ns"] < SHORT_CALL_NS)
    per_iter = None
    iterations = len(profile.coverage.get("iteration_time_ns") or {}) or None
    if iterations:
        per_iter = int(ops.loc[short, "kernels"].sum() / iterations)
    m = _share_of(profile, short, "eager_small_op_share",
                  lambda r: f"{_num(r['mean_kernel_ns']) / 1e3:.1f} us per call")
    if per_iter is not None:
        m.note = f"{per_iter} such calls per iteration"
    return m


def rnn_share(profile: Profile) -> Measure:
    """Library RNN layers (aten::lstm and the oneDNN/cuDNN layer op it runs)."""
    return _share_of(profile, _ops(profile, RNN_OPS), "rnn_share", _ceiling_text)


def nchw_conv_share(profile: Profile) -> Measure:
    """Convolutions whose input activations are NCHW (contiguous), from the recorded input strides."""
    conv = _ops(profile, CONV_OPS)
    if not conv.any():
        return Measure("nchw_conv_share", 0.0, "share", [], "no convolutions")
    if not profile.conv_layouts:
        return Measure("nchw_conv_share", None, "share", [],
                       profile.shapes_note or "the convolutions' input layouts were not recorded")
    nchw = profile.conv_layouts.get("nchw", 0)
    total = sum(profile.conv_layouts.values())
    m = _share_of(profile, conv, "nchw_conv_share")
    m.value *= nchw / total
    m.note = f"{nchw} of {total} convolution calls read NCHW activations"
    return m


def conv_bn_share(profile: Profile) -> Measure:
    """Convolutions and BatchNorms of a profile that has both (each BatchNorm a candidate for folding)."""
    conv, bn = _ops(profile, CONV_OPS), _ops(profile, BATCH_NORM_OPS)
    if not conv.any() or not bn.any():
        return Measure("conv_bn_share", 0.0, "share", [], "no convolution followed by BatchNorm")
    return _share_of(profile, conv | bn, "conv_bn_share")


def explicit_attention_share(profile: Profile) -> Measure:
    """Attention computed op by op: softmax and batched matmuls in the same modules (kernel attribution), with no
    fused attention kernel there."""
    k = profile.kernels
    ops = k["operator"].astype(str)
    module = k["module"].astype(object).where(k["module"].notna(), "(no module)")
    softmax = ops.map(lambda op: _member(op, SOFTMAX_OPS))
    sdpa = ops.map(lambda op: _member(op, SDPA_OPS))
    modules = set(module[softmax]) - set(module[sdpa])
    if not modules:
        return Measure("explicit_attention_share", 0.0, "share", [], "no softmax outside fused attention")
    in_modules = module.isin(modules)
    chosen = in_modules & (softmax | ops.map(lambda op: _member(op, ATTENTION_MATMUL_OPS)))
    total = float(k["duration_ns"].sum()) or 1.0
    by_op = k[chosen].groupby(ops[chosen])["duration_ns"].sum().sort_values(ascending=False)
    items = [{"operator": op, "share": float(ns) / total, "text": f"{op} {float(ns) / total:.1%}"}
             for op, ns in by_op.items()]
    return Measure("explicit_attention_share", float(by_op.sum()) / total, "share", items,
                   f"in {len(modules)} module(s): {', '.join(sorted(map(str, modules))[:3])}"
                   + (" ..." if len(modules) > 3 else ""))


def cast_share(profile: Profile) -> Measure:
    """Dtype casts."""
    return _share_of(profile, _ops(profile, CAST_OPS), "cast_share")


def gemm_far_below_ceiling_share(profile: Profile) -> Measure:
    """GEMMs Inductor autotunes (AUTOTUNED_OPS) below FAR_BELOW_CEILING of their roofline ceiling, whose calls
    average at least SHORT_CALL_NS (a shorter GEMM is held back by its call overhead, which no kernel choice
    removes); operators without a ceiling fraction, and those that only dispatch, are not counted and named in the
    note."""
    ops = profile.operators
    member, dispatch = _gemm_ops(profile, AUTOTUNED_OPS)
    gemm = member & (ops["mean_kernel_ns"] >= SHORT_CALL_NS)
    fraction = ops.get("ceiling_fraction", pd.Series(float("nan"), index=ops.index))
    unknown = gemm & fraction.isna()
    note = _joined(_left_out_notes(profile, dispatch, unknown, "no ceiling fraction (work or ceiling unknown)"))
    if "ceiling_fraction" not in ops:
        return Measure("gemm_far_below_ceiling_share", None, "share", [], "no roofline columns (no work or ceilings)")
    return _share_of(profile, gemm & (fraction < FAR_BELOW_CEILING), "gemm_far_below_ceiling_share",
                     _ceiling_text, note)


def launch_bound(profile: Profile) -> Measure:
    """The fraction of the iteration the device is idle between kernels (1 - kernel time / iteration time)."""
    iterations = profile.coverage.get("iteration_time_ns") or {}
    if profile.device != "cuda":
        return Measure("launch_bound", None, "fraction idle", [], "CPU kernels have no launch gaps to measure")
    if not iterations:
        return Measure("launch_bound", None, "fraction idle", [], "no iteration times in coverage.json")
    wall = float(sum(iterations.values()))
    busy = float(profile.kernels["duration_ns"].sum())
    per_iter = len(profile.kernels) / len(iterations)
    median = float(profile.kernels["duration_ns"].median())
    return Measure("launch_bound", max(0.0, 1.0 - busy / wall) if wall else None, "fraction idle", [
        {"text": f"{per_iter:.0f} kernels per iteration, median {median / 1e3:.1f} us"}])


MEASURES: dict[str, Callable[[Profile], Measure]] = {
    f.__name__: f for f in (fp32_gemm_share, tensor_idle_gemm_share, spill_share, weight_gemm_share, fp32_linear_share,
                            eager_small_op_share, rnn_share, nchw_conv_share,
                            conv_bn_share, explicit_attention_share, cast_share, gemm_far_below_ceiling_share,
                            launch_bound)
}


#: The spread over the measured iterations a rule's bounds are checked against: the interquartile range of the
#: measure's per-iteration values (the middle half of the iterations; one slow iteration does not widen it, as
#: aggregate.rank_overlaps reasons for the operators' ranks).
INTERVAL_QUANTILES = (0.25, 0.75)
#: Fewer measured iterations than this give no interval (a rule then reads the single figure, and says so).
MIN_INTERVAL_ITERATIONS = 3


def iteration_profiles(profile: Profile) -> dict[int, Profile]:
    """One profile per measured iteration: the attribution's kernels of that iteration (``kernels["iteration"]``)
    and the operators table with ``time_share`` replaced by each operator's share of that iteration's kernel time
    (unattributed kernels are the ``(unattributed)`` row, as in aggregate.operators_table); every other column
    (dtype, call length, ceiling fraction, counters) stays the whole profile's, so membership in a measure is
    decided once. {} when the kernels carry no iteration."""
    from ..aggregate import UNATTRIBUTED

    kernels = profile.kernels
    if "iteration" not in kernels or "duration_ns" not in kernels:
        return {}
    measured = kernels[kernels["iteration"].notna()]
    if measured.empty:
        return {}
    iteration = measured["iteration"].astype("int64")
    operator = measured["operator"].astype(object).where(measured["operator"].notna(), UNATTRIBUTED)
    per_op = measured["duration_ns"].astype("float64").groupby([iteration, operator]).sum()
    times = (profile.coverage or {}).get("iteration_time_ns") or {}
    out = {}
    for it in sorted(set(iteration)):
        spent = per_op.loc[it]
        total = float(spent.sum())
        share = profile.operators["operator"].map(spent).fillna(0.0) / total if total else 0.0
        out[it] = Profile(operators=profile.operators.assign(time_share=share),
                          kernels=measured[(iteration == it).to_numpy()], run=profile.run,
                          coverage={"iteration_time_ns": {str(it): times[str(it)]} if str(it) in times else {}},
                          conv_layouts=profile.conv_layouts, shapes_note=profile.shapes_note)
    return out


def iteration_interval(measure: Measure, fn: Callable[[Profile], Measure], per_iteration: dict[int, Profile]) -> None:
    """Set ``measure.interval`` from ``fn`` evaluated on each of ``per_iteration`` (:func:`iteration_profiles`):
    ``{"low", "high", "median", "iterations", "values"}`` (the :data:`INTERVAL_QUANTILES` of the per-iteration
    values, linear interpolation; ``values`` in iteration order), or ``interval_note`` when the measure is unknown,
    the profile has fewer than :data:`MIN_INTERVAL_ITERATIONS` iterations, or an iteration's value is unknown."""
    import numpy as np

    if measure.value is None:
        measure.interval_note = "the measure is unknown"
        return
    if len(per_iteration) < MIN_INTERVAL_ITERATIONS:
        measure.interval_note = (f"{len(per_iteration)} measured iteration(s) in the attribution, fewer than "
                                 f"{MIN_INTERVAL_ITERATIONS}")
        return
    values = [fn(p).value for p in per_iteration.values()]
    if any(v is None for v in values):
        measure.interval_note = "unknown in some iterations"
        return
    low, median, high = np.quantile(np.asarray(values, dtype=float), [INTERVAL_QUANTILES[0], 0.5,
                                                                       INTERVAL_QUANTILES[1]])
    measure.interval = {"low": float(low), "high": float(high), "median": float(median),
                        "iterations": len(values), "values": [float(v) for v in values]}


def conv_layouts(shapes_ranges: pd.DataFrame) -> dict[str, int]:
    """Layouts of the 4-D inputs of convolution calls in a shapes iteration's ranges (``input_shapes`` JSON:
    [dims, types, concrete, strides]): ``{"nchw": n, "channels_last": m, "other": k}``."""
    import json

    counts: dict[str, int] = {}
    if shapes_ranges is None or "input_shapes" not in shapes_ranges:
        return counts
    conv = shapes_ranges[shapes_ranges["name"].isin(CONV_OPS) & shapes_ranges["input_shapes"].notna()]
    for text in conv["input_shapes"]:
        try:
            dims, _types, _concrete, strides = json.loads(text)[:4]
            shape, stride = dims[0], strides[0]
        except (ValueError, TypeError, IndexError):
            continue
        if not (isinstance(shape, list) and isinstance(stride, list) and len(shape) == 4 == len(stride)):
            continue
        n, c, h, w = shape
        layout = ("nchw" if stride == [c * h * w, h * w, w, 1] else
                  "channels_last" if stride == [h * w * c, 1, w * c, c] else "other")
        counts[layout] = counts.get(layout, 0) + 1
    return counts
