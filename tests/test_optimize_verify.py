"""Decide, or measure more (verify.refine_borderline, verify.measure_more): an undecided change (its interval reaches
1, its median is a gain) is kept, its two variants only are measured again in new processes, one round after
another within a time budget, and decided on the pooled repetitions; one still undecided when the budget is spent
stays kept and says so; an undecided guard is measured more too; each decision reports the repetitions and
processes it took. verify's second round measures a kept set beside the full advised set. timing.measure is
replaced here by seeded samples and the clock by a counter (the real measurement, busy processes measured again
included, is tests/test_optimize_timing.py's)."""

from __future__ import annotations

import numpy as np
import pytest

from operator_profiler.errors import ConfigError
from operator_profiler.optimize import ablation, stats, verify


def _variant(changes, samples, processes=2):
    return {"changes": changes, "rejected": None, "samples_ms": list(samples), "median_ms": float(np.median(samples)),
            "repetitions": len(samples), "processes": processes, "iterations_per_repetition": [1] * processes}


class Clock:
    """A clock that each fake measurement moves on by ``step`` seconds."""

    def __init__(self, step: float):
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        return self.now


def _steps(decision: dict) -> dict:
    return {s["change"]: s for s in decision["steps"]}


def test_an_undecided_change_is_kept_measured_again_and_kept_once_its_interval_leaves_1(monkeypatch, tmp_path):
    rng = np.random.default_rng(3)
    # 20 noisy repetitions: removing freezing (95 -> 100 ms) is undecided
    first = {"fp32_eager": rng.normal(120, 12, 20).tolist(), "compile_default": rng.normal(100, 10, 20).tolist(),
             "compile+freezing": rng.normal(95, 10, 20).tolist()}
    result = {"variants": {"fp32_eager": _variant([], first["fp32_eager"]),
                           "compile_default": _variant(["compile"], first["compile_default"]),
                           "compile+freezing": _variant(["compile", "freezing"], first["compile+freezing"])},
              "warnings": [], "seed": 0, "baseline": "fp32_eager"}
    advised = ["compile", "freezing"]
    before = ablation.verification(result, advised)["ablation"]
    step = _steps(before)["freezing"]
    assert step["decision"] == "undecided" and step["credit"]["value"] > 1 >= step["credit"]["ci"][0]
    assert before["kept"] == ["compile", "freezing"] and before["undecided"] == ["freezing"]
    assert "kept, undecided" in step["reason"] and before["recommended"]["changes"] == ["compile", "freezing"]
    assert step["measurement"] == {"variants": ["compile_default", "compile+freezing"], "repetitions": [20, 20],
                                   "processes": [2, 2], "extra_rounds": 0}
    assert ablation.borderline(before) == {"freezing": ["compile_default", "compile+freezing"]}
    calls, extra = [], {}
    busy = {"process": 0, "pid": 1, "other_cpu_load": 1.9, "usable_cpus": 2, "threads": 2, "spare": 0,
            "replaced_by": 1}

    def measure(spec, work_dir=None, **kwargs):  # quieter repetitions of the same variants
        calls.append(sorted(spec["variants"]))
        means = {"compile_default": 100.0, "compile+freezing": 95.0}
        for n in spec["variants"]:
            extra.setdefault(n, []).extend(rng.normal(means[n], 1.0, 40).tolist())
        return {"variants": {n: _variant(c, extra[n][-40:]) for n, c in spec["variants"].items()},
                "warnings": ["process 0: busy"], "discarded_processes": [busy]}

    monkeypatch.setattr(verify.timing, "measure", measure)
    rounds = verify.refine_borderline({"workload": {}}, result, advised, tmp_path)
    # only the two variants the decision compares, FP32 eager not: one round decides it
    assert calls == [["compile+freezing", "compile_default"]] and len(rounds) == 1
    assert rounds[0]["decisions"] == ["freezing"] and rounds[0]["of"] == "refine"
    assert rounds[0]["repetitions"] == {"compile+freezing": 40, "compile_default": 40}
    record = ablation.verification(result, advised)
    after = record["ablation"]
    step = _steps(after)["freezing"]
    pooled = {n: first[n] + extra[n] for n in extra}
    credit = stats.speedup_interval(pooled["compile_default"], pooled["compile+freezing"])
    assert step["credit"]["value"] == credit["speedup"] and step["credit"]["ci"] == [credit["low"], credit["high"]]
    assert step["decision"] == "kept" and credit["low"] > 1 and after["undecided"] == []
    assert step["measurement"] == {"variants": ["compile_default", "compile+freezing"], "repetitions": [60, 60],
                                   "processes": [4, 4], "extra_rounds": 1}
    assert step["reason"].endswith("(decided after 1 more round(s) of measurement: 60 and 60 repetitions over 4 "
                                   "and 4 processes)")
    assert _steps(after)["compile"]["measurement"]["extra_rounds"] == 0
    assert result["variants"]["fp32_eager"]["repetitions"] == 20
    spent = record["measure_more"]["spent_s"]
    assert record["measure_more"] == {"budget_s": verify.DECISION_BUDGET_S, "spent_s": spent, "rounds": 1,
                                      "max_rounds": verify.MAX_ROUNDS, "stopped": "decided", "undecided": [],
                                      "next_estimate_s": None}
    assert record["discarded_processes"] == [{**busy, "measurement": "refine1"}]
    assert "process 0: busy" in record["warnings"]
    assert record["variants"]["compile+freezing"]["processes"] == 4


