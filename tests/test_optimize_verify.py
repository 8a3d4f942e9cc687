"""verify.refine_borderline: an undecided change (its interval reaches 1, its median is a gain) is kept, measured
again and decided on the pooled repetitions (timing.measure replaced here by seeded samples: the real measurement is tests/
test_optimize_timing.py's)."""

from __future__ import annotations

import numpy as np

from operator_profiler.optimize import ablation, verify


def _variant(changes, samples):
    return {"changes": changes, "rejected": None, "samples_ms": samples, "median_ms": float(np.median(samples))}


def test_an_undecided_change_is_kept_measured_again_and_kept_once_its_interval_leaves_1(monkeypatch, tmp_path):
    rng = np.random.default_rng(3)
    # 20 noisy repetitions: removing freezing (95 -> 100 ms) is undecided
    result = {"variants": {"fp32_eager": _variant([], rng.normal(120, 12, 20).tolist()),
                           "compile_default": _variant(["compile"], rng.normal(100, 10, 20).tolist()),
                           "compile+freezing": _variant(["compile", "freezing"], rng.normal(95, 10, 20).tolist())},
              "warnings": [], "seed": 0, "baseline": "fp32_eager"}
    advised = ["compile", "freezing"]
    before = ablation.verification(result, advised)["ablation"]
    step = {s["change"]: s for s in before["steps"]}["freezing"]
    assert step["decision"] == "undecided" and step["credit"]["value"] > 1 >= step["credit"]["ci"][0]
    assert before["kept"] == ["compile", "freezing"] and before["undecided"] == ["freezing"]
    assert "kept, undecided" in step["reason"] and before["recommended"]["changes"] == ["compile", "freezing"]
    calls = []

    def measure(spec, work_dir=None, **kwargs):  # quieter repetitions of the same variants
        calls.append(sorted(spec["variants"]))
        means = {"fp32_eager": 120.0, "compile_default": 100.0, "compile+freezing": 95.0}
        return {"variants": {n: _variant(c, rng.normal(means[n], 1.0, 40).tolist())
                             for n, c in spec["variants"].items()}, "warnings": []}

    monkeypatch.setattr(verify.timing, "measure", measure)
    rounds = verify.refine_borderline({"workload": {}}, result, advised, tmp_path)
    assert calls[0] == ["compile+freezing", "compile_default", "fp32_eager"] and len(rounds) == len(calls)
    after = ablation.verification(result, advised)["ablation"]
    step = {s["change"]: s for s in after["steps"]}["freezing"]
    assert step["decision"] == "kept" and step["credit"]["ci"][0] > 1 and after["undecided"] == []
    assert result["variants"]["compile+freezing"]["repetitions"] == 20 + 40 * len(calls)


def test_a_step_that_gains_nothing_is_not_measured_again(monkeypatch, tmp_path):
    rng = np.random.default_rng(5)
    result = {"variants": {"fp32_eager": _variant([], rng.normal(100, 1, 20).tolist()),
                           "compile_default": _variant(["compile"], rng.normal(104, 1, 20).tolist())},
              "warnings": [], "seed": 0, "baseline": "fp32_eager"}
    monkeypatch.setattr(verify.timing, "measure", lambda *a, **k: (_ for _ in ()).throw(AssertionError("measured")))
    assert verify.refine_borderline({"workload": {}}, result, ["compile"], tmp_path) == []
