"""Tests for the aggregation tables and the coverage summary (operator_profiler.aggregate).

Small hand-built attribution frames; every expected number is worked out by hand in the test.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from operator_profiler import aggregate as agg
from operator_profiler.results import ReportInputs


def _ev(inductor_ops=None, operator=None):
    ev = {"correlation": {"operator": operator, "stack": []}}
    if inductor_ops is not None:
        ev["inductor"] = {"graph": "g", "call_index": 0, "kernel": "k", "kind": "cpp", "fused_ops": inductor_ops,
                          "origin": "source_nodes_comment"}
    return json.dumps(ev, sort_keys=True)


@pytest.fixture
def frame() -> pd.DataFrame:
    """8 kernels, 1000 ns total:
    - aten::addmm: kernels 0,1 in op instance 10 (one call, 2 kernels) + kernel 2 in op instance 11 -> 2 calls,
      100+50+150 = 300 ns; kernel 2 also has inductor evidence listing aten::addmm (agree).
    - aten::add+aten::gelu (fused): kernels 3, 4 without an op range -> 2 calls, 200+100 = 300 ns.
    - aten::mm: kernel 5, op instance 12, inductor evidence without aten::mm (disagree), 100 ns.
    - unattributed: kernel 6 (no_fusion_map, 250 ns), kernel 7 (no reason, 50 ns).
    """
    rows = [
        (0, "aten::addmm", 10, 100, "correlation", None, "gemm", _ev(operator="aten::addmm")),
        (1, "aten::addmm", 10, 50, "correlation", None, "reduce", _ev(operator="aten::addmm")),
        (2, "aten::addmm", 11, 150, "correlation", None, "gemm", _ev(["aten::addmm", "aten::view"], "aten::addmm")),
        (3, "aten::add+aten::gelu", None, 200, "inductor", None, "cpp_fused_add_gelu_0", _ev(["aten::add", "aten::gelu"])),
        (4, "aten::add+aten::gelu", None, 100, "inductor", None, "cpp_fused_add_gelu_0", _ev(["aten::add", "aten::gelu"])),
        (5, "aten::mm", 12, 100, "correlation", None, "mm", _ev(["aten::addmm"], "aten::mm")),
        (6, None, None, 250, "unattributed", "no_fusion_map", "cpp_fused_x_1", _ev()),
        (7, None, None, 50, "unattributed", None, "mystery", _ev()),
    ]
    df = pd.DataFrame(rows, columns=["kernel_id", "operator", "operator_range_id", "duration_ns", "path", "reason",
                                     "name", "evidence"])
    df["operator_range_id"] = pd.array(df["operator_range_id"], dtype="Int64")
    df["module"] = ["h.0", "h.0", "h.1", "h.1", None, "h.0", None, None]
    # two measured iterations; kernel 7 ran outside them (counted in totals, not per iteration)
    df["iteration"] = pd.array([0, 1, 1, 0, 1, 0, 1, None], dtype="Int64")
    return df


def test_operators_table_counts_and_shares(frame):
    ops = agg.operators_table(frame, per_iteration=True).set_index("operator")
    assert set(ops.index) == {"aten::addmm", "aten::add+aten::gelu", "aten::mm", agg.UNATTRIBUTED}
    assert ops["time_share"].sum() == pytest.approx(1.0)
    assert ops.loc["aten::addmm", "calls"] == 2 and ops.loc["aten::addmm", "kernels"] == 3
    assert ops.loc["aten::addmm", "time_ns"] == 300
    assert ops.loc["aten::add+aten::gelu", "calls"] == 2 and ops.loc["aten::add+aten::gelu", "kernels"] == 2
    assert ops.loc["aten::mm", "calls"] == 1 and ops.loc["aten::mm", "time_ns"] == 100
    assert ops.loc[agg.UNATTRIBUTED, "kernels"] == 2 and ops.loc[agg.UNATTRIBUTED, "time_ns"] == 300
    assert ops.loc[agg.UNATTRIBUTED, "calls"] == 2
    assert ops.loc["aten::mm", "total_share"] == pytest.approx(0.1)
    # time_share from the per-iteration medians: addmm 150, add+gelu 150, mm 50 (100, 0), unattributed 125
    # (0, 250): mm's median over their sum
    assert ops.loc["aten::mm", "time_share"] == pytest.approx(50 / 475)
    assert ops.loc["aten::addmm", "mean_kernel_ns"] == 100
    assert ops.loc["aten::addmm", "time_per_iteration_ns"] == 150
    # per iteration: addmm 100 ns in iteration 0, 50+150 in iteration 1
    assert ops.loc["aten::addmm", ["iteration_min_ns", "iteration_median_ns", "iteration_max_ns"]].tolist() == [100, 150, 200]
    # aten::mm ran only in iteration 0: 0 ns in iteration 1
    assert ops.loc["aten::mm", ["iteration_min_ns", "iteration_max_ns"]].tolist() == [0, 100]
    # the kernel outside the iterations counts in the total only
    assert ops.loc[agg.UNATTRIBUTED, "iteration_max_ns"] == 250
    # ... and not in the mean per iteration: kernel 6 (250 ns, iteration 1) over 2 iterations, without
    # kernel 7's 50 ns (QA finding: warm-up time was divided into the per-iteration figure)
    assert ops.loc[agg.UNATTRIBUTED, "time_per_iteration_ns"] == 125
    assert ops.loc["aten::add+aten::gelu", "paths"] == "inductor"
    assert (ops["bottleneck"] == "not_collected").all()


def test_operators_table_sorted_by_time_then_name(frame):
    ops = agg.operators_table(frame, per_iteration=False)
    assert list(ops["operator"]) == [agg.UNATTRIBUTED, "aten::add+aten::gelu", "aten::addmm", "aten::mm"]
    assert list(ops["time_ns"]) == [300, 300, 300, 100]
    assert "time_per_iteration_ns" not in ops and "iteration_median_ns" not in ops  # per_iteration: false


def test_operators_table_without_unattributed_has_no_such_row(frame):
    ops = agg.operators_table(frame[frame["path"] != "unattributed"], per_iteration=False)
    assert agg.UNATTRIBUTED not in set(ops["operator"])
    assert ops["time_share"].sum() == pytest.approx(1.0)
    assert ops.set_index("operator").loc["aten::mm", "time_share"] == pytest.approx(100 / 700)


def test_modules_table(frame):
    mods = agg.modules_table(frame).set_index("module")
    assert mods.loc["h.0", "time_ns"] == 250 and mods.loc["h.0", "kernels"] == 3
    assert mods.loc["h.1", "time_ns"] == 350
    assert mods.loc[agg.OUTSIDE_LAYERS, "time_ns"] == 400 and mods.loc[agg.OUTSIDE_LAYERS, "kernels"] == 3
    assert mods["time_share"].sum() == pytest.approx(1.0)


def test_coverage_recomputed_by_hand(frame):
    cov = agg.coverage(frame, counters_collected=False)
    assert cov["kernel_time_ns"] == 1000
    assert cov["attributed_time_ns"] == 700
    assert cov["coverage_time"] == pytest.approx(0.7)
    assert cov["kernel_count"] == 8 and cov["attributed_count"] == 6
    assert cov["by_path"] == pytest.approx({"correlation": 0.4, "inductor": 0.3, "unattributed": 0.3})
    # Kernels with both an op range and inductor evidence: 2 (agrees) and 5 (disagrees).
    assert cov["path_agreement"] == {"correlation/inductor": pytest.approx(0.5)}
    assert cov["path_agreement_counts"] == {"correlation/inductor": {"both": 2, "agree": 1}}
    # What each path answered, whatever the merge chose: (a) kernels 0, 1, 2, 5 (400 ns);
    # (c) the kernels with fused ops 2, 3, 4, 5 (150 + 200 + 100 + 100 ns).
    assert cov["path_coverage"] == {"correlation": {"count": 0.5, "time": pytest.approx(0.4)},
                                    "inductor": {"count": 0.5, "time": pytest.approx(0.55)}}
    assert cov["valid_timed_kernels"] == 8
    assert cov["outside_iterations_time_ns"] == 50  # kernel 7
    assert cov["counters_coverage"] is None and "not collected" in cov["counters_note"]
    assert cov["unattributed"] == [
        {"name": "cpp_fused_x_1", "time_ns": 250, "count": 1, "reason": "no_fusion_map"},
        {"name": "mystery", "time_ns": 50, "count": 1, "reason": "unknown"},
    ]
    assert cov["unattributed_reasons"] == {"no_fusion_map": 1, "unknown": 1}
    json.dumps(cov)  # coverage.json must be serialisable as is


def test_coverage_groups_unattributed_by_name_and_reason(frame):
    extra = frame.iloc[[6]].assign(kernel_id=8, duration_ns=30)
    cov = agg.coverage(pd.concat([frame, extra], ignore_index=True), counters_collected=True)
    top = cov["unattributed"][0]
    assert top == {"name": "cpp_fused_x_1", "time_ns": 280, "count": 2, "reason": "no_fusion_map"}
    assert cov["counters_coverage"] == 0.0 and cov["counters_note"] is None


def test_coverage_all_attributed(frame):
    cov = agg.coverage(frame[frame["path"] != "unattributed"], counters_collected=False)
    assert cov["coverage_time"] == 1.0 and cov["unattributed"] == [] and cov["unattributed_reasons"] == {}


def test_layer_classes_table():
    instances = pd.DataFrame({
        "layer": ["h.0", "h.1", "h.0", "h.1", "rest"],
        "iteration": [0, 0, 1, 1, 0],
        "layer_class": ["Block-1", "Block-1", "Block-1", "Block-1", "rest"],
        "time_ns": [10, 20, 30, 40, 5],
    })
    classes = {
        "Block-1": {"module_class": "Block", "instances": ["h.0", "h.1"], "kernel_count": 7, "representative": "h.0"},
        "rest": {"module_class": None, "instances": ["rest"], "kernel_count": 2, "representative": "rest"},
    }
    t = agg.layer_classes_table(instances, classes).set_index("layer_class")
    assert t.loc["Block-1", "time_ns"] == 100
    assert t.loc["Block-1", "mean_instance_time_ns"] == 50  # h.0: 40, h.1: 60
    assert t.loc["Block-1", "instances"] == 2 and t.loc["Block-1", "kernels_per_instance"] == 7
    assert t.loc["Block-1", "replays_without_dedup"] == 2 and t.loc["Block-1", "replays_with_dedup"] == 1
    assert t.loc["rest", "time_ns"] == 5


def test_real_trace_without_fusion_map_has_unattributed_row():
    """Compiled CPU trace attributed without a fusion map: the C++ kernels form the (unattributed) row."""
    import gzip
    import re
    from fractions import Fraction

    from conftest import real_file

    from operator_profiler.attribution.merge import attribute
    from operator_profiler.layers import classify_layers
    from operator_profiler.timeline.kineto import read_kineto

    trace = real_file("inductor-cpu", "traces", "trace_compiled_cpu.json.gz")
    with gzip.open(trace, "rt") as fh:
        raw = json.load(fh, parse_float=str)
    cpp = [e for e in raw["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"
           and re.match(r"^graph_\d+_cpp_", e["name"])]
    cpp_ns = sum(round(Fraction(e["dur"]) * 1000) for e in cpp)

    t = read_kineto(trace)
    kl, _, _ = classify_layers(t.kernels, t.ranges, [])
    a = attribute(t.kernels, t.ranges, kl, None)
    ops = agg.operators_table(a, per_iteration=True).set_index("operator")
    assert ops.loc[agg.UNATTRIBUTED, "kernels"] == len(cpp) > 0
    assert ops.loc[agg.UNATTRIBUTED, "time_ns"] == cpp_ns
    assert ops.loc[agg.UNATTRIBUTED, "calls"] == len(cpp)
    assert ops["time_share"].sum() == pytest.approx(1.0)
    assert ops["kernels"].sum() == len(t.kernels)
    cov = agg.coverage(a, counters_collected=False)
    assert cov["kernel_time_ns"] - cov["attributed_time_ns"] == cpp_ns
    assert cov["unattributed_reasons"] == {"no_fusion_map": len(cpp)}
    # aten::addmm: every kernel is one op instance of its own.
    n_addmm = sum(1 for e in raw["traceEvents"] if e.get("ph") == "X" and e.get("name") == "aten::addmm")
    assert ops.loc["aten::addmm", "calls"] == ops.loc["aten::addmm", "kernels"] == n_addmm


def test_operator_counters_are_duration_weighted_from_timeline_times(tmp_path):
    """The acceptance example: a two-kernel operator, durations 900 and 100 ns, SM throughput 80 % and
    20 %: the operator's figure is (900*80 + 100*20) / 1000 = 74 %, its DRAM bytes the sum."""
    import json

    from operator_profiler import stages, tables

    attribution = pd.DataFrame({
        "kernel_id": [0, 1, 2], "operator": ["aten::mm", "aten::mm", None], "forward_operator": None,
        "module": ["h.0", "h.0", None], "layer": ["h.0", "h.0", None], "layer_class": "Block", "path": "nvtx",
        "fused_ops": [[], [], []], "source_nodes": [[], [], []], "listed_not_computed": [[], [], []],
        "reason": None, "evidence": "{}",
        "operator_range_id": pd.array([7, 7, None], dtype="Int64"), "duration_ns": [900, 100, 50],
        "iteration": pd.array([0, 0, 0], dtype="Int64"), "name": ["gemm", "gemm_tail", "copy"],
    })
    attribution.loc[2, "path"] = "unattributed"
    tables.write_table(attribution, tables.ATTRIBUTION, tmp_path / "attribution.parquet")
    # ncu's own kernel times are deliberately different: the weights must be the timeline's.
    pd.DataFrame({"kernel_id": [0, 1], "sm__throughput.avg.pct_of_peak_sustained_elapsed": [80.0, 20.0],
                  "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": [30.0, 10.0],
                  "dram__bytes.sum": [1000.0, 3000.0], "gpu__time_duration.sum": [1e-7, 9e-7],
                  "ncu_id": [0, 1], "counters_from": ["h.0", "h.0"]}
                 ).to_parquet(tmp_path / "counters.parquet")
    pd.DataFrame({"layer": ["h.0", "rest"], "layer_class": ["Block", "rest"], "iteration": [0, 0],
                  "time_ns": [1000, 50], "kernel_count": [2, 1]}).to_parquet(
        tmp_path / "instances.parquet")
    (tmp_path / "classes.json").write_text(json.dumps({"Block": {"module_class": "Block", "instances": ["h.0"],
                                                                 "kernel_count": 2, "representative": "h.0"}}))
    out = tmp_path / "agg"
    stages.aggregate_files(tmp_path / "attribution.parquet", tmp_path / "instances.parquet", tmp_path / "classes.json",
                           {"per_iteration": False, "device": "cuda"}, out / "operators.parquet",
                           out / "operators.csv", out / "modules.parquet", out / "layer_classes.parquet",
                           out / "coverage.json", counters_path=tmp_path / "counters.parquet")
    ops = pd.read_parquet(out / "operators.parquet").set_index("operator")
    assert ops.loc["aten::mm", "sm_sol"] == pytest.approx(74.0)
    assert ops.loc["aten::mm", "dram_bytes"] == 4000.0
    assert ops.loc["aten::mm", "bottleneck"] == "compute-bound"  # SM 74 % vs memory 28 %
    assert int(ops.loc["aten::mm", "counters_kernels"]) == 2
    assert pd.isna(ops.loc["(unattributed)", "sm_sol"])  # no counters for the copy: not guessed
    coverage = json.loads((out / "coverage.json").read_text())
    assert coverage["counters_coverage"] == pytest.approx(2 / 3) and coverage["counters_note"] is None
    layer_classes = pd.read_parquet(out / "layer_classes.parquet").set_index("layer_class")
    assert layer_classes.loc["Block", "sm_sol"] == pytest.approx(74.0)  # the class's kernels are the two gemms


