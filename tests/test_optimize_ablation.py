"""The ablation never recommends less than it measured (optimize.ablation): each advised change is decided by
removing it from the full advised set (leave-one-out), a change whose gain only appears with another is kept and
reported as an interaction, a wide interval keeps its change as "undecided" instead of dropping it, and a
verified strong_generic that is faster is recommended instead. Timing results here are seeded samples (no real
timing: the measurement itself is tests/test_optimize_timing.py's)."""

from __future__ import annotations

import numpy as np
import pytest

from operator_profiler.optimize import ablation, stats

FIXED_REQUIREMENTS = {"freezing": ("compile",), "max_autotune": ("compile",)}
STRONG = ["compile", "max_autotune", "freezing"]


@pytest.fixture(autouse=True)
def fixed_requirements(monkeypatch):
    """The requirements these tests assume, whatever the merged catalog declares."""
    monkeypatch.setattr(ablation, "requirements", lambda change: FIXED_REQUIREMENTS.get(change, ()))


def _result(means: dict[str, tuple[list[str], float]], spread: float = 0.01, n: int = 30, seed: int = 11,
            rejected: dict[str, str] | None = None) -> dict:
    """A timing result: ``n`` normal samples per variant around its mean, sd = ``spread`` x the mean."""
    rng = np.random.default_rng(seed)
    variants = {}
    for name, (changes, mean) in means.items():
        reason = (rejected or {}).get(name)
        variants[name] = {"changes": changes, "rejected": reason}
        if not reason:
            samples = np.abs(rng.normal(mean, spread * mean, n)).tolist()
            variants[name].update(samples_ms=samples, median_ms=float(np.median(samples)))
    base = variants["fp32_eager"]["samples_ms"]
    for entry in variants.values():
        if not entry["rejected"]:
            ratio = stats.speedup_interval(base, entry["samples_ms"])
            entry["speedup"] = {"vs": "fp32_eager", "value": ratio["speedup"], "ci": [ratio["low"], ratio["high"]],
                                "shows_gain": ratio["shows_gain"]}
    return {"variants": variants, "warnings": [], "seed": 0, "baseline": "fp32_eager"}


def _planned(advised: list[str], means: dict[frozenset, float], strong: list[str] = STRONG) -> dict:
    """Every variant :func:`ablation.plan` measures for ``advised``, with its mean from ``means`` (by change set)."""
    planned = ablation.plan(advised, {"fp32_eager": [], "compile_default": ["compile"], "strong_generic": strong})
    missing = [name for name, changes in planned.items() if frozenset(changes) not in means]
    assert not missing, missing
    return {name: (changes, means[frozenset(changes)]) for name, changes in planned.items()}


def _steps(decision: dict) -> dict:
    return {step["change"]: step for step in decision["steps"]}


def _not_slower(result: dict, recommended: dict, than: str) -> bool:
    """The recommended variant is not slower than ``than``: the ratio's interval does not lie below 1."""
    ratio = stats.speedup_interval(result["variants"][than]["samples_ms"],
                                   result["variants"][recommended["variant"]]["samples_ms"])
    return ratio["high"] >= 1


def test_a_change_whose_gain_only_appears_with_another_is_kept_and_reported_as_an_interaction():
    """Freezing on top of compile gains nothing; with bf16 autocast it removes the per-iteration weight casts."""
    advised = ["compile", "freezing", "bf16_autocast"]
    f = frozenset
    result = _result(_planned(advised, {
        f(): 100.0, f(["compile"]): 95.0, f(STRONG): 60.0, f(["compile", "freezing"]): 95.0,
        f(["bf16_autocast"]): 55.0, f(["compile", "bf16_autocast"]): 60.0,
        f(["compile", "freezing", "bf16_autocast"]): 32.0}))
    decision = ablation.decide(result, advised)
    freezing = _steps(decision)["freezing"]
    assert freezing["speedup"]["ci"][0] <= 1  # its step in the advised order: the old ablation dropped it
    assert freezing["decision"] == "kept" and freezing["leave_one_out"]["variant"] == "compile+bf16_autocast"
    assert freezing["credit"]["ci"][0] > 1.8  # 60 / 32
    # what the decision rests on: the two variants it compared, 30 repetitions each, no extra round (decided)
    assert freezing["measurement"] == {"variants": ["compile+bf16_autocast", "compile+freezing+bf16_autocast"],
                                       "repetitions": [30, 30], "processes": [None, None], "extra_rounds": 0}
    assert ablation.borderline(decision) == {}
    assert freezing["interaction"].startswith("interacts: its credit in the full set")
    assert "freezing" in [i["change"] for i in decision["interactions"]]
    assert _steps(decision)["bf16_autocast"]["interaction"] is None  # its step is its leave-one-out
    assert decision["recommended"]["changes"] == advised and decision["recommended"]["source"] == "advised"


