"""The optimize page's pairings: operators paired by the FX nodes their kernels compute (an operator Inductor
replaced under freezing) and by the FX rewrites' records (new operator <- the operators it replaces); a rejected
baseline shown as rejected and never compared with; the ablation's credits, interactions and decision trail."""

from __future__ import annotations

import pandas as pd
import pytest

from operator_profiler.report import optimize_page


def _kernels(rows):
    return pd.DataFrame([{"operator": op, "module": module, "source_nodes": nodes, "duration_ns": ns}
                         for op, module, nodes, ns in rows])


def test_node_groups_pair_a_replaced_operator_and_join_what_a_fused_kernel_computes():
    before = _kernels([("aten::addmm", "blocks.0", ["linear"], 4_000_000),
                       ("aten::gelu", "blocks.0", ["gelu"], 1_000_000),
                       ("aten::addmm", "blocks.0", ["linear_1"], 3_000_000),
                       ("aten::addmm", "blocks.1", ["linear"], 4_000_000)])
    after = _kernels([("mkl::_mkl_linear", "blocks.0", ["linear"], 2_000_000),
                      ("aten::addmm+aten::gelu", "blocks.0", ["gelu", "linear_1"], 2_500_000),
                      ("mkl::_mkl_linear", "blocks.1", ["linear"], 2_000_000)])
    groups = optimize_page.node_groups(before, after, iterations_a=2, iterations_b=1)
    by_nodes = {(g["module"], tuple(g["nodes"])): g for g in groups.to_dict("records")}
    # the fused kernel joins gelu and linear_1 of blocks.0 into one group
    fused = by_nodes[("blocks.0", ("gelu", "linear_1"))]
    assert fused["before_ms"] == pytest.approx((1.0 + 3.0) / 2) and fused["after_ms"] == pytest.approx(2.5)
    assert fused["before_ops"] == ["aten::addmm", "aten::gelu"] and fused["after_ops"] == ["aten::addmm+aten::gelu"]
    # linear of each block: addmm -> mkl linear, modules kept apart
    for module in ("blocks.0", "blocks.1"):
        g = by_nodes[(module, ("linear",))]
        assert g["before_ops"] == ["aten::addmm"] and g["after_ops"] == ["mkl::_mkl_linear"]
        assert g["before_ms"] == pytest.approx(2.0) and g["after_ms"] == pytest.approx(2.0)
    assert len(groups) == 3
    # an eager profile has no FX nodes: nothing to pair by them
    eager = before.assign(source_nodes=[[]] * len(before))
    assert optimize_page.node_groups(eager, after, 2, 1).empty


def test_rewrite_pairs_sum_the_replaced_operators_in_the_rewritten_modules():
    rewrites = [{"pass": "attention_to_sdpa", "new_op": "aten::scaled_dot_product_attention",
                 "replaced_ops": ["aten::matmul", "aten::mul", "aten::masked_fill", "aten::softmax"],
                 "module_path": f"transformer.h.{i}.attn"} for i in range(2)]
    rewrites.append({"pass": "attention_to_sdpa", "skipped": "dropout", "new_op": None})
    base = pd.DataFrame([
        {"operator": "aten::matmul", "module": "transformer.h.0.attn", "duration_ns": 3_000_000},
        {"operator": "aten::softmax", "module": "transformer.h.1.attn", "duration_ns": 1_000_000},
        {"operator": "aten::matmul", "module": "transformer.h.0.mlp", "duration_ns": 9_000_000},   # not rewritten
        {"operator": "aten::addmm", "module": "transformer.h.0.attn", "duration_ns": 5_000_000},   # not replaced
    ])
    variant = pd.DataFrame({"operator": ["aten::scaled_dot_product_attention",
                                         "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::addmm"],
                            "time_ns": [1_000_000, 2_000_000, 5_000_000]})
    (pair,) = optimize_page.rewrite_pairs(rewrites, base, 2, variant, 2).to_dict("records")
    assert pair["rewrites"] == 2 and pair["before_ms"] == pytest.approx((3.0 + 1.0) / 2)
    assert pair["after_ms"] == pytest.approx(3.0 / 2)
    assert pair["modules"] == ["transformer.h.0.attn", "transformer.h.1.attn"]


def test_a_rejected_strong_generic_is_shown_rejected_and_the_recommendation_is_not_compared_with_it():
    """A miscompiling strong_generic: the record of a measurement whose strong_generic failed its numerics against eager bf16
    (fields: docs/optimize.md#the-verification-record)."""
    from operator_profiler.optimize import ablation

    reason = ("process 0: numerics: against eager bfloat16 (bf16_autocast, no other change): max_rel 0.025 exceeds "
              "the bound against eager bfloat16 (...) 0.0132")
    samples = [10.0 + 0.01 * i for i in range(20)]
    result = {"workload": "w", "device": "cpu", "threads": 1, "repetitions": 20, "processes": 2,
              "baseline": "fp32_eager", "warnings": [],
              "variants": {"fp32_eager": {"changes": [], "rejected": None, "samples_ms": samples, "median_ms": 10.1,
                                          "ci_ms": [10.05, 10.15], "speedup": None},
                           "strong_generic": {"changes": ["compile", "max_autotune", "freezing", "bf16_autocast"],
                                              "rejected": reason, "speedup": None,
                                              "numerics": {"max_rel": 0.026, "cosine": 0.9995, "ok": True},
                                              "numerics_in_dtype": {"against": "eager bfloat16", "ok": False,
                                                                    "max_rel": 0.025}}}}
    record = ablation.verification(result, [])
    assert record["rejected_baselines"] == {"strong_generic": reason}
    html = optimize_page._variants_section(record) + optimize_page._ablation_section(record)
    assert f"rejected: {reason}" in html
    assert "<strong>strong_generic was rejected</strong> (" + reason + "): the recommendation is not compared" in html
    assert "against strong_generic" not in html