def test_report_shows_counter_columns_when_counters_were_matched():
    from operator_profiler.report.markdown import render_markdown

    operators = pd.DataFrame({"operator": ["aten::mm"], "calls": [1], "kernels": [2], "time_ns": [1000],
                              "time_share": [1.0], "paths": ["nvtx"], "sm_sol": [74.0], "memory_sol": [28.0],
                              "dram_bytes": [4_000_000.0], "bottleneck": ["compute-bound"]})
    coverage = {"attributed_count": 2, "kernel_count": 2, "coverage_time": 1.0, "kernel_time_ns": 1000,
                "by_path": {"nvtx": 1.0}, "unattributed": [], "counters_note": None}
    text = render_markdown("w", ReportInputs(coverage, operators, pd.DataFrame({"module": [], "kernels": [],
                                                                             "time_ns": [], "time_share": []}),
                                             pd.DataFrame()), 5)
    assert "| operator | calls | kernels | total_ms | share | paths | SM SOL % | memory SOL % | DRAM MB | bottleneck |" in text
    assert "| aten::mm | 1 | 2 | 0.001 | 100.00% | nvtx | 74.0 | 28.0 | 4.0 | compute-bound |" in text


def test_report_lists_counters_per_layer_class_and_the_verify_check():
    from operator_profiler.report.markdown import render_markdown

    coverage = {"attributed_count": 1, "kernel_count": 1, "coverage_time": 1.0, "kernel_time_ns": 1000,
                "by_path": {"nvtx": 1.0}, "unattributed": [], "counters_note": None}
    matching = {"broadcast": {
        "Block-1": {"kernels": 6, "measured": 4, "filled": 2, "without_counters": 0, "name_mismatch": 0,
                    "verify_max_relative_difference": {"dram__bytes.sum": 0.0909, "sm__throughput": 0.2}},
        "rest": {"kernels": 2, "measured": 2, "filled": 0, "without_counters": 0, "name_mismatch": 0}}}
    operators = pd.DataFrame({"operator": ["aten::mm"], "calls": [1], "kernels": [1], "time_ns": [1000],
                              "time_share": [1.0], "paths": ["nvtx"], "bottleneck": ["not_collected"]})
    modules = pd.DataFrame({"module": [], "kernels": [], "time_ns": [], "time_share": []})
    text = render_markdown("w", ReportInputs(coverage, operators, modules, pd.DataFrame(), matching=matching), 5)
    assert "| Block-1 | 6 | 4 | 2 | 0 | 20.0% (sm__throughput) |" in text
    assert "| rest | 2 | 2 | 0 | 0 | not verified |" in text