LOADED_RESNET = ["compile", "freezing", "channels_last", "conv_bn_fold"]


def _loaded_resnet_means() -> dict:
    f = frozenset
    return {f(): 100.0, f(["compile"]): 90.0, f(STRONG): 58.8, f(["channels_last"]): 95.0,
            f(["conv_bn_fold"]): 97.0, f(["compile", "freezing"]): 80.0,
            f(["compile", "freezing", "channels_last"]): 66.0, f(LOADED_RESNET): 55.0,  # 1.82x; strong 1.70x
            f(["channels_last", "conv_bn_fold"]): 88.0, f(["compile", "channels_last", "conv_bn_fold"]): 64.0,
            f(["compile", "freezing", "conv_bn_fold"]): 70.0}


def test_a_loaded_machine_whose_every_step_is_wide_still_recommends_the_full_advised_set():
    """ResNet-50 on a loaded machine: every step's interval reached below 1, so the old ablation dropped every
    change and recommended FP32 eager, although the full advised set measured 1.82x and strong_generic 1.70x."""
    result = _result(_planned(LOADED_RESNET, _loaded_resnet_means()), spread=0.3, n=20, seed=0)
    decision = ablation.decide(result, LOADED_RESNET)
    assert all(step["speedup"]["ci"][0] <= 1 for step in decision["steps"])  # the scenario: every step wide
    assert decision["dropped"] == [] and decision["kept"] == LOADED_RESNET
    assert {s["decision"] for s in decision["steps"]} <= {"kept", "undecided"}
    recommended = decision["recommended"]
    assert recommended["changes"] == ["compile", "freezing", "channels_last", "conv_bn_fold"]
    assert recommended["variant"] == "compile+freezing+channels_last+conv_bn_fold"
    assert _not_slower(result, recommended, "strong_generic") and recommended["slower_than_strong_generic"] is False


def test_without_the_leave_one_out_variants_every_change_is_kept_the_conservative_choice():
    """A result measured before the leave-one-out variants were planned (only baselines, alone and prefixes)."""
    means = _loaded_resnet_means()
    planned = _planned(LOADED_RESNET, means)
    for changes in ([["channels_last", "conv_bn_fold"], ["compile", "channels_last", "conv_bn_fold"],
                     ["compile", "freezing", "conv_bn_fold"]]):
        del planned[ablation.variant_name(changes)]
    decision = ablation.decide(_result(planned, spread=0.3, n=20, seed=0), LOADED_RESNET)
    steps = _steps(decision)
    for change in ("compile", "freezing", "channels_last"):
        assert steps[change]["decision"] == "kept" and steps[change]["basis"] == "not_measured"
        assert steps[change]["reason"].endswith("was not measured: kept, the conservative choice")
    assert decision["recommended"]["changes"] == LOADED_RESNET


