"""Numerics of a variant against the FP32 eager reference on the same fixed inputs: max abs error, max error
relative to the reference's largest magnitude, cosine similarity, judged by a tolerance per dtype.

Tolerances (:data:`DEFAULT_TOLERANCES`, overridable in the config): FP32 rewrites and compilation only reassociate
sums (errors of a few ulp of the largest value, ~1e-6 relative), so ``max_rel <= 1e-4`` and ``cosine >= 0.9999``
leave headroom yet catch a wrong rewrite (a wrong mask or scale moves values by O(1)). TF32 rounds GEMM inputs to
a 10-bit mantissa (2^-11 ~ 5e-4 per product): ``max_rel <= 1e-2``. FP16 (10-bit mantissa, computed in fp16 with
fp32 accumulation): ``max_rel <= 1e-2``, ``cosine >= 0.9995``. BF16 autocast rounds to an 8-bit mantissa
(2^-9 ~ 2e-3 per element, growing with depth): ``max_rel <= 5e-2``, ``cosine >= 0.999``.

A dtype's tolerance is a budget for the dtype's own rounding, sized for the deepest model; a compiler bug that moves
the output by less than it would pass unseen. So a variant that changes the dtype (:func:`dtype_changes`) and
anything else (compiles, rewrites, freezes) is also compared with the *eager* model in that dtype (the same dtype
changes, nothing else: :func:`compare_in_dtype`), at a tight bound: ``in_dtype_factor`` (default
:data:`IN_DTYPE_FACTOR`) times how far that eager model lies from FP32 eager on the same inputs (the dtype's own
rounding on this model, measured), never below the float32 tolerance. Two computations in one dtype differ by
about one dtype rounding of the output (measured: GPT-2 of the case studies, compiled vs eager under bf16
autocast, max_rel 2.98e-3 against eager bf16's own 3.02e-3 from FP32), a miscompile by what the compiler got
wrong (torch 2.13's Inductor on attention with softmax(dim=-2), pytorch#196468: max_rel 0.025 at fp32, 0.026
with bf16, inside bfloat16's 5e-2).

int8 (int8_dynamic: int8 weights per tensor, activations quantized per call to 7 bits: torch.ao's dynamic
Linear passes ``reduce_range=True``, fbgemm's guard against 16-bit overflow of u8 x s8 products without VNNI): a
weight rounds by up to half a step of max|w|/127 (~4e-3 of the largest weight), an activation by half a step of its
range/127, and the errors add up over the layers: measured on GPT-2 small (12 layers, random weights) max_rel 2.6e-2 and cosine 0.99964 against FP32
eager. ``max_rel <= 1e-1`` and ``cosine >= 0.999`` leave about 4x / 3x headroom there; a wrong scale or a
layer left unquantized with the wrong weights moves values by O(1). Max_rel and cosine do not say whether the
task survives: for logits the **top-1 agreement** (:func:`top1_agreement`, the fraction of positions whose argmax,
the predicted token or class, equals FP32 eager's) is stated for every variant, and int8 requires at least 99 %
(``min_top1_agreement``). Not bf16 by default: a random-weight model's top-1 is decided by tiny margins (GPT-2
small here: median gap between the two largest logits 0.10 for a logit spread of 0.58), and eager bf16 autocast
itself agreed on 98.0 % of 512 positions there; set ``min_top1_agreement`` for bfloat16 to require it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["DEFAULT_TOLERANCES", "DTYPE_CHANGES", "IN_DTYPE_FACTOR", "LOGITS_KINDS", "MIN_TOP1_AGREEMENT",
           "NumericsResult", "compare_in_dtype", "compare_outputs", "dtype_changes", "in_dtype_limits",
           "output_is_logits", "top1_agreement", "variant_dtype"]

#: The task-level check of a workload whose output is logits (an LM or classification head): the fraction of
#: positions (every row of the logits' last dimension) whose argmax, the top-1 token or class, is the reference's.
#: Stated for every variant of such a workload; required (``min_top1_agreement``) of int8 by default, of another
#: dtype when its tolerance sets it (module docstring: why not of bf16 by default).
MIN_TOP1_AGREEMENT = 0.99
DEFAULT_TOLERANCES: dict[str, dict[str, float]] = {
    "float32": {"max_rel": 1e-4, "min_cosine": 0.9999},
    "tf32": {"max_rel": 1e-2, "min_cosine": 0.9999},
    "float16": {"max_rel": 1e-2, "min_cosine": 0.9995},
    "bfloat16": {"max_rel": 5e-2, "min_cosine": 0.999},
    "int8": {"max_rel": 1e-1, "min_cosine": 0.999, "min_top1_agreement": MIN_TOP1_AGREEMENT},
}
#: The changes that make a variant compute in another dtype than float32 (:func:`variant_dtype`'s inverse).
DTYPE_CHANGES: tuple[str, ...] = ("int8_dynamic", "bf16_autocast", "tf32")
#: Built-in workload kinds whose output is logits (GPT-2's LM head); a Hugging Face output with ``logits`` is too.
LOGITS_KINDS = frozenset({"gpt2"})
#: A variant that changes the dtype may lie this many times as far from the eager model in its dtype as that eager
#: model lies from FP32 eager (max_rel; the cosine's distance from 1, which grows with the error squared, this
#: factor squared). 2: two correct computations differ by at most the sum of their errors, twice eager's when the
#: variant is as accurate as eager (about sqrt(2) times one of them when the roundings are independent).
IN_DTYPE_FACTOR = 2.0


@dataclass(frozen=True)
class NumericsResult:
    """``max_abs``: largest |candidate - reference| (output units); ``max_rel``: ``max_abs`` divided by the
    largest |reference| over all outputs (not element-wise: near-zero reference elements would make any rounding
    look huge); ``cosine``: cosine similarity of the flattened outputs (1.0 when both are all zero); ``ok``: within
    the dtype's tolerance; ``reason``: why not (None when ok); for logits (:func:`output_is_logits`)
    ``top1_agreement`` (:func:`top1_agreement`), ``top1_positions`` (how many positions it counts) and
    ``min_top1_agreement`` (the bound it was held to), else None."""

    max_abs: float
    max_rel: float
    cosine: float
    ok: bool
    reason: str | None
    dtype: str
    top1_agreement: float | None = None
    top1_positions: int | None = None
    min_top1_agreement: float | None = None

    def as_dict(self) -> dict:
        return {"max_abs": self.max_abs, "max_rel": self.max_rel, "cosine": self.cosine, "ok": self.ok,
                "reason": self.reason, "dtype": self.dtype, "top1_agreement": self.top1_agreement,
                "top1_positions": self.top1_positions, "min_top1_agreement": self.min_top1_agreement}


def output_is_logits(workload: Mapping | None, output: Any) -> bool:
    """Whether a workload's output is logits, judged by top-1 agreement too: a built-in kind of
    :data:`LOGITS_KINDS`, or an output holding ``logits`` (a Hugging Face ModelOutput or a dict)."""
    if workload and workload.get("kind") in LOGITS_KINDS:
        return True
    if isinstance(output, Mapping):
        return isinstance(output.get("logits"), torch.Tensor)
    return isinstance(getattr(output, "logits", None), torch.Tensor)


def _logits(value: Any) -> torch.Tensor:
    """The logits of an output: its ``logits`` entry or attribute, else its first tensor."""
    found = value.get("logits") if isinstance(value, Mapping) else getattr(value, "logits", None)
    if isinstance(found, torch.Tensor):
        return found
    return _flatten(value)[0][1]


def top1_agreement(reference: Any, candidate: Any) -> tuple[float, int]:
    """The top-1 agreement of two outputs' logits (:func:`_logits`): the fraction of positions (rows over the
    last dimension: every token of every sequence of the batch) where ``argmax`` over the last dimension is the
    same, and the number of positions. Raises ValueError when the logits' shapes differ or have no last
    dimension."""
    ref, cand = _logits(reference), _logits(candidate)
    if tuple(ref.shape) != tuple(cand.shape) or ref.dim() == 0 or ref.shape[-1] == 0:
        raise ValueError(f"logits of shape {tuple(cand.shape)} against the reference's {tuple(ref.shape)}")
    ref_top = ref.detach().to("cpu", torch.float64).argmax(dim=-1).reshape(-1)
    cand_top = cand.detach().to("cpu", torch.float64).argmax(dim=-1).reshape(-1)
    positions = int(ref_top.numel())
    return (float((ref_top == cand_top).sum()) / positions if positions else 1.0), positions


def variant_dtype(changes: Iterable[str]) -> str:
    """The dtype a variant is judged at: int8 with int8_dynamic (its linear layers compute in int8: the coarsest
    rounding of the variant whatever else it has), bfloat16 with bf16_autocast, tf32 with tf32, else float32."""
    changes = set(changes)
    if "int8_dynamic" in changes:
        return "int8"
    if "bf16_autocast" in changes:
        return "bfloat16"
    if "tf32" in changes:
        return "tf32"
    return "float32"


def dtype_changes(changes: Iterable[str]) -> list[str]:
    """The changes among ``changes`` that set the dtype a variant computes in (:data:`DTYPE_CHANGES`, in that
    order); [] for a variant that computes in float32."""
    chosen = set(changes)
    return [c for c in DTYPE_CHANGES if c in chosen]


def _flatten(value: Any, where: str = "output") -> list[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        return [(where, value)]
    if isinstance(value, (tuple, list)):
        return [item for i, v in enumerate(value) for item in _flatten(v, f"{where}[{i}]")]
    if isinstance(value, Mapping):
        return [item for k in sorted(value, key=str) for item in _flatten(value[k], f"{where}[{k!r}]")]
    if hasattr(value, "to_tuple"):  # ModelOutput-like containers
        return _flatten(value.to_tuple(), where)
    layers = getattr(value, "layers", None)
    if isinstance(layers, (list, tuple)) and all(hasattr(layer, "keys") and hasattr(layer, "values")
                                                 for layer in layers):
        # a Hugging Face KV cache (transformers 5's Cache: per layer the keys and values tensors), returned by a
        # model profiled with use_cache: true
        return [item for i, layer in enumerate(layers)
                for name in ("keys", "values")
                for item in _flatten(getattr(layer, name), f"{where}.layers[{i}].{name}")]
    raise TypeError(f"{where}: cannot compare a {type(value).__name__} (tensors, tuples, lists or dicts of them)")


def _result(max_abs: float, max_rel: float, cosine: float, reason: str | None, dtype: str) -> NumericsResult:
    return NumericsResult(max_abs, max_rel, cosine, reason is None, reason, dtype)


def compare_outputs(reference: Any, candidate: Any, dtype: str,
                    tolerances: Mapping[str, Mapping[str, float]] = DEFAULT_TOLERANCES,
                    logits: bool = False) -> NumericsResult:
    """Compare a variant's output with the reference (tensors or nested tuples/lists/dicts, flattened in order),
    in float64. Not ok, with the reason: a different structure or shape, NaN/Inf in the candidate where the
    reference is finite (or any in the reference: it cannot be judged), max_rel or cosine outside the
    tolerance of ``dtype``, or, with ``logits`` (the output is logits: :func:`output_is_logits`; the agreement is
    then computed and stated whatever the dtype), a top-1 agreement below the tolerance's ``min_top1_agreement``
    when it has one (int8's: :data:`MIN_TOP1_AGREEMENT`). Raises KeyError naming the known dtypes for a dtype
    without a tolerance."""
    if dtype not in tolerances:
        raise KeyError(f"no numerics tolerance for dtype {dtype!r}; known: {', '.join(sorted(tolerances))}")
    result = _compare(reference, candidate, dtype, tolerances[dtype], f"the {dtype} tolerance")
    if not logits or not math.isfinite(result.max_rel):  # not logits, or already failed on structure/NaN
        return result
    required = tolerances[dtype].get("min_top1_agreement")
    bound = None if required is None else float(required)
    agreement, positions = top1_agreement(reference, candidate)
    reason = result.reason
    if reason is None and bound is not None and agreement < bound:
        reason = (f"top-1 agreement of the logits {agreement:.2%} ({positions} positions) below the {dtype} "
                  f"tolerance {bound:.2%}")
    return NumericsResult(result.max_abs, result.max_rel, result.cosine, reason is None, reason, dtype,
                          agreement, positions, bound)


def in_dtype_limits(eager_vs_fp32: NumericsResult, dtype: str,
                    tolerances: Mapping[str, Mapping[str, float]] = DEFAULT_TOLERANCES) -> dict:
    """The bounds of :func:`compare_in_dtype`: ``max_rel`` = factor x ``eager_vs_fp32.max_rel``, at least the
    float32 tolerance's; ``min_cosine`` = 1 - factor^2 x (1 - ``eager_vs_fp32.cosine``), at most the float32
    tolerance's; ``factor`` = ``tolerances[dtype]["in_dtype_factor"]`` (default :data:`IN_DTYPE_FACTOR`).
    ``eager_vs_fp32``: the eager model in ``dtype`` against FP32 eager (:func:`compare_outputs`). Raises KeyError
    when ``tolerances`` has no float32 entry, ValueError when ``eager_vs_fp32`` has no finite figures (it could
    not be judged: neither can the variant)."""
    tight = tolerances["float32"]
    factor = float((tolerances.get(dtype) or {}).get("in_dtype_factor", IN_DTYPE_FACTOR))
    if not (math.isfinite(eager_vs_fp32.max_rel) and math.isfinite(eager_vs_fp32.cosine)):
        raise ValueError(f"the eager model in {dtype} could not be compared with FP32 eager "
                         f"({eager_vs_fp32.reason}): the variant cannot be judged in its dtype")
    return {"max_rel": max(factor * eager_vs_fp32.max_rel, tight["max_rel"]),
            "min_cosine": min(1.0 - factor ** 2 * (1.0 - eager_vs_fp32.cosine), tight["min_cosine"]),
            "factor": factor}


def compare_in_dtype(eager_in_dtype: Any, candidate: Any, dtype: str, eager_vs_fp32: NumericsResult,
                     tolerances: Mapping[str, Mapping[str, float]] = DEFAULT_TOLERANCES) -> NumericsResult:
    """Compare a variant that changes the dtype with the eager model in that dtype (``eager_in_dtype``: the
    output of the same dtype changes and no other, on the same inputs) at the tight bound of
    :func:`in_dtype_limits`, so that a compiler bug is not absorbed by the dtype's tolerance (module docstring).
    Not ok with the reason as :func:`compare_outputs`, naming the bound and where it comes from. Raises
    ValueError when ``eager_vs_fp32`` could not be judged (:func:`in_dtype_limits`)."""
    limits = in_dtype_limits(eager_vs_fp32, dtype, tolerances)
    source = (f"the bound against eager {dtype} ({limits['factor']:g} x eager {dtype}'s own max_rel "
              f"{eager_vs_fp32.max_rel:.3g} and cosine {eager_vs_fp32.cosine:.6f} against FP32 eager, at least the "
              "float32 tolerance)")
    return _compare(eager_in_dtype, candidate, dtype, limits, source)


def _compare(reference: Any, candidate: Any, dtype: str, limits: Mapping[str, float], bound: str) -> NumericsResult:
    """:func:`compare_outputs` against ``limits`` (``max_rel``, ``min_cosine``), named ``bound`` in a reason."""
    nan = float("nan")
    try:
        ref_parts, cand_parts = _flatten(reference), _flatten(candidate)
    except TypeError as exc:
        return _result(nan, nan, nan, str(exc), dtype)
    if len(ref_parts) != len(cand_parts):
        return _result(nan, nan, nan, f"the candidate has {len(cand_parts)} output tensors, the reference "
                                      f"{len(ref_parts)}", dtype)
    refs, cands = [], []
    for (where, ref), (_, cand) in zip(ref_parts, cand_parts):
        if tuple(ref.shape) != tuple(cand.shape):
            return _result(nan, nan, nan, f"{where}: shape {tuple(cand.shape)} differs from the reference's "
                                          f"{tuple(ref.shape)}", dtype)
        ref64 = ref.detach().to("cpu", torch.float64).reshape(-1)
        cand64 = cand.detach().to("cpu", torch.float64).reshape(-1)
        if not bool(torch.isfinite(ref64).all()):
            return _result(nan, nan, nan, f"{where}: the reference has NaN/Inf; the check cannot judge it", dtype)
        bad = int((~torch.isfinite(cand64)).sum())
        if bad:
            return _result(nan, nan, nan, f"{where}: {bad} NaN/Inf value(s) in the candidate", dtype)
        refs.append(ref64)
        cands.append(cand64)
    ref_all = torch.cat(refs) if refs else torch.zeros(0, dtype=torch.float64)
    cand_all = torch.cat(cands) if cands else torch.zeros(0, dtype=torch.float64)
    max_abs = float((cand_all - ref_all).abs().max()) if ref_all.numel() else 0.0
    scale = float(ref_all.abs().max()) if ref_all.numel() else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    norms = float(ref_all.norm()) * float(cand_all.norm())
    cosine = float(ref_all @ cand_all) / norms if norms > 0 else (1.0 if max_abs == 0 else 0.0)
    reason = None
    if max_rel > limits["max_rel"]:
        reason = f"max_rel {max_rel:.3g} exceeds {bound} {limits['max_rel']:.3g}"
    elif cosine < limits["min_cosine"]:
        reason = f"cosine {cosine:.6f} below {bound} {limits['min_cosine']:.6g}"
    return _result(max_abs, max_rel, cosine, reason, dtype)