def test_the_ablation_shows_each_credit_beside_its_step_the_interactions_and_the_decision_trail(monkeypatch):
    import numpy as np

    from operator_profiler.optimize import ablation

    monkeypatch.setattr(ablation, "requirements", lambda change: {"freezing": ("compile",),
                                                                  "max_autotune": ("compile",)}.get(change, ()))
    rng = np.random.default_rng(1)
    means = {"fp32_eager": ([], 100.0), "compile_default": (["compile"], 95.0),
             "strong_generic": (["compile", "max_autotune", "freezing"], 20.0),
             "compile+freezing": (["compile", "freezing"], 95.0), "bf16_autocast": (["bf16_autocast"], 55.0),
             "compile+bf16_autocast": (["compile", "bf16_autocast"], 60.0),
             "compile+freezing+bf16_autocast": (["compile", "freezing", "bf16_autocast"], 32.0)}
    result = {"workload": "w", "device": "cpu", "threads": 1, "repetitions": 20, "processes": 2,
              "baseline": "fp32_eager", "warnings": [], "seed": 0,
              "variants": {name: {"changes": changes, "rejected": None, "samples_ms": rng.normal(m, 0.5, 20).tolist(),
                                  "median_ms": m, "ci_ms": [m - 1, m + 1], "speedup": None}
                           for name, (changes, m) in means.items()}}
    record = ablation.verification(result, ["compile", "freezing", "bf16_autocast"])
    html = optimize_page._ablation_section(record)
    assert ">loss when removed: the full set's speedup [95% CI]</th>" in html
    assert "<td>compile+bf16_autocast</td>" in html  # freezing's leave-one-out variant
    assert "<strong>interacts: its credit in the full set" in html
    assert "Decision trail:</p><ol><li>the full advised set compile+freezing+bf16_autocast verified" in html
    # strong_generic (5x) is faster than the advised set (3.1x): recommended instead, with the reason
    assert "Recommended: <strong>compile + max_autotune + freezing</strong>" in html
    assert "<strong>instead of compile + freezing + bf16_autocast</strong>: strong_generic is faster than" in html
    # each decision's repetitions (the two variants it compared), the guards with theirs
    assert ">repetitions: without / with it</th>" in html
    assert html.count("<td>20 / 20</td>") == 3
    assert ("<li>against strong_generic (strong_generic vs compile+freezing+bf16_autocast): "
            in html and "<strong>slower</strong>; repetitions 20 / 20</li>" in html)
    assert "Processes discarded" not in html and "Borderline decisions measured again" not in html


def test_the_ablation_shows_the_extra_rounds_of_a_decision_and_the_discarded_busy_processes():
    record = {"ablation": {"basis": "leave_one_out", "steps": [
        {"change": "freezing", "context": ["compile"], "speedup": None, "decision": "undecided",
         "reason": "kept, undecided; still undecided after 2 more round(s)", "interaction": None,
         "leave_one_out": {"variant": "compile_default", "without": ["compile"], "speedup": None},
         "measurement": {"variants": ["compile_default", "compile+freezing"], "repetitions": [60, 60],
                         "processes": [6, 6], "extra_rounds": 2}}],
        "recommended": {"changes": ["compile", "freezing"], "trail": [], "guards": []}},
        "variants": {}, "measure_more": {"budget_s": 120, "spent_s": 130.4, "rounds": 2, "stopped": "budget",
                                         "undecided": ["freezing"]},
        "refined": [{"round": 1, "of": "refine", "decisions": ["freezing"],
                     "variants": ["compile+freezing", "compile_default"], "seconds": 64.0},
                    {"round": 2, "of": "refine", "decisions": ["freezing"],
                     "variants": ["compile+freezing", "compile_default"], "seconds": 66.4}],
        "discarded_processes": [{"process": 0, "other_cpu_load": 1.8, "spare": 0, "replaced_by": 2,
                                 "measurement": "refine1"}]}
    html = optimize_page._ablation_section(record)
    assert "<td>60 / 60 (6 / 6 processes), 2 more rounds</td>" in html
    assert ("<p>Borderline decisions measured again: 2 round(s), 130 s of the 120 s budget; still undecided: "
            "freezing (budget).</p>") in html
    assert "Rounds: 1 (refine) for freezing: compile+freezing, compile_default, 64 s; 2 (refine)" in html
    assert ("Processes discarded because other processes kept the CPUs busy: refine1 process 0 (1.8 CPUs busy, 0 "
            "spare; process 2 kept in its place).") in html