def test_layers_found_but_none_placed_is_said_not_called_no_layers():
    """QA: a whole-model compile with a graph break in each of 3 identical blocks placed every kernel in `rest`
    (their FX nodes' modules unknown), and the report said "No repeated submodules (layers) were found" while
    capture/layers.json listed the 3 blocks."""
    from operator_profiler.report.markdown import layer_summary

    only_rest = pd.DataFrame({"layer_class": ["rest"], "instances": [1]})
    said = layer_summary(only_rest, {"layers": 3})
    assert said.startswith("The capture found 3 layers (capture/layers.json), but no kernel could be placed in one")
    assert "compile_scope: layers" in said and "No repeated submodules" not in said
    assert layer_summary(only_rest, {"layers": 0}).startswith("No repeated submodules")
    assert layer_summary(only_rest, None).startswith("No repeated submodules")


def test_external_id_disagreements_read_a_categorical_evidence_as_its_texts():
    """Path (b)'s evidence is a categorical of a few texts: searched once per text, the same answer as
    the plain strings. Kernels 1 and 3 disagree (30 + 5 ns), kernel 0 agrees, kernel 2 was not checked, kernel 4
    has no evidence."""
    agree = json.dumps({"correlation": {"external_id_check": "agrees"}})
    disagree = json.dumps({"correlation": {"external_id_check": "disagrees", "external_id": 7,
                                           "external_id_op": "aten::mm"}})
    unchecked = json.dumps({"nvtx": {"operator": "aten::mm"}})
    frame = pd.DataFrame({"kernel_id": [0, 1, 2, 3, 4], "name": ["k0", "k1", "k2", "k3", "k4"],
                          "operator": ["aten::add", "aten::add", None, "aten::mul", None],
                          "duration_ns": [10, 30, 20, 5, 1],
                          "evidence": [agree, disagree, unchecked, disagree, None]})
    expected = {"checked": 3, "count": 2, "time_ns": 35, "examples": [
        {"kernel_id": 1, "name": "k1", "operator": "aten::add", "external_id": 7, "external_id_op": "aten::mm"},
        {"kernel_id": 3, "name": "k3", "operator": "aten::mul", "external_id": 7, "external_id_op": "aten::mm"}]}
    assert agg.external_id_disagreements(frame) == expected
    categorical = frame.assign(evidence=frame["evidence"].astype("category"))
    assert agg.external_id_disagreements(categorical) == expected
    none_checked = frame.assign(evidence=pd.Categorical([unchecked] * 4 + [None]))
    assert agg.external_id_disagreements(none_checked) == {"checked": 0, "count": 0, "time_ns": 0, "examples": []}


