"""The optimize page's pairings: operators paired by the FX nodes their kernels compute (an operator Inductor
replaced under freezing) and by the FX rewrites' records (new operator <- the operators it replaces); a rejected
baseline shown as rejected and never compared with; the ablation's credits, interactions and decision trail."""

from __future__ import annotations

import json

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


def _linear_calls_ns(timeline_dir) -> tuple[int, int]:
    """From the timeline alone (not the attribution): the CPU kernel time (ns) of the measured iterations inside an
    aten::linear call (the kernel's own range or one of its ancestors named aten::linear: its aten::addmm and the
    aten::copy_ of the bias included), and the measured iterations."""
    kernels = pd.read_parquet(timeline_dir / "kernels.parquet")
    ranges = pd.read_parquet(timeline_dir / "ranges.parquet").set_index("range_id")
    names, parents = ranges["name"].to_dict(), ranges["parent_id"].to_dict()

    def under_linear(range_id) -> bool:
        while range_id is not None and not pd.isna(range_id):
            if names[int(range_id)] == "aten::linear":
                return True
            range_id = parents[int(range_id)]
        return False

    measured = kernels[kernels["iteration"].notna()]
    inside = measured["range_id"].map(under_linear).astype(bool)
    return int(measured.loc[inside, "duration_ns"].sum()), int(measured["iteration"].nunique())


def test_rewrite_before_of_an_eager_profile_without_module_paths_is_the_replaced_calls_time(tmp_path):
    """An eager mlp of one block has no layer (no repeated block): every kernel of its profile has no module. The
    int8 rewrite's records name blocks.0.fc1 and blocks.0.fc2; the before figure is the measured time of the
    aten::linear calls (with the aten::addmm each runs), not 0, and says that the profile cannot narrow it to the
    rewritten modules."""
    from conftest import torch_flags_kept

    from operator_profiler import stages
    from operator_profiler.capture import harness

    workload = {"kind": "mlp", "compile": False, "width": 16, "expansion": 2, "n_block": 1, "batch_size": 2,
                "seq_len": 4}
    with torch_flags_kept():
        harness.run_capture(workload, {"seed": 0, "warmup": 1, "warmup_max": 2, "iterations": 3}, "cpu",
                            tmp_path / "trace.json.gz", tmp_path / "layers.json", tmp_path / "run.json")
    stages.export_timeline(tmp_path / "trace.json.gz", tmp_path / "timeline")
    stages.attribute_files(tmp_path / "timeline", None, None, tmp_path / "kernels.parquet")
    base = pd.read_parquet(tmp_path / "kernels.parquet")
    assert base["module"].isna().all()  # the "(no module)" profile
    expected_ns, iterations = _linear_calls_ns(tmp_path / "timeline")
    assert iterations == 3 and expected_ns > 0
    own_linear = int(base.loc[base["operator"] == "aten::linear", "duration_ns"].sum())
    assert expected_ns > own_linear  # the calls' addmm counts, not only aten::linear's own (dispatch) time

    rewrites = [{"pass": "quantize_dynamic", "module_path": f"blocks.0.{fc}", "new_node": f"blocks.0.{fc}",
                 "new_op": "quantized::linear_dynamic", "replaced_ops": ["aten::linear"]} for fc in ("fc1", "fc2")]
    variant = pd.DataFrame({"operator": ["quantized::linear_dynamic"], "time_ns": [6_000_000]})
    (pair,) = optimize_page.rewrite_pairs(rewrites, base, iterations, variant, 3).to_dict("records")
    assert pair["before_ms"] == pytest.approx(expected_ns / iterations / 1e6, rel=1e-12)
    assert pair["after_ms"] == pytest.approx(2.0)
    assert "outside the layer ranges" in pair["before_note"]
    page = optimize_page._operators_section(pd.DataFrame(columns=["operator", "side", "a_ms", "b_ms", "delta_ms",
                                                                  "change"]),
                                            pd.DataFrame([pair]), "mlp", "mlp+int8_dynamic")
    assert f'data-v="{pair["before_ms"]}">{pair["before_ms"]:,.3f}</td>' in page
    assert "outside the layer ranges" in page


def _stacked(rows):
    """Attribution rows as an eager CPU profile writes them: each kernel's operator stack in its evidence."""
    return pd.DataFrame([{"operator": stack[-1], "module": module, "iteration": 0, "duration_ns": ns,
                          "evidence": json.dumps({"correlation": {"operator": stack[-1], "stack": stack}})}
                         for stack, module, ns in rows])


