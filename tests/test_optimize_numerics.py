"""compare_outputs: errors computed independently here (float64 by hand, torch's cosine_similarity), the
per-dtype tolerance applied, and the outputs that cannot be judged (NaN/Inf, shapes, structure) rejected;
compare_in_dtype: a variant that changes the dtype judged against the eager model in that dtype at a bound derived
from that model's own deviation from FP32 (docs/optimize.md#numerics)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from operator_profiler.optimize.numerics import (
    DEFAULT_TOLERANCES,
    compare_in_dtype,
    compare_outputs,
    dtype_changes,
    in_dtype_limits,
    variant_dtype,
)


def test_identical_outputs():
    x = torch.randn(3, 4)
    result = compare_outputs(x, x.clone(), "float32")
    assert result.ok and result.reason is None
    assert result.max_abs == 0.0 and result.max_rel == 0.0 and result.cosine == pytest.approx(1.0)


def test_errors_are_relative_to_the_largest_reference_magnitude_over_all_outputs():
    reference = (torch.tensor([1.0, -4.0, 2.0]), [torch.tensor([0.5])])
    candidate = (torch.tensor([1.0, -4.001, 2.0]), [torch.tensor([0.5])])
    result = compare_outputs(reference, candidate, "float32")
    flat_ref = torch.tensor([1.0, -4.0, 2.0, 0.5], dtype=torch.float64)
    flat_cand = torch.tensor([1.0, -4.001, 2.0, 0.5], dtype=torch.float64)
    assert result.max_abs == pytest.approx(abs(float(torch.tensor(-4.001)) + 4.0), rel=1e-6)  # fp32 -4.001
    assert result.max_rel == pytest.approx(result.max_abs / 4.0)
    assert result.cosine == pytest.approx(float(F.cosine_similarity(flat_ref, flat_cand, dim=0)), abs=1e-9)
    assert not result.ok and result.reason.startswith("max_rel 0.00025 exceeds the float32 tolerance 0.0001")
    assert compare_outputs(reference, candidate, "bfloat16").ok


def test_cosine_catches_what_the_max_error_does_not():
    reference = torch.full((1000,), 1e-3)
    reference[0] = 1.0
    candidate = -reference
    candidate[0] = 1.0  # every small value's sign flipped: max error 2e-3 of the largest, cosine ~0.998
    result = compare_outputs(reference, candidate, "bfloat16")
    assert result.max_rel == pytest.approx(2e-3, rel=1e-5)
    expected = float(F.cosine_similarity(reference.double(), candidate.double(), dim=0))
    assert result.cosine == pytest.approx(expected, abs=1e-12) and expected < 0.999
    assert not result.ok and result.reason.startswith("cosine 0.998")


@pytest.mark.parametrize("candidate, reason", [
    (torch.tensor([1.0, math.nan]), "1 NaN/Inf value(s) in the candidate"),
    (torch.tensor([1.0, math.inf]), "1 NaN/Inf value(s) in the candidate"),
    (torch.tensor([1.0, 2.0, 3.0]), "shape (3,) differs from the reference's (2,)"),
    ((torch.tensor([1.0, 2.0]), torch.tensor([1.0])), "the candidate has 2 output tensors, the reference 1"),
    ("text", "cannot compare a str"),
])
def test_outputs_that_cannot_pass(candidate, reason):
    result = compare_outputs(torch.tensor([1.0, 2.0]), candidate, "float32")
    assert not result.ok and reason in result.reason
    assert math.isnan(result.max_abs)


def test_a_non_finite_reference_cannot_be_judged_and_unknown_dtypes_are_refused():
    result = compare_outputs(torch.tensor([math.nan]), torch.tensor([math.nan]), "float32")
    assert not result.ok and "the reference has NaN/Inf" in result.reason
    with pytest.raises(KeyError, match="known: bfloat16, float16, float32, int8, tf32"):
        compare_outputs(torch.zeros(1), torch.zeros(1), "float8")


def test_tolerances_order_by_precision():
    rel = [DEFAULT_TOLERANCES[d]["max_rel"] for d in ("float32", "tf32", "float16", "bfloat16", "int8")]
    assert rel == sorted(rel)
    assert variant_dtype([]) == "float32"


def test_the_dtype_changes_are_what_sets_the_dtype():
    assert dtype_changes(["compile", "max_autotune", "freezing", "bf16_autocast"]) == ["bf16_autocast"]
    assert dtype_changes(["tf32", "compile"]) == ["tf32"] and dtype_changes(["compile", "freezing"]) == []
    assert variant_dtype(dtype_changes(["compile", "bf16_autocast"])) == "bfloat16"


def test_a_miscompile_inside_the_bf16_tolerance_fails_against_eager_bf16():
    """A miscompile hidden by the bf16 tolerance, with the figures reported from the field: eager bf16 lies 0.004 from FP32 eager; a compiled bf16 variant
    lies 0.026 from FP32 (inside bf16's 5e-2) and 0.025 from eager bf16: beyond 2 x 0.004."""
    reference = torch.linspace(-1.0, 1.0, 101, dtype=torch.float64)
    eager_bf16 = reference.clone()
    eager_bf16[10] += 0.004  # its own rounding: max_rel 0.004
    miscompiled = eager_bf16.clone()
    miscompiled[50] += 0.025  # a value near 0 moved by 0.025 of the largest magnitude (1.0)
    loose = compare_outputs(reference, miscompiled, "bfloat16")
    assert loose.ok and loose.max_rel == pytest.approx(0.025, rel=1e-9)
    eager = compare_outputs(reference, eager_bf16, "bfloat16")
    assert eager.max_rel == pytest.approx(0.004, rel=1e-9)
    limits = in_dtype_limits(eager, "bfloat16")
    assert limits["max_rel"] == pytest.approx(0.008, rel=1e-9) and limits["factor"] == 2.0
    # cosine: 1 - 4 (1 - cos(eager)), capped at the float32 tolerance 0.9999
    expected_cos = float(F.cosine_similarity(reference, eager_bf16, dim=0))
    assert limits["min_cosine"] == pytest.approx(min(1 - 4 * (1 - expected_cos), 0.9999), abs=1e-12)
    tight = compare_in_dtype(eager_bf16, miscompiled, "bfloat16", eager)
    assert not tight.ok and tight.dtype == "bfloat16" and tight.max_rel == pytest.approx(0.025, rel=1e-9)
    assert tight.reason.startswith("max_rel 0.025 exceeds the bound against eager bfloat16 (2 x eager bfloat16's own "
                                   "max_rel 0.004 and cosine")
    assert tight.reason.endswith("at least the float32 tolerance) 0.008")
    # a correct variant: one more rounding of its own (0.005 <= 0.008) passes
    correct = eager_bf16.clone()
    correct[70] += 0.005
    assert compare_in_dtype(eager_bf16, correct, "bfloat16", eager).ok


def test_the_bound_is_never_looser_than_float32_nor_judged_without_an_eager_figure():
    x = torch.tensor([1.0, 2.0, 3.0])
    exact = compare_outputs(x, x.clone(), "bfloat16")  # the dtype changed nothing here: max_rel 0
    limits = in_dtype_limits(exact, "bfloat16")
    assert limits["max_rel"] == DEFAULT_TOLERANCES["float32"]["max_rel"]
    assert limits["min_cosine"] == DEFAULT_TOLERANCES["float32"]["min_cosine"]
    off = x.clone()
    off[2] += 3e-3 * 1.0001  # max_rel 1e-3 of the largest (3.0): beyond 1e-4
    assert not compare_in_dtype(x, off, "bfloat16", exact).ok
    custom = {**DEFAULT_TOLERANCES, "bfloat16": {**DEFAULT_TOLERANCES["bfloat16"], "in_dtype_factor": 4.0}}
    eager = compare_outputs(x, x * 1.01, "bfloat16")
    assert in_dtype_limits(eager, "bfloat16", custom)["max_rel"] == pytest.approx(0.04, rel=1e-6)
    unjudged = compare_outputs(x, torch.tensor([1.0, math.nan, 3.0]), "bfloat16")
    with pytest.raises(ValueError, match="the eager model in bfloat16 could not be compared with FP32 eager"):
        compare_in_dtype(x, x, "bfloat16", unjudged)


def test_a_hugging_face_kv_cache_in_the_output_is_compared_tensor_by_tensor():
    """A causal LM profiled with use_cache: true returns its KV cache (transformers 5's Cache: ``layers``, each with
    ``keys`` and ``values`` tensors) beside the logits: compared like the other outputs, never refused or skipped."""
    from types import SimpleNamespace

    from operator_profiler.optimize.numerics import compare_outputs

    def output(scale):
        cache = SimpleNamespace(layers=[SimpleNamespace(keys=torch.ones(2, 3) * scale, values=torch.full((2, 3), 2.0))])
        return {"logits": torch.ones(4), "past_key_values": cache}

    assert compare_outputs(output(1.0), output(1.0), "float32").ok
    moved = compare_outputs(output(1.0), output(1.5), "float32")
    assert not moved.ok and moved.max_abs == 0.5 and moved.max_rel == 0.25  # largest |reference| is the values' 2.0