def test_gpt2_never_gets_less_than_its_full_advised_variant():
    """GPT-2 on a 2-core CPU: compile+freezing 1.06x, strong_generic 1.23x, freezing's step 1.00x; the old
    ablation recommended compile alone (1.06x), 0.86x of strong_generic, and said so but still recommended it."""
    advised = ["compile", "freezing"]
    f = frozenset
    means = {f(): 100.0, f(["compile"]): 94.3, f(["compile", "freezing"]): 94.3, f(STRONG): 81.3}
    result = _result(_planned(advised, means), spread=0.04, n=20, seed=7)
    recommended = ablation.decide(result, advised)["recommended"]
    assert set(advised) <= set(recommended["changes"])
    assert _not_slower(result, recommended, "compile+freezing")
    assert recommended["source"] == "strong_generic" and recommended["changes"] == STRONG
    # strong_generic rejected (a miscompile): whatever is recommended is not slower than the full advised variant
    rejected = _result(_planned(advised, means), spread=0.04, n=20, seed=7,
                       rejected={"strong_generic": "process 0: numerics: max_rel 0.025"})
    recommended = ablation.decide(rejected, advised)["recommended"]
    assert recommended["measured"] and recommended["vs_strong_generic"] is None
    assert _not_slower(rejected, recommended, "compile+freezing")
    assert recommended.get("vs_advised") is None or recommended["vs_advised"]["ci"][1] >= 1


def test_a_faster_strong_generic_is_recommended_with_the_reason_and_one_within_the_noise_is_not():
    advised = ["compile", "sdpa_rewrite"]
    f = frozenset
    means = {f(): 100.0, f(["compile"]): 80.0, f(["sdpa_rewrite"]): 90.0, f(["compile", "sdpa_rewrite"]): 70.0,
             f(STRONG): 50.0}
    result = _result(_planned(advised, means))
    record = ablation.verification(result, advised)
    recommended = record["ablation"]["recommended"]
    assert record["ablation"]["kept"] == advised  # the advised changes earn their place ...
    assert recommended["source"] == "strong_generic" and recommended["changes"] == STRONG  # ... and are beaten
    assert recommended["instead_of"]["changes"] == advised
    assert recommended["instead_of"]["vs_strong_generic"]["ci"][1] < 1
    assert recommended["reason"].startswith("strong_generic is faster than compile+sdpa_rewrite")
    assert any("recommending strong_generic's changes" in line for line in recommended["trail"])
    assert any(w.startswith("the recommendation is compile+max_autotune+freezing (strong_generic) instead of "
                            "compile+sdpa_rewrite") for w in record["warnings"])
    # a quiet GPT-2: the advised set 0.99x of strong_generic, an interval containing 1: not "slower", not replaced
    means[f(STRONG)] = 69.0
    result = _result(_planned(advised, means), spread=0.05, n=20)
    record = ablation.verification(result, advised)
    recommended = record["ablation"]["recommended"]
    versus = recommended["vs_strong_generic"]
    assert versus["value"] < 1 <= versus["ci"][1]
    assert recommended["source"] == "advised" and recommended["slower_than_strong_generic"] is False
    assert not any("slower than strong_generic" in w or "instead of" in w for w in record["warnings"])


def test_an_undecided_change_is_kept_and_called_undecided_and_an_undecided_loss_is_dropped():
    advised = ["compile", "freezing"]
    f = frozenset
    # freezing: a 1.3x median gain whose interval reaches below 1 on a noisy machine
    result = _result(_planned(advised, {f(): 200.0, f(["compile"]): 100.0, f(["compile", "freezing"]): 77.0,
                                        f(STRONG): 90.0}), spread=0.4, n=10, seed=3)
    decision = ablation.decide(result, advised)
    freezing = _steps(decision)["freezing"]
    assert freezing["credit"]["value"] > 1.2 and freezing["credit"]["ci"][0] <= 1
    assert freezing["decision"] == "undecided" and freezing["reason"].endswith("kept, undecided")
    assert decision["undecided"] == ["freezing"] and decision["kept"] == advised
    assert decision["recommended"]["changes"] == advised
    assert any(line.startswith("freezing: undecided: ") for line in decision["recommended"]["trail"])
    # a median loss within the noise: removing it is not slower, so it is dropped, with the figure
    result = _result(_planned(advised, {f(): 200.0, f(["compile"]): 100.0, f(["compile", "freezing"]): 101.0,
                                        f(STRONG): 110.0}), spread=0.1, n=10, seed=3)
    decision = ablation.decide(result, advised)
    freezing = _steps(decision)["freezing"]
    assert freezing["decision"] == "dropped" and freezing["credit"] is None
    assert freezing["reason"].startswith("removing it is not slower: the full set is 0.")
    assert decision["recommended"]["changes"] == ["compile"] and decision["recommended"]["vs_advised"]["ci"][1] >= 1


