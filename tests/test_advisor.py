"""The advisor: the rule catalog over profiles built here (operators and attribution tables with known shares), the
catalog's checks, and the measures' values computed independently from the tables."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from operator_profiler.errors import ConfigError
from operator_profiler.optimize import advisor, evidence
from operator_profiler.report import advice_view, optimize_page

NO_BF16 = {"device": "cpu", "native_bf16": False, "flags": ["avx512f", "avx512_vnni"]}
WITH_BF16 = {"device": "cpu", "native_bf16": True, "flags": ["avx512f", "avx512_bf16"]}


def _operators(rows: list[dict]) -> pd.DataFrame:
    ops = pd.DataFrame(rows)
    total = ops["time_ns"].sum()
    ops["time_share"] = ops["time_ns"] / total
    ops["kernels"] = ops.get("kernels", pd.Series(30, index=ops.index))
    ops["mean_kernel_ns"] = ops["time_ns"] / ops["kernels"]
    for column in ("work_dtype", "ceiling_fraction", "ceiling", "bound"):
        if column not in ops:
            ops[column] = None
    return ops.sort_values("time_ns", ascending=False).reset_index(drop=True)


def _kernels(rows: list[tuple[str, str, int]]) -> pd.DataFrame:
    return pd.DataFrame([{"kernel_id": i, "operator": op, "module": module, "duration_ns": ns}
                         for i, (op, module, ns) in enumerate(rows)])


def _profile(operators: pd.DataFrame, kernels: pd.DataFrame | None = None, compiled: bool = True,
             mode: str = "inference", device: str = "cpu", iterations: int = 10) -> evidence.Profile:
    if kernels is None:
        kernels = _kernels([(r["operator"], "h.0", int(r["time_ns"])) for r in operators.to_dict("records")])
    run = {"compiled": compiled, "mode": mode, "versions": {"device": device}}
    coverage = {"iteration_time_ns": {str(i): 1_000_000 for i in range(iterations)}}
    return evidence.Profile(operators, kernels, run, coverage)


GPT2_LIKE = [
    {"operator": "aten::addmm", "time_ns": 5_000_000, "work_dtype": "float32", "ceiling_fraction": 0.25,
     "ceiling": "fp32 GEMM peak", "bound": "compute"},
    {"operator": "aten::gelu", "time_ns": 1_300_000, "work_dtype": "float32", "bound": "memory"},
    {"operator": "aten::_softmax+aten::masked_fill+aten::mul", "time_ns": 900_000, "work_dtype": "float32"},
    {"operator": "aten::bmm", "time_ns": 800_000, "work_dtype": "float32", "ceiling_fraction": 0.23,
     "ceiling": "fp32 GEMM peak", "bound": "memory"},
    {"operator": "aten::copy_", "time_ns": 1_000_000},
]


def test_compiled_gpt2_like_profile_gets_freezing_autotune_and_the_sdpa_rewrite():
    rules = advisor.load_catalog()
    profile = _profile(_operators(GPT2_LIKE))
    advice = advisor.advise(profile, rules, NO_BF16, "gpt2")
    offered = {r["change"]: r for r in advice["advice"]}
    assert set(offered) == {"freezing", "max_autotune", "sdpa_rewrite"}
    # GEMMs with a weight operand, computed from the rows: addmm of 9 ms in all (bmm multiplies activations)
    assert offered["freezing"]["value"] == pytest.approx(5.0 / 9.0)
    assert "aten::addmm 55.6% (float32), 25% of fp32 GEMM peak" in offered["freezing"]["evidence"]
    # both GEMMs are below half their ceiling, but bmm's calls (27 us) are too short for a kernel choice to matter
    assert offered["max_autotune"]["value"] == pytest.approx(5.0 / 9.0)
    # softmax chain + bmm in the same module, no fused attention there
    assert offered["sdpa_rewrite"]["value"] == pytest.approx((0.9 + 0.8) / 9.0)
    # bf16: the evidence holds (fp32 GEMMs), the machine has no native bf16: not offered, with the reason
    (bf16,) = [r for r in advice["not_offered"] if r["change"] == "bf16_autocast"]
    assert "bf16" in bf16["reason"]
    # the workload's own compile comes first; the rest in catalog order
    assert advice["advised_changes"] == ["compile", "freezing", "sdpa_rewrite", "max_autotune"]
    assert advice["sources"]["compile"].startswith("the workload's own setting")
    # eager-only rules did not fire on a compiled run, and say why
    compile_rule = [r for r in advice["not_triggered"] if r["rule"] == "compile_short_ops"]
    assert "compiled" in compile_rule[0]["reason"]


def test_bf16_is_offered_where_the_machine_computes_it_natively():
    advice = advisor.advise(_profile(_operators(GPT2_LIKE)), advisor.load_catalog(), WITH_BF16, "gpt2")
    assert "bf16_autocast" in advice["advised_changes"]
    assert advice["advised_changes"].index("bf16_autocast") < advice["advised_changes"].index("freezing")


def test_eager_profile_of_short_ops_gets_compile_and_freezing_needs_it():
    rows = [{"operator": "aten::addmm", "time_ns": 4_000_000, "kernels": 40, "work_dtype": "float32"},
            {"operator": "aten::add", "time_ns": 2_000_000, "kernels": 400},
            {"operator": "aten::mul", "time_ns": 1_500_000, "kernels": 300},
            {"operator": "aten::native_layer_norm", "time_ns": 500_000, "kernels": 20}]
    profile = _profile(_operators(rows), compiled=False)
    advice = advisor.advise(profile, advisor.load_catalog(), NO_BF16, "mlp")
    offered = {r["change"]: r for r in advice["advice"]}
    # add (5 us/call) and mul (5 us/call) are short; layer_norm averages 25 us: short too; addmm is a GEMM
    assert offered["compile"]["value"] == pytest.approx(4.0 / 8.0)
    assert "700 such calls per iteration" not in offered["compile"]["evidence"]  # 720 / 10 iterations = 72
    assert "72 such calls per iteration" in offered["compile"]["evidence"]
    assert advice["advised_changes"][:2] == ["compile", "freezing"]
    assert advice["sources"]["compile"] == "rule compile_short_ops"


def test_train_mode_gets_no_freezing():
    advice = advisor.advise(_profile(_operators(GPT2_LIKE), mode="train"), advisor.load_catalog(), NO_BF16, "gpt2")
    assert "freezing" not in advice["advised_changes"]
    (rule,) = [r for r in advice["not_triggered"] if r["rule"] == "freeze_weights"]
    assert "mode" in rule["reason"]


def test_lstm_profile_gets_the_library_rnn_diagnosis():
    rows = [{"operator": "aten::mkldnn_rnn_layer", "time_ns": 7_700_000, "work_dtype": "float32",
             "ceiling_fraction": 0.11, "ceiling": "fp32 GEMM peak"},
            {"operator": "aten::lstm", "time_ns": 750_000},
            {"operator": "aten::mm", "time_ns": 270_000, "work_dtype": "float32"},
            {"operator": "aten::clone", "time_ns": 200_000}]
    share = (7.7 + 0.75) / 8.92
    # compiled: keep the library RNN when compiling (QA: advised for an eager LSTM, its "compile" compiled nothing)
    compiled = advisor.advise(_profile(_operators(rows), compiled=True), advisor.load_catalog(), NO_BF16, "lstm")
    offered = {r["change"]: r for r in compiled["advice"]}
    assert offered["keep_rnn_library"]["value"] == pytest.approx(share)
    advice = advisor.advise(_profile(_operators(rows), compiled=False), advisor.load_catalog(), NO_BF16, "lstm")
    assert "keep_rnn_library" not in advice["advised_changes"]
    (diagnosis,) = advice["diagnoses"]
    assert "aten::mkldnn_rnn_layer" in diagnosis and "oneDNN" in diagnosis and f"{share:.0%}" in diagnosis
    assert "keep_rnn_library" in diagnosis


def test_catalog_edit_changes_the_advice(tmp_path):
    text = advisor.CATALOG.read_text().replace("measure: weight_gemm_share\n  min: 0.2",
                                               "measure: weight_gemm_share\n  min: 0.9")
    edited = tmp_path / "catalog.yaml"
    edited.write_text(text)
    advice = advisor.advise(_profile(_operators(GPT2_LIKE)), advisor.load_catalog(edited), NO_BF16, "gpt2", edited)
    assert "freezing" not in advice["advised_changes"]
    (rule,) = [r for r in advice["not_triggered"] if r["rule"] == "freeze_weights"]
    assert ">= 0.9" in rule["reason"]


@pytest.mark.parametrize("body, message", [
    ("swap_gelu:\n  change: relu_instead_of_gelu\n  measure: cast_share\n  order: 1\n",
     "change 'relu_instead_of_gelu' is not a known change"),
    ("r:\n  change: compile\n  measure: nothing\n  order: 1\n", "measure 'nothing' is not known"),
    ("r:\n  change: compile\n  measure: cast_share\n  order: 1\n  mni: 0.1\n", "unknown key(s) ['mni']"),
    ("r:\n  change: compile\n  measure: cast_share\n  order: 1\n  min: high\n", "'min' must be a number"),
    ("r:\n  change: compile\n  measure: cast_share\n", "'order' is required"),
    ("r:\n  change: compile\n  measure: cast_share\n  order: 1\n  when: {compiled: yes please}\n", "when.compiled"),
    ("r: [1, 2\n", "not valid YAML"),
    ("r:\n  change: compile\n  measure: cast_share\n  order: 1\n  when: {mode: infer}\n", "'infer' is not one of"),
    ("r:\n  change: compile\n  measure: cast_share\n  order: 1\n  min: 0.9\n  max: 0.1\n", "leave no value"),
])
def test_bad_catalog_is_refused_naming_file_rule_and_key(tmp_path, body, message):
    path = tmp_path / "catalog.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError) as info:
        advisor.load_catalog(path)
    assert str(path) in str(info.value) and message in str(info.value)


def test_fused_attention_is_not_explicit_attention():
    kernels = _kernels([("aten::_scaled_dot_product_flash_attention_for_cpu", "blocks.0", 500),
                        ("aten::addmm", "blocks.0", 500)])
    profile = _profile(_operators([{"operator": "aten::addmm", "time_ns": 500}]), kernels)
    assert evidence.explicit_attention_share(profile).value == 0.0


def test_conv_layouts_read_from_recorded_strides():
    nchw = json.dumps([[[2, 3, 8, 8], [4, 3, 3, 3]], ["float", "float"], ["", ""], [[192, 64, 8, 1], [27, 9, 3, 1]]])
    nhwc = json.dumps([[[2, 3, 8, 8]], ["float"], [""], [[192, 1, 24, 3]]])
    ranges = pd.DataFrame({"name": ["aten::convolution", "aten::convolution", "aten::add"],
                           "input_shapes": [nchw, nhwc, nchw]})
    assert evidence.conv_layouts(ranges) == {"nchw": 1, "channels_last": 1}


def test_cuda_profile_with_idle_tensor_pipes_gets_tf32_first_and_counters_quoted():
    rows = [{"operator": "aten::addmm", "time_ns": 6_000_000, "work_dtype": "float32", "tensor_pipe_active": 0.0,
             "local_load_bytes": 0.0},
            {"operator": "aten::bmm", "time_ns": 2_000_000, "work_dtype": "float32", "tensor_pipe_active": 42.0,
             "local_load_bytes": 4096.0},
            {"operator": "aten::add", "time_ns": 2_000_000, "tensor_pipe_active": 0.0, "local_load_bytes": 0.0}]
    profile = _profile(_operators(rows), device="cuda")
    features = {"device": "cuda", "cuda": True, "capability": (8, 0), "native_bf16": True}
    advice = advisor.advise(profile, advisor.load_catalog(), features, "gpt2")
    offered = {r["change"]: r for r in advice["advice"]}
    # only addmm leaves its tensor pipes idle (bmm runs on them; add is no GEMM)
    assert offered["tf32"]["value"] == pytest.approx(0.6)
    assert "tensor pipes 0.0% active" in offered["tf32"]["evidence"]
    assert advice["advised_changes"].index("tf32") < advice["advised_changes"].index("bf16_autocast")
    # bmm's spills: 20% of the time, a diagnosis
    assert any("spill" in d and "aten::bmm 20.0%" in d for d in advice["diagnoses"])
    # without counters the measure is unknown, and the rule says so
    plain = _profile(_operators([{k: v for k, v in r.items() if k not in ("tensor_pipe_active", "local_load_bytes")}
                                 for r in rows]), device="cuda")
    advice = advisor.advise(plain, advisor.load_catalog(), features, "gpt2")
    (rule,) = [r for r in advice["not_triggered"] if r["rule"] == "tf32_gemms"]
    assert "no tensor pipe counters" in rule["reason"]


# ------------------------------------------------------------------ per-iteration intervals and the machine's load
# Advice that flipped with machine load: one model's attention share read 15.7% on a quiet machine and 6.5% with another job running, so
# the 10% rule (attention_to_sdpa) advised the rewrite or not. A rule fires only when its measure clears the
# threshold across the measured iterations (the interquartile range of its per-iteration values), is "borderline"
# when that range straddles it, and a capture on a busy machine (run.json machine_load, docs/outputs.md) warns.

ITERATION_NS = 1_000_000


def _iterated_attention(shares: list[float], machine_load: dict | None = None) -> evidence.Profile:
    """One iteration per share: explicit attention (softmax 40%, bmm 60% of the share, module h.0.attn) and the
    rest in an addmm of h.0.mlp, each iteration 1 ms of kernel time; the kernels carry their iteration as the
    attribution table does (attribution/kernels.parquet, docs/outputs.md)."""
    rows = []
    for it, share in enumerate(shares):
        attention = round(share * ITERATION_NS)
        softmax = round(0.4 * attention)
        for op, module, ns in (("aten::_softmax", "h.0.attn", softmax), ("aten::bmm", "h.0.attn", attention - softmax),
                               ("aten::addmm", "h.0.mlp", ITERATION_NS - attention)):
            rows.append({"kernel_id": len(rows), "operator": op, "module": module, "duration_ns": ns, "iteration": it})
    kernels = pd.DataFrame(rows)
    totals = kernels.groupby("operator")["duration_ns"].sum()
    operators = _operators([{"operator": op, "time_ns": int(ns), "work_dtype": "float32"} for op, ns in totals.items()])
    run = {"compiled": True, "mode": "inference", "versions": {"device": "cpu"}, "machine_load": machine_load}
    coverage = {"iteration_time_ns": {str(i): ITERATION_NS for i in range(len(shares))}}
    return evidence.Profile(operators, kernels, run, coverage)


def _iqr(values: list[float]) -> tuple[float, float]:
    import numpy as np

    return float(np.percentile(values, 25)), float(np.percentile(values, 75))


def _attention_rule(advice: dict) -> tuple[str, dict]:
    for where in ("advice", "not_offered", "borderline", "not_triggered"):
        for record in advice[where]:
            if record["rule"] == "attention_to_sdpa":
                return where, record
    raise AssertionError("attention_to_sdpa is in no list")


QUIET = [0.157 + (0.01 if i % 2 else -0.01) for i in range(30)]     # 14.7% .. 16.7%
BUSY = [0.04, 0.07, 0.09, 0.11, 0.13, 0.16] * 5                    # every other figure on either side of 10%
LOW = [0.065 + (0.005 if i % 3 else -0.005) for i in range(30)]     # 6.0% .. 7.0%


def test_a_rule_fires_when_its_measure_clears_the_threshold_in_the_middle_half_of_the_iterations():
    advice = advisor.advise(_iterated_attention(QUIET), advisor.load_catalog(), NO_BF16, "attn")
    where, record = _attention_rule(advice)
    assert where == "advice" and "sdpa_rewrite" in advice["advised_changes"]
    low, high = _iqr(QUIET)
    assert record["interval"]["low"] == pytest.approx(low, abs=1e-6)
    assert record["interval"]["high"] == pytest.approx(high, abs=1e-6)
    assert record["interval"]["iterations"] == 30
    assert record["value"] == pytest.approx(sum(QUIET) / 30, abs=1e-6)  # equal iterations: the mean share
    assert advice["measures"]["explicit_attention_share"]["interval"]["values"] == pytest.approx(QUIET, abs=1e-6)
    assert advice["borderline"] == [] and advice["warnings"] == []
    lines = "\n".join(advice_view.markdown_lines(advice))
    assert f"across the measured iterations {low:.1%} to {high:.1%} (interquartile range over 30)" in lines


def test_a_measure_straddling_the_threshold_across_iterations_is_borderline_and_not_advised():
    advice = advisor.advise(_iterated_attention(BUSY), advisor.load_catalog(), NO_BF16, "attn")
    where, record = _attention_rule(advice)
    low, high = _iqr(BUSY)
    assert low < 0.1 < high
    assert where == "borderline" and "sdpa_rewrite" not in advice["advised_changes"]
    assert record["reason"].startswith(f"borderline: explicit_attention_share [{low:.1%}, {high:.1%}] over 30 "
                                       "iterations (interquartile range) against the rule's >= 0.1")
    lines = "\n".join(advice_view.markdown_lines(advice))
    assert "- borderline, not advised: sdpa_rewrite (rule `attention_to_sdpa`): borderline: " in lines
    page = optimize_page._advice_section(advice)
    assert "Borderline, not advised" in page and "explicit_attention_share [" in page


def test_a_measure_below_the_threshold_across_iterations_does_not_trigger():
    advice = advisor.advise(_iterated_attention(LOW), advisor.load_catalog(), NO_BF16, "attn")
    where, record = _attention_rule(advice)
    low, high = _iqr(LOW)
    assert where == "not_triggered" and high < 0.1
    assert f"[{low:.1%}, {high:.1%}] over 30 iterations (interquartile range); the rule needs >= 0.1" in record["reason"]


def test_without_measured_iterations_a_rule_reads_the_single_figure_and_says_so():
    profile = _iterated_attention(QUIET[:2])  # 2 iterations: fewer than evidence.MIN_INTERVAL_ITERATIONS
    advice = advisor.advise(profile, advisor.load_catalog(), NO_BF16, "attn")
    where, record = _attention_rule(advice)
    assert where == "advice" and record["interval"] is None
    assert record["interval_note"] == ("decided on the profile's single figure: 2 measured iteration(s) in the "
                                       "attribution, fewer than 3")


def test_per_iteration_shares_of_an_operator_measure_count_the_unattributed_time():
    """fp32_gemm_share per iteration: the GEMM's kernel time over all of the iteration's kernels, unattributed ones
    included (aggregate.operators_table's "(unattributed)" row)."""
    gemm = [600_000, 500_000, 400_000, 300_000]
    rows = []
    for it, ns in enumerate(gemm):
        for op, d in (("aten::addmm", ns), ("aten::gelu", 200_000), (None, ITERATION_NS - ns - 200_000)):
            rows.append({"kernel_id": len(rows), "operator": op, "module": "m", "duration_ns": d, "iteration": it})
    kernels = pd.DataFrame(rows)
    operators = _operators([{"operator": "aten::addmm", "time_ns": sum(gemm), "work_dtype": "float32"},
                            {"operator": "aten::gelu", "time_ns": 800_000, "work_dtype": "float32"},
                            {"operator": "(unattributed)", "time_ns": 4 * ITERATION_NS - sum(gemm) - 800_000}])
    profile = evidence.Profile(operators, kernels, {"versions": {"device": "cpu"}}, {})
    measure = evidence.fp32_gemm_share(profile)
    evidence.iteration_interval(measure, evidence.fp32_gemm_share, evidence.iteration_profiles(profile))
    expected = [ns / ITERATION_NS for ns in gemm]
    assert measure.interval["values"] == pytest.approx(expected)
    assert (measure.interval["low"], measure.interval["high"]) == pytest.approx(_iqr(expected))


BUSY_LOAD = {"other_cpu_load": 1.3, "usable_cpus": 2, "threads": 2, "threshold": 0.5, "busy": True, "window_s": 3.0}
QUIET_LOAD = {**BUSY_LOAD, "other_cpu_load": 0.1, "busy": False}


def test_a_capture_on_a_busy_machine_is_a_warning_in_the_advice_and_the_report():
    advice = advisor.advise(_iterated_attention(QUIET, BUSY_LOAD), advisor.load_catalog(), NO_BF16, "attn")
    assert advice["machine_load"] == BUSY_LOAD
    (warning,) = advice["warnings"]
    assert warning.startswith("the machine was busy during the capture: other processes kept 1.30 CPUs busy on "
                              "average during the measured iterations (busy above 0.5: 2 usable CPUs, 2 torch "
                              "thread(s))")
    assert f"**Warning**: {warning}." in advice_view.markdown_lines(advice)
    assert "<strong>Warning</strong>: the machine was busy during the capture" in optimize_page._advice_section(advice)
    quiet = advisor.advise(_iterated_attention(QUIET, QUIET_LOAD), advisor.load_catalog(), NO_BF16, "attn")
    assert quiet["warnings"] == [] and quiet["machine_load"] == QUIET_LOAD


def test_convolutions_on_the_slow_path_are_convolutions():
    """torch runs a 1x1 convolution of a batch-1 input on one thread through aten::_slow_conv2d_forward, not oneDNN:
    87 % of a 1-thread capture of a tiny HF ResNet, which the rules did not count as convolution time (conv_bn_share
    8.8 %, nothing advised). Every convolution backend aten::_convolution dispatches to counts."""
    rows = [{"operator": "aten::_slow_conv2d_forward", "time_ns": 8_700_000, "work_dtype": "float32"},
            {"operator": "aten::native_batch_norm", "time_ns": 300_000, "work_dtype": "float32"},
            {"operator": "aten::mkldnn_convolution", "time_ns": 300_000, "work_dtype": "float32"},
            {"operator": "aten::thnn_conv2d", "time_ns": 100_000, "work_dtype": "float32"},
            {"operator": "aten::slow_conv_dilated2d", "time_ns": 100_000, "work_dtype": "float32"},
            {"operator": "aten::relu", "time_ns": 500_000, "work_dtype": "float32"}]
    profile = _profile(_operators(rows), compiled=False)
    total = sum(r["time_ns"] for r in rows)
    assert evidence.conv_bn_share(profile).value == pytest.approx((total - 500_000) / total)
    # aten::thnn_conv2d only dispatches to aten::_slow_conv2d_forward: its own time is no GEMM work
    measure = evidence.fp32_gemm_share(profile)
    assert measure.value == pytest.approx((total - 800_000 - 100_000) / total)
    assert measure.note.startswith(f"not counted, aten::thnn_conv2d {100_000 / total:.1%}: it only dispatches")
    advice = advisor.advise(profile, advisor.load_catalog(), NO_BF16, "resnet")
    assert "conv_bn_fold" in advice["advised_changes"]


# ------------------------------------------------------------------- GEMM measures: each GEMM counted once


def test_a_linear_around_its_addmm_is_counted_once_and_alike_by_the_weight_and_fp32_linear_measures():
    """A CPU profile gives aten::linear its own time (dispatch and its aten::t) beside the aten::addmm it calls, and
    the work model gives aten::linear no dtype (no work of its own). Both measures count the addmm alone, and say
    what they left out: the linear (it only dispatches), and for the float32 share an mm of unknown dtype."""
    rows = [{"operator": "aten::addmm", "time_ns": 5_000_000, "work_dtype": "float32"},
            {"operator": "aten::linear", "time_ns": 3_000_000, "work_dtype": None},
            {"operator": "aten::mm", "time_ns": 1_000_000, "work_dtype": None},          # shapes not recorded
            {"operator": "aten::convolution", "time_ns": 2_000_000, "work_dtype": "float32"},
            {"operator": "aten::gelu", "time_ns": 4_000_000, "work_dtype": "float32"}]
    total = 15_000_000
    profile = _profile(_operators(rows), compiled=False)
    weight = evidence.weight_gemm_share(profile)
    assert weight.value == pytest.approx((5_000_000 + 1_000_000 + 2_000_000) / total)  # any dtype; no linear
    assert [i["operator"] for i in weight.items] == ["aten::addmm", "aten::convolution", "aten::mm"]
    assert weight.note == ("not counted, aten::linear 20.0%: it only dispatches to the GEMM it calls (its own time "
                           "is dispatch overhead; the GEMM is counted on the operator that runs it)")
    linear = evidence.fp32_linear_share(profile)
    assert linear.value == pytest.approx(5_000_000 / total)  # float32, no convolution, no linear, no unknown
    assert linear.note == (weight.note + "; not counted, aten::mm 6.7%: dtype unknown (no work_dtype in "
                                         "operators.parquet), so not known to be float32")
    fp32 = evidence.fp32_gemm_share(profile)
    assert fp32.value == pytest.approx((5_000_000 + 2_000_000) / total) and fp32.note == linear.note


def test_a_fused_kernel_computing_a_linear_is_gemm_work():
    rows = [{"operator": "aten::gelu+aten::linear", "time_ns": 3_000_000, "work_dtype": "float32"},
            {"operator": "aten::relu", "time_ns": 1_000_000, "work_dtype": "float32"}]
    profile = _profile(_operators(rows))
    assert evidence.weight_gemm_share(profile).value == pytest.approx(0.75)
    assert evidence.weight_gemm_share(profile).note is None


def test_the_dispatch_only_gemm_operators_are_torchs_composite_ones():
    """DISPATCH_ONLY_GEMM_OPS is what torch's dispatcher says of the GEMM operators (CompositeImplicitAutograd: they
    only decompose, so no kernel is theirs)."""
    from operator_profiler.work.op_calls import is_composite

    assert evidence.DISPATCH_ONLY_GEMM_OPS == {op for op in evidence.GEMM_OPS if is_composite(op)}


def _median_shares(timeline) -> dict[str, float]:
    """From the timeline alone: each CPU kernel's own operator (its range's name) and its share of the kernel time
    as aggregate defines it (the operator's median over the measured iterations of its kernel time in each, over
    the sum of those medians)."""
    import numpy as np

    kernels = pd.read_parquet(timeline / "kernels.parquet")
    measured = kernels[kernels["iteration"].notna()]
    per_it = measured.pivot_table(index="name", columns="iteration", values="duration_ns", aggfunc="sum",
                                  fill_value=0)
    medians = pd.Series(np.median(per_it.to_numpy(dtype=float), axis=1), index=per_it.index).round()
    return (medians / medians.sum()).to_dict()


def test_on_a_real_eager_mlp_profile_the_weight_and_fp32_linear_shares_are_the_addmm_share(tmp_path):
    """A tiny eager MLP profiled for real (the workflow's stage functions): each nn.Linear is an aten::linear call
    running aten::addmm. Both measures read the addmm's share, computed here from the timeline, and name the
    linear's (positive) share as left out."""
    from operator_profiler import stages

    workload = {"kind": "mlp", "compile": False, "width": 16, "expansion": 2, "n_block": 2, "batch_size": 2,
                "seq_len": 4, "mode": "inference"}
    harness = {"seed": 0, "warmup": 1, "warmup_max": 2, "iterations": 4}
    options = {"dedup": {"verify": False}, "nvtx": {"operator_domains": ["default"], "ignore_ranges": []},
               "aggregate": {"per_iteration": True}}
    stages.profile_files("mlp", workload, harness, "cpu", tmp_path, options,
                         env=dict.fromkeys(stages.THREAD_ENV, "1"))
    shares = _median_shares(tmp_path / "timeline")
    assert shares["aten::linear"] > 0 and shares["aten::addmm"] > 0
    profile = advisor.load_profile(tmp_path)
    weight, linear = evidence.weight_gemm_share(profile), evidence.fp32_linear_share(profile)
    assert weight.value == pytest.approx(shares["aten::addmm"], abs=1e-9)
    assert linear.value == pytest.approx(shares["aten::addmm"], abs=1e-9)
    left_out = f"not counted, aten::linear {shares['aten::linear']:.1%}: it only dispatches"
    assert weight.note.startswith(left_out) and linear.note.startswith(left_out)
