"""compare_outputs: errors computed independently here (float64 by hand, torch's cosine_similarity), the
per-dtype tolerance applied, and the outputs that cannot be judged (NaN/Inf, shapes, structure) rejected."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from operator_profiler.optimize.numerics import (
    DEFAULT_TOLERANCES,
    compare_outputs,
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
    with pytest.raises(KeyError, match="known: bfloat16, float16, float32, tf32"):
        compare_outputs(torch.zeros(1), torch.zeros(1), "int8")


def test_tolerances_order_by_precision():
    rel = [DEFAULT_TOLERANCES[d]["max_rel"] for d in ("float32", "tf32", "float16", "bfloat16")]
    assert rel == sorted(rel)
    assert variant_dtype([]) == "float32"