def test_evidence_search_of_an_object_column_equals_the_row_by_row_search():
    """An object evidence column (path (a)'s shared texts) is searched once per distinct text: the same answer
    as ``astype(str).str.contains`` row by row, nulls (None, NaN) and values that are not texts included."""
    text = '"external_id_check": '
    agree = json.dumps({"correlation": {"external_id_check": "agrees"}})
    other = json.dumps({"nvtx": {"operator": "aten::mm"}})
    for values in ([agree, other, agree, None, other], [agree, float("nan"), None, other],
                   [agree, 1, True, 1.0, other], [agree, ["unhashable"], other], [], [None, None]):
        evidence = pd.Series(values, dtype=object)
        for probe in (text, "nan", "None", "1"):
            want = evidence.astype(str).str.contains(probe, regex=False).to_numpy(dtype=bool)
            (found,) = agg._evidence_contains_each(evidence, (probe,))
            assert np.array_equal(found, want), (values, probe)
        probes = (text, "nan", "None", "1")
        # Several texts searched in one pass over the distinct texts: each answer as the row-by-row search's.
        for column in (evidence, evidence.astype("category") if all(isinstance(v, str) for v in values) else evidence):
            for probe, found in zip(probes, agg._evidence_contains_each(column, probes), strict=True):
                want = column.astype(str).str.contains(probe, regex=False).to_numpy(dtype=bool)
                assert np.array_equal(found, want), (values, probe, column.dtype)
