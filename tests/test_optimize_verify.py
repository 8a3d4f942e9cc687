"""verify.refine_borderline: an undecided change (its interval reaches 1, its median is a gain) is kept, measured
again and decided on the pooled repetitions; verify's second round measures a kept set beside the full advised set
(timing.measure replaced here by seeded samples: the real measurement is tests/test_optimize_timing.py's)."""

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


def test_a_kept_set_measured_in_a_second_round_gives_way_to_the_full_advised_set_when_slower(monkeypatch, tmp_path):
    """Two dropped changes that stand in for each other (sdpa_rewrite, channels_last): the kept set compile +
    conv_bn_fold is measured in a second round beside the full advised set, which is faster: it is recommended."""
    monkeypatch.setattr(ablation, "requirements", lambda change: {"freezing": ("compile",),
                                                                  "max_autotune": ("compile",)}.get(change, ()))
    advised = ["compile", "sdpa_rewrite", "channels_last", "conv_bn_fold"]
    f = frozenset
    means = {f(): 100.0, f(["compile"]): 80.0, f(["compile", "max_autotune", "freezing"]): 75.0,
             f(["sdpa_rewrite"]): 95.0, f(["channels_last"]): 95.0, f(["conv_bn_fold"]): 97.0,
             f(["compile", "sdpa_rewrite"]): 60.0, f(["compile", "sdpa_rewrite", "channels_last"]): 60.0,
             f(advised): 51.0, f(["sdpa_rewrite", "channels_last", "conv_bn_fold"]): 90.0,
             f(["compile", "channels_last", "conv_bn_fold"]): 50.0,
             f(["compile", "sdpa_rewrite", "conv_bn_fold"]): 50.0, f(["compile", "conv_bn_fold"]): 70.0}
    rng = np.random.default_rng(9)
    calls = []

    def measure(spec, work_dir=None, **kwargs):
        calls.append(dict(spec["variants"]))
        return {"variants": {n: _variant(c, rng.normal(means[f(c)], 0.5, 20).tolist())
                             for n, c in spec["variants"].items()}, "warnings": [], "seed": 0,
                "baseline": "fp32_eager"}

    monkeypatch.setattr(verify.timing, "measure", measure)
    record = verify.verify("w", {"kind": "mlp"}, {"repetitions": 20, "processes": 2}, "cpu",
                           {"advised_changes": advised, "advice": []}, tmp_path, features={"native_bf16": False})
    full = ablation.variant_name(advised)
    assert len(calls) == 2 and set(calls[1]) == {"fp32_eager", "compile+conv_bn_fold", full, "strong_generic"}
    assert [d["change"] for d in record["ablation"]["dropped"]] == ["sdpa_rewrite", "channels_last"]
    recommended = record["ablation"]["recommended"]
    assert recommended["round"] == 2 and recommended["source"] == "full_advised" and recommended["measured"] is True
    assert recommended["changes"] == ablation.closure(advised)
    assert recommended["instead_of"]["vs_advised"]["ci"][1] < 1
    assert any("measured in a second round" in line for line in recommended["trail"])
    assert any(w.startswith(f"the recommendation is {full} (full_advised)") for w in record["warnings"])
    assert not any("was not measured as a whole" in w for w in record["warnings"])