def test_rewrite_before_counts_exact_modules_names_a_coarser_region_and_refuses_what_it_cannot_tell():
    linear = ["opprof.iteration:0", "aten::linear"]
    base = _stacked([
        (linear, "enc.0.fc", 1_000_000), (linear + ["aten::addmm"], "enc.0.fc", 4_000_000),
        (linear + ["aten::addmm"], "enc.1.fc", 8_000_000),                    # another module: not counted
        (["opprof.iteration:0", "aten::gelu"], "enc.0.fc", 2_000_000),        # not a replaced call
        (linear + ["aten::addmm"], "enc.2", 16_000_000),                      # a layer instance around enc.2.fc
        (linear + ["aten::addmm"], None, 32_000_000),                         # outside the layer ranges
    ])
    variant = pd.DataFrame({"operator": ["quantized::linear_dynamic"], "time_ns": [1_000_000]})

    def pair(paths):
        rewrites = [{"pass": "quantize_dynamic", "module_path": p, "new_op": "quantized::linear_dynamic",
                     "replaced_ops": ["aten::linear"]} for p in paths]
        (row,) = optimize_page.rewrite_pairs(rewrites, base, 1, variant, 1).to_dict("records")
        return row

    exact = pair(["enc.0.fc"])  # the kernels' own module: exact
    assert exact["before_ms"] == pytest.approx(5.0) and exact["before_note"] == "their calls in the rewritten modules"
    coarse = pair(["enc.0.fc", "enc.2.fc"])  # enc.2's kernels: the layer instance around enc.2.fc
    assert coarse["before_ms"] == pytest.approx(21.0) and "in enc.2 (the layer instances" in coarse["before_note"]
    outside = pair(["head"])  # a module outside every layer instance: the kernels without a module
    assert outside["before_ms"] == pytest.approx(32.0) and "outside the layer ranges" in outside["before_note"]
    whole = pair([""])  # the model itself
    assert whole["before_ms"] == pytest.approx(61.0)
    unknown = pair(["enc.0.fc", None])  # a record without a module path: not a figure
    assert unknown["before_ms"] is None and unknown["before_note"].startswith("n/a: a rewrite record names no module")
    assert "61.000 ms / it. in the whole model" in unknown["before_note"]
    missing = optimize_page.rewrite_pairs([{"pass": "p", "module_path": "enc.0.fc", "new_op": "aten::conv2d",
                                            "replaced_ops": ["aten::batch_norm"]}], base, 1, variant, 1)
    assert missing.loc[0, "before_ms"] is None and missing.loc[0, "before_note"].startswith("n/a: no kernel")
    page = optimize_page._operators_section(pd.DataFrame(columns=["operator", "side", "a_ms", "b_ms", "delta_ms",
                                                                  "change"]), missing, "w", "w+fold")
    assert '<td class="num" data-v="">n/a</td>' in page and "0.000" not in page


def test_rewrite_before_of_a_compiled_profile_counts_the_kernels_of_the_replaced_fx_nodes():
    """In a compiled profile Inductor lowers a replaced ``matmul`` to an ``aten::bmm`` kernel: no replaced operator
    in its name, but its FX source node is one the rewrite replaced. It counts where the record's module and the
    kernel's region agree (here the layer instance around the rewritten attention); another layer's node of the
    same name, and a kernel of a node not replaced, do not."""
    base = pd.DataFrame([
        {"operator": "aten::bmm", "module": "h.0", "source_nodes": ["matmul"], "duration_ns": 2_000_000},
        {"operator": "aten::_softmax+aten::masked_fill", "module": "h.0", "source_nodes": ["att_1", "masked_fill"],
         "duration_ns": 1_000_000},
        {"operator": "aten::clone", "module": "h.0", "source_nodes": ["transpose_3", "view"], "duration_ns": 500_000},
        {"operator": "aten::addmm", "module": "h.0", "source_nodes": ["linear"], "duration_ns": 8_000_000},
        {"operator": "aten::bmm", "module": "h.1", "source_nodes": ["matmul_2"], "duration_ns": 4_000_000},
        {"operator": "aten::bmm", "module": "h.2", "source_nodes": ["matmul"], "duration_ns": 16_000_000},
    ])
    rewrites = [{"pass": "attention_to_sdpa", "new_op": "aten::scaled_dot_product_attention",
                 "module_path": f"h.{i}.attn", "replaced_nodes": [f"matmul{s}", "att_1", "masked_fill"],
                 "removed_nodes": ["transpose_3"],
                 "replaced_ops": ["aten::matmul", "aten::softmax", "aten::masked_fill"]}
                for i, s in ((0, ""), (1, "_2"))]
    variant = pd.DataFrame({"operator": ["aten::_scaled_dot_product_flash_attention_for_cpu"], "time_ns": [1_000_000]})
    (pair,) = optimize_page.rewrite_pairs(rewrites, base, 1, variant, 1).to_dict("records")
    # h.0: bmm 2 + fused softmax 1 + the erased transpose's clone 0.5; h.1: bmm 4; not h.0's addmm nor h.2's bmm
    assert pair["before_ms"] == pytest.approx(7.5)
    assert "with the compiled kernels of their FX nodes" in pair["before_note"]
    assert "in h.0, h.1 (the layer instances" in pair["before_note"]
    without_nodes = [{k: v for k, v in r.items() if k not in ("replaced_nodes", "removed_nodes")} for r in rewrites]
    (by_name,) = optimize_page.rewrite_pairs(without_nodes, base, 1, variant, 1).to_dict("records")
    assert by_name["before_ms"] == pytest.approx(1.0)  # the operator names alone: only the fused softmax kernel