def test_a_step_still_undecided_when_the_budget_is_spent_is_kept_and_says_so(monkeypatch, tmp_path):
    """Each round takes 50 s (the clock) for its 2 variants: with a budget of 120 s the first round starts (no
    estimate yet), the second too (50 s spent + 50 s estimated fit), a third would end at 150 s: not started. The
    extra samples of both variants are as noisy as the first ones: freezing stays undecided and is kept."""
    rng = np.random.default_rng(7)
    first = {"compile_default": rng.normal(100, 30, 20).tolist(), "compile+freezing": rng.normal(99, 30, 20).tolist()}
    clock, calls, extra = Clock(50.0), [], {}

    def measure(spec, work_dir=None, **kwargs):
        calls.append(sorted(spec["variants"]))
        clock.now += clock.step
        shared = rng.normal(100, 30, 20)
        for n, factor in (("compile_default", 1.0), ("compile+freezing", 0.99)):
            extra.setdefault(n, []).extend((shared * factor).tolist())
        return {"variants": {n: _variant(c, extra[n][-20:]) for n, c in spec["variants"].items()}, "warnings": []}

    def fresh():
        return {"variants": {"fp32_eager": _variant([], rng.normal(300, 3, 20).tolist()),
                             "compile_default": _variant(["compile"], first["compile_default"]),
                             "compile+freezing": _variant(["compile", "freezing"], first["compile+freezing"])},
                "warnings": [], "seed": 0, "baseline": "fp32_eager"}

    monkeypatch.setattr(verify.timing, "measure", measure)
    advised = ["compile", "freezing"]
    result = fresh()
    assert _steps(ablation.decide(result, advised))["freezing"]["decision"] == "undecided"
    more = verify.measure_more({"workload": {}}, result,
                               lambda current: ablation.borderline(ablation.decide(current, advised)), tmp_path,
                               budget_s=120, clock=clock)
    pooled = {n: first[n] + extra[n] for n in extra}
    credit = stats.speedup_interval(pooled["compile_default"], pooled["compile+freezing"])
    assert credit["speedup"] > 1 >= credit["low"]  # still undecided on the pooled 60 repetitions each
    assert len(calls) == 2 and all(c == ["compile+freezing", "compile_default"] for c in calls)
    assert more == {"budget_s": 120, "spent_s": 100.0, "rounds": 2, "max_rounds": verify.MAX_ROUNDS,
                    "stopped": "budget", "undecided": ["freezing"], "next_estimate_s": 50.0}
    assert [(r["estimate_s"], r["seconds"]) for r in result["refined"]] == [(0.0, 50.0), (50.0, 50.0)]
    decision = ablation.decide(result, advised)
    step = _steps(decision)["freezing"]
    assert step["decision"] == "undecided" and decision["kept"] == advised and decision["undecided"] == ["freezing"]
    assert decision["recommended"]["changes"] == advised
    assert step["measurement"]["repetitions"] == [60, 60] and step["measurement"]["processes"] == [6, 6]
    assert step["reason"].endswith("kept, undecided; still undecided after 2 more round(s) (60 and 60 repetitions "
                                   "over 6 and 6 processes): the decision budget (120 s, 100 s spent) allows no "
                                   "further round (the next would take about 50 s)")
    assert any(line.startswith("freezing: undecided: ") and line.endswith("(the next would take about 50 s)")
               for line in decision["recommended"]["trail"])
    # no budget: nothing is measured again, the change is kept undecided all the same
    calls.clear()
    result = fresh()
    assert verify.refine_borderline({"workload": {}}, result, advised, tmp_path, budget_s=0) == []
    step = _steps(ablation.decide(result, advised))["freezing"]
    assert calls == [] and step["decision"] == "undecided" and step["measurement"]["extra_rounds"] == 0
    assert step["reason"].endswith("; not measured more: the decision budget (0 s, 0 s spent) allows no further "
                                   "round")
    # a round estimated from the measurement before (70 s per variant, 2 variants) that would not fit: none
    result = fresh()
    verify.refine_borderline({"workload": {}}, result, advised, tmp_path, budget_s=120, seconds_per_variant=70.0)
    step = _steps(ablation.decide(result, advised))["freezing"]
    assert calls == [] and result["measure_more"]["next_estimate_s"] == 140.0 and step["decision"] == "undecided"
    assert step["reason"].endswith("; not measured more: the decision budget (120 s, 0 s spent) allows no further "
                                   "round (the next would take about 140 s)")
    with pytest.raises(ConfigError, match="decision budget must be 0 s or more"):
        verify.refine_borderline({"workload": {}}, fresh(), advised, tmp_path, budget_s=-1)