def test_a_change_without_which_the_set_is_rejected_is_kept():
    advised = ["compile", "freezing", "bf16_autocast"]
    f = frozenset
    means = {f(): 100.0, f(["compile"]): 95.0, f(STRONG): 60.0, f(["compile", "freezing"]): 90.0,
             f(["bf16_autocast"]): 55.0, f(["compile", "bf16_autocast"]): 50.0,
             f(["compile", "freezing", "bf16_autocast"]): 52.0}
    result = _result(_planned(advised, means),
                     rejected={"compile+bf16_autocast": "process 0: numerics: against eager bfloat16: max_rel 0.03"})
    freezing = _steps(ablation.decide(result, advised))["freezing"]
    assert freezing["decision"] == "kept" and freezing["basis"] == "rejected_without_it"
    assert "was rejected (process 0: numerics" in freezing["reason"]


def test_dropping_two_changes_that_stand_in_for_each_other_is_checked_against_the_full_set():
    """sdpa_rewrite and channels_last each cost nothing to remove, but not both: the kept set (compile +
    conv_bn_fold) was not measured, so it is not quoted; when it cannot be measured the full set is recommended."""
    advised = ["compile", "sdpa_rewrite", "channels_last", "conv_bn_fold"]
    f = frozenset
    means = {f(): 100.0, f(["compile"]): 80.0, f(STRONG): 75.0, f(["sdpa_rewrite"]): 95.0,
             f(["channels_last"]): 95.0, f(["conv_bn_fold"]): 97.0, f(["compile", "sdpa_rewrite"]): 60.0,
             f(["compile", "sdpa_rewrite", "channels_last"]): 60.0, f(advised): 51.0,
             f(["sdpa_rewrite", "channels_last", "conv_bn_fold"]): 90.0,
             f(["compile", "channels_last", "conv_bn_fold"]): 50.0,
             f(["compile", "sdpa_rewrite", "conv_bn_fold"]): 50.0}
    result = _result(_planned(advised, means))
    decision = ablation.decide(result, advised)
    assert [d["change"] for d in decision["dropped"]] == ["sdpa_rewrite", "channels_last"]
    assert decision["recommended"]["changes"] == ["compile", "conv_bn_fold"]
    assert decision["recommended"]["measured"] is False
    assert decision["recommended"]["trail"][-1] == "recommended compile+conv_bn_fold, not measured as a whole"
    final = ablation.recommend(result, ["compile", "conv_bn_fold"], advised, final=True)
    assert final["source"] == "full_advised" and final["measured"] is True
    assert final["changes"] == ablation.closure(advised)