@pytest.mark.workflow
@pytest.mark.parametrize("scope", ["model", "layers"])
def test_rewrite_before_of_a_real_compiled_gpt2_counts_its_bmm_kernels(tmp_path, scope):
    """A real compiled GPT-2 (explicit attention) profiled as the workflow does, and its sdpa_rewrite variant: the
    rewrite's "before" counts the aten::bmm kernels of the replaced matmul nodes (found in the base profile by their
    fusion-map FX nodes, computed here independently), as well as the kernels named after the replaced operators.
    Compiled layer by layer, the one record's module path is relative to the compiled layer ("attn"): it is read in
    each layer instance, and no kernel outside the layers (the lm_head's matmul) counts."""
    from operator_profiler import stages
    from operator_profiler.config import validate_config
    from operator_profiler.transforms.variants import variant_workload

    workload = {"kind": "gpt2", "compile": True, "compile_scope": scope, "n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64,
                "n_positions": 16, "batch_size": 1, "seq_len": 16}
    harness = {"seed": 0, "warmup": 1, "iterations": 2}
    config = validate_config({"device": "cpu", "harness": harness, "workloads": {"g": workload}})
    env = dict.fromkeys(stages.THREAD_ENV, "1")
    stages.profile_files("g", config["workloads"]["g"], config["harness"], "cpu", tmp_path / "g", config, env=env)
    changed = variant_workload(config["workloads"]["g"], ["sdpa_rewrite"])
    stages.profile_files("g+sdpa_rewrite", changed, config["harness"], "cpu", tmp_path / "v", config, env=env)
    run = json.loads((tmp_path / "v" / "capture" / "run.json").read_text())
    rewrites = run["rewrites"]
    records = [r for r in rewrites if r.get("new_op") == "aten::scaled_dot_product_attention"]
    assert len(records) == (2 if scope == "model" else 1)
    base = pd.read_parquet(tmp_path / "g" / "attribution" / "kernels.parquet")
    base = base[base["iteration"].notna()]
    layers = optimize_page.rewritten_layers(run, base)
    assert layers == (None if scope == "model" else ["transformer.h.0", "transformer.h.1"])
    matmuls = {n for r in records for n in r["replaced_nodes"] if n.startswith("matmul")}
    bmm = base[(base["operator"] == "aten::bmm")
               & base["source_nodes"].map(lambda nodes: bool(set(map(str, nodes)) & matmuls))]
    assert len(bmm) and bmm["duration_ns"].sum() > 0
    variant_ops = pd.read_parquet(tmp_path / "v" / "operators.parquet")
    (pair,) = optimize_page.rewrite_pairs(rewrites, base, 2, variant_ops, 2, layers).to_dict("records")
    in_layers = base["module"].astype(str).str.startswith("transformer.h.")
    named = in_layers & base["operator"].astype(str).map(
        lambda op: bool({"aten::softmax", "aten::_softmax", "aten::masked_fill", "aten::mul", "aten::matmul"}
                        & set(op.split("+"))))
    bmm = bmm[bmm["module"].astype(str).str.startswith("transformer.h.")]
    assert len(bmm) == 4 * base["iteration"].nunique()  # two per attention, in each layer, each iteration
    attention_ns = bmm["duration_ns"].sum() + base.loc[named & ~base.index.isin(bmm.index), "duration_ns"].sum()
    assert pair["before_ms"] >= attention_ns / 2 / 1e6 - 1e-12
    # nothing outside the layers: the lm_head's matmul is not the rewritten attention's
    assert pair["before_ms"] <= base.loc[in_layers, "duration_ns"].sum() / 2 / 1e6 + 1e-12
    assert pair["modules"] == ["transformer.h.0.attn", "transformer.h.1.attn"]
    assert "with the compiled kernels of their FX nodes" in pair["before_note"]