def test_an_undecided_guard_is_measured_more_and_a_faster_strong_generic_then_replaces_the_kept_set(monkeypatch,
                                                                                                     tmp_path):
    """Both changes are kept; strong_generic's median is 2 % faster than the kept set with an interval that reaches
    1 (the guard is undecided: nothing replaced). Measured more, it is faster on the whole interval."""
    monkeypatch.setattr(ablation, "requirements", lambda change: {"freezing": ("compile",),
                                                                  "max_autotune": ("compile",)}.get(change, ()))
    rng = np.random.default_rng(21)
    first = {"fp32_eager": rng.normal(100, 1, 20).tolist(), "compile_default": rng.normal(80, 0.8, 20).tolist(),
             "compile+freezing": rng.normal(60, 3, 20).tolist(), "strong_generic": rng.normal(58.8, 3, 20).tolist()}
    changes = {"fp32_eager": [], "compile_default": ["compile"], "compile+freezing": ["compile", "freezing"],
               "strong_generic": ["compile", "max_autotune", "freezing"]}
    result = {"variants": {n: _variant(changes[n], first[n]) for n in first}, "warnings": [], "seed": 0,
              "baseline": "fp32_eager"}
    advised = ["compile", "freezing"]
    before = ablation.decide(result, advised)
    guard, eager_guard = before["recommended"]["guards"]
    assert guard["against"] == "strong_generic" and guard["outcome"] == "undecided"
    assert eager_guard["against"] == "fp32_eager" and eager_guard["outcome"] == "not slower"
    assert guard["ratio"]["value"] < 1 <= guard["ratio"]["ci"][1] and before["recommended"]["source"] == "advised"
    assert ablation.borderline(before) == {"guard:strong_generic": ["strong_generic", "compile+freezing"]}
    assert any("not replaced, undecided" in line for line in before["recommended"]["trail"])
    calls, extra = [], {}

    def measure(spec, work_dir=None, **kwargs):
        calls.append(sorted(spec["variants"]))
        means = {"compile+freezing": 60.0, "strong_generic": 57.0}
        for n in spec["variants"]:
            extra.setdefault(n, []).extend(rng.normal(means[n], 0.3, 40).tolist())
        return {"variants": {n: _variant(c, extra[n][-40:]) for n, c in spec["variants"].items()}, "warnings": []}

    monkeypatch.setattr(verify.timing, "measure", measure)
    verify.refine_borderline({"workload": {}}, result, advised, tmp_path)
    assert calls == [["compile+freezing", "strong_generic"]]
    after = ablation.decide(result, advised)
    recommended = after["recommended"]
    versus = stats.speedup_interval(first["strong_generic"] + extra["strong_generic"],
                                    first["compile+freezing"] + extra["compile+freezing"])
    assert versus["high"] < 1 and recommended["source"] == "strong_generic"
    assert recommended["instead_of"]["vs_strong_generic"]["ci"][1] == versus["high"]
    guard, eager_guard = recommended["guards"]
    assert eager_guard["against"] == "fp32_eager" and eager_guard["outcome"] == "not slower"
    assert guard["outcome"] == "slower" and guard["extra_rounds"] == 1 and guard["repetitions"] == [60, 60]


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
    # every decision and guard was decided on the first measurements: no extra round, none owed
    assert record["refined"] == [] and record["measure_more"]["rounds"] == 0
    assert record["measure_more"]["stopped"] == "decided" and record["measure_more"]["round2"]["stopped"] == "decided"
    assert all(step["measurement"]["extra_rounds"] == 0 for step in record["ablation"]["steps"])
    assert [(g["against"], g["outcome"]) for g in recommended["guards"]] == [
        ("full_advised", "slower"), ("strong_generic", "not slower"), ("fp32_eager", "not slower")]