def test_a_recommendation_slower_than_fp32_eager_gives_way_to_the_fastest_faster_variant_or_to_no_change():
    f = frozenset
    advised = ["compile", "freezing"]
    # compile+freezing and strong_generic both slower than doing nothing (0.74x and 0.67x of FP32 eager)
    means = {f(): 100.0, f(["compile"]): 140.0, f(["compile", "freezing"]): 135.0, f(STRONG): 150.0}
    result = _result(_planned(advised, means))
    recommended = ablation.recommend(result, advised, advised)
    eager = result["variants"]["fp32_eager"]["samples_ms"]
    slow = result["variants"]["compile+freezing"]["samples_ms"]
    guard = next(g for g in recommended["guards"] if g["against"] == "fp32_eager")
    assert guard["outcome"] == "slower" and guard["variants"] == ["fp32_eager", "compile+freezing"]
    assert guard["ratio"]["value"] == pytest.approx(np.median(eager) / np.median(slow))
    assert guard["ratio"]["value"] == pytest.approx(100 / 135, rel=0.02) and guard["ratio"]["ci"][1] < 1
    assert recommended["source"] == "fp32_eager" and recommended["changes"] == []
    assert recommended["name"] == "fp32_eager" and recommended["variant"] == "fp32_eager"
    assert recommended["median_ms"] == pytest.approx(np.median(eager))
    assert recommended["instead_of"]["changes"] == advised
    assert recommended["reason"].startswith("compile+freezing is slower than FP32 eager (fp32_eager, no change): 0.7")
    assert any(line.endswith("no verified variant is faster than FP32 eager; recommending FP32 eager (no change)")
               for line in recommended["trail"])
    assert recommended["trail"][-1].startswith("recommended: fp32_eager")
    strong = result["variants"]["strong_generic"]["samples_ms"]
    assert recommended["vs_strong_generic"]["value"] == pytest.approx(np.median(strong) / np.median(eager))
    assert recommended["slower_than_strong_generic"] is False
    record = ablation.verification(result, advised)
    assert record["ablation"]["recommended"]["source"] == "fp32_eager"
    assert any(w.startswith("the recommendation is fp32_eager (fp32_eager) instead of ") for w in record["warnings"])
    # two verified variants faster than FP32 eager: the faster of them (1.25x) is recommended, not the 1.11x one
    result = _result({"fp32_eager": ([], 100.0), "compile_default": (["compile"], 140.0),
                      "compile+freezing": (["compile", "freezing"], 135.0), "sdpa_rewrite": (["sdpa_rewrite"], 80.0),
                      "channels_last": (["channels_last"], 90.0), "strong_generic": (STRONG, 150.0)})
    recommended = ablation.recommend(result, advised, advised)
    assert recommended["source"] == "faster_variant" and recommended["changes"] == ["sdpa_rewrite"]
    assert recommended["variant"] == "sdpa_rewrite"
    fast = result["variants"]["sdpa_rewrite"]["samples_ms"]
    eager = result["variants"]["fp32_eager"]["samples_ms"]
    assert recommended["speedup"]["value"] == pytest.approx(np.median(eager) / np.median(fast))
    assert any("recommending the fastest verified variant faster than FP32 eager, sdpa_rewrite (1.2" in line
               for line in recommended["trail"])
    # a median below 1 whose interval reaches 1: not replaced, undecided, and measured more
    result = _result(_planned(advised, {f(): 100.0, f(["compile"]): 100.0, f(["compile", "freezing"]): 101.0,
                                        f(STRONG): 130.0}), spread=0.1, n=20, seed=5)
    recommended = ablation.recommend(result, advised, advised)
    guard = next(g for g in recommended["guards"] if g["against"] == "fp32_eager")
    assert guard["ratio"]["value"] < 1 <= guard["ratio"]["ci"][1] and guard["outcome"] == "undecided"
    assert recommended["changes"] == advised and recommended["source"] == "advised"
    assert ablation.borderline({"recommended": recommended})["guard:fp32_eager"] == ["fp32_eager", "compile+freezing"]


def test_an_interval_bound_on_the_other_side_of_1_never_prints_as_1():
    from operator_profiler.figures import apart
    from operator_profiler.report import optimize_page

    assert ablation.figure({"value": 1.07, "ci": [1.00003, 1.14]}) == "1.070x [1.00003, 1.140]"
    assert ablation.figure({"value": 0.95, "ci": [0.9, 0.99998]}) == "0.950x [0.900, 0.99998]"
    assert ablation.figure({"value": 1.0, "ci": [1.0, 1.2]}) == "1.000x [1.000, 1.200]"  # exactly 1 stays short
    assert optimize_page._interval(1.07, [1.00003, 1.14], "x") == "1.070x [1.00003, 1.140]"
    assert apart(1.004, digits=2) == "1.004" and apart(1.006, digits=2) == "1.01"