def test_the_first_round_is_estimated_from_what_the_variants_measured_again_cost_not_the_average_variant(
        monkeypatch, tmp_path):
    """The first measurement averaged 64 s per variant over 3 (strong_generic's max-autotune compile took 180 s):
    that average said a round of 2 variants takes 128 s, over the 120 s budget. The two variants measured again
    cost per process 20 + 1 + 3 s and 22 + 1 + 3 s (build, warm-up, repetitions) and a process 5 s besides: 2
    processes x (5 + 24 + 26) s = 110 s, which fits."""
    rng = np.random.default_rng(7)
    first = {"compile_default": rng.normal(100, 30, 20).tolist(), "compile+freezing": rng.normal(99, 30, 20).tolist()}
    cost = {"fp32_eager": (0.5, 0.5, 3.0), "compile_default": (20.0, 1.0, 3.0), "compile+freezing": (22.0, 1.0, 3.0),
            "strong_generic": (180.0, 10.0, 10.0)}

    def seconds(name):
        build, warmup, repetitions = cost[name]
        return {"build": build, "warmup": warmup, "repetitions": repetitions}

    def measured(variants: dict, samples: dict) -> dict:
        entries = {n: {**_variant(c, samples[n]), "seconds": [seconds(n)] * 2} for n, c in variants.items()}
        wall = 5.0 + sum(sum(cost[n]) for n in variants)
        return {"variants": entries, "warnings": [], "seed": 0, "baseline": "fp32_eager",
                "processes_info": [{"process": i, "wall_s": wall} for i in range(2)]}

    result = measured({"fp32_eager": [], "compile_default": ["compile"], "compile+freezing": ["compile", "freezing"],
                       "strong_generic": ["compile", "max_autotune", "freezing"]},
                      {"fp32_eager": rng.normal(300, 3, 20).tolist(), "strong_generic": rng.normal(200, 3, 20).tolist(),
                       **first})
    costs, overhead = verify.variant_costs(result)
    assert costs == {"fp32_eager": 4.0, "compile_default": 24.0, "compile+freezing": 26.0, "strong_generic": 200.0}
    assert overhead == 5.0
    clock, calls = Clock(110.0), []

    def measure(spec, work_dir=None, **kwargs):
        calls.append(sorted(spec["variants"]))
        clock.now += clock.step
        shared = rng.normal(100, 30, 20)
        return measured(spec["variants"], {"compile_default": shared.tolist(),
                                           "compile+freezing": (shared * 0.99).tolist()})

    monkeypatch.setattr(verify.timing, "measure", measure)
    advised = ["compile", "freezing"]
    assert ablation.borderline(ablation.decide(result, advised)) == {"freezing": ["compile_default",
                                                                                  "compile+freezing"]}
    more = verify.refine_borderline({"workload": {}, "processes": 2}, result, advised, tmp_path, budget_s=120,
                                    seconds_per_variant=(200 + 4 + 24 + 26) / 4 * 2, clock=clock)
    assert calls == [["compile+freezing", "compile_default"]]
    assert more[0]["estimate_s"] == 2 * (5.0 + 24.0 + 26.0) == 110.0
    # the next round would take as long again: 110 + 110 s is over the budget
    assert result["measure_more"]["stopped"] == "budget" and result["measure_more"]["next_estimate_s"] == 110.0
    # variants without recorded seconds: the seconds per variant of the measurement before, as before
    for entry in result["variants"].values():
        entry.pop("seconds")
    result.pop("refined"), result.pop("processes_info")
    calls.clear()
    verify.refine_borderline({"workload": {}, "processes": 2}, result, advised, tmp_path, budget_s=120,
                             seconds_per_variant=64.0, clock=clock)
    assert calls == [] and result["measure_more"]["next_estimate_s"] == 128.0
