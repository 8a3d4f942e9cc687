"""Path (a) on Kineto traces: the cases of docs/field-cases.md (C01, C04, C05, C06) as fixtures
written by the test, and the pairing of a Kineto run with an nsys run of the same program.

Fixture helpers follow the conventions of docs/field-cases.md#fixture-conventions: times in µs as
in the trace, ``cpu_op(name, tid, ts, dur, ext)``, ``launch(api, cat, tid, ts, dur, corr, ext)``,
``kern(name, stream, ts, dur, corr[, ext])``. Expected values are those the case states.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pandas as pd

from operator_profiler import aggregate as agg
from operator_profiler import stages
from operator_profiler.attribution.merge import attribute
from operator_profiler.layers import classify_layers
from operator_profiler.timeline.kineto import read_kineto

PID = 1


def cpu_op(name, tid, ts, dur, ext=None, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur,
            "args": {"External id": ext, **args} if ext is not None else dict(args)}


def launch(api, cat, tid, ts, dur, corr, ext=None):
    args = {"correlation": corr, **({"External id": ext} if ext is not None else {})}
    return {"ph": "X", "cat": cat, "name": api, "pid": PID, "tid": tid, "ts": ts, "dur": dur, "args": args}


def kern(name, stream, ts, dur, corr, ext=None):
    args = {"correlation": corr, "stream": stream, "device": 0, **({"External id": ext} if ext is not None else {})}
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur, "args": args}


def _attribute(tmp_path, events, **top):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "GPU"}], **top,
                                "traceEvents": events}))
    timeline = read_kineto(path)
    layers, _, _ = classify_layers(timeline.kernels, timeline.ranges, [])
    return timeline, attribute(timeline.kernels, timeline.ranges, layers, None)


def test_c01_backward_kernel_gets_the_op_of_its_launch_thread(tmp_path):
    events = [
        cpu_op("autograd::engine::evaluate_function: MmBackward0", 2, 2.0, 2.0, 30),
        cpu_op("MmBackward0", 2, 2.1, 1.8, 31),
        cpu_op("user:backward", 1, 1.0, 8.0, 29, cat="user_annotation"),
        launch("cudaLaunchKernel", "cuda_runtime", 2, 2.5, 0.1, 7, 31),
        kern("gemm_bwd", 7, 2.7, 1.0, 7),
    ]
    _, a = _attribute(tmp_path, events)
    row = a.iloc[0]
    assert row["operator"] == "MmBackward0" and row["path"] == "correlation"
    evidence = json.loads(row["evidence"])["correlation"]
    assert evidence["stack"] == ["autograd::engine::evaluate_function: MmBackward0", "MmBackward0"]
    assert "user:backward" not in evidence["stack"]  # tid 1's range is never the launch thread's
    assert evidence["operator_kind"] == "cpu_op"


def _c04_events():
    return [
        cpu_op("aten::mm", 1, 100.0, 50.0, 1), launch("cudaLaunchKernel", "cuda_runtime", 1, 110.0, 2.0, 11, 1),
        cpu_op("aten::add", 1, 200.0, 30.0, 2), launch("cudaLaunchKernel", "cuda_runtime", 1, 205.0, 2.0, 12, 2),
        kern("add_kernel", 7, 0, 0, 12),
        cpu_op("aten::relu", 1, 300.0, 20.0, 3), launch("cudaLaunchKernel", "cuda_runtime", 1, 305.0, 2.0, 13, 3),
        kern("relu_kernel", 7, 330.0, 5.0, 13),
        cpu_op("aten::mul", 1, 400.0, 20.0, 4), launch("cudaLaunchKernel", "cuda_runtime", 1, 405.0, 2.0, 14, 4),
        kern("mul_kernel", 7, 410.0, -3.0, 14),
    ]


def test_c04_invalid_kernel_timestamps_weigh_nothing(tmp_path):
    timeline, a = _attribute(tmp_path, _c04_events())
    by = a.set_index("name")
    assert by.loc["relu_kernel", "operator"] == "aten::relu" and by.loc["relu_kernel", "duration_ns"] == 5000
    for name, op, launch_end_us in (("add_kernel", "aten::add", 207), ("mul_kernel", "aten::mul", 407)):
        assert by.loc[name, "operator"] == op
        assert not by.loc[name, "valid_time"]
        assert by.loc[name, "duration_ns"] == 0  # never clamped to a large value
        k = timeline.kernels.set_index("name").loc[name]
        # drawn at its launch's end, zero length: nothing starts at epoch 0
        assert int(k["start_ns"]) == int(k["end_ns"]) == launch_end_us * 1000
    ops = agg.operators_table(a, per_iteration=False).set_index("operator")
    assert ops.loc["aten::add", "kernels_without_time"] == ops.loc["aten::mul", "kernels_without_time"] == 1
    assert ops.loc["aten::relu", "kernels_without_time"] == 0
    cov = agg.coverage(a, counters_collected=False)
    assert cov["kernel_count"] == 3 and cov["attributed_count"] == 3
    assert cov["valid_timed_kernels"] == 1
    assert cov["kernel_time_ns"] == 5000 and cov["coverage_time"] == 1.0
    d = timeline.diagnostics
    assert d["counts"]["invalid_timestamp_kernels"] == 2
    assert d["counts"]["launches_without_kernel"] == 1 and d["counts"]["launch_calls"] == 4


def test_c04_launch_without_kernel_names_its_operator(tmp_path):
    trace = tmp_path / "c04.json"
    trace.write_text(json.dumps({"deviceProperties": [{"id": 0}], "traceEvents": _c04_events()}))
    timeline = stages.export_timeline(trace, tmp_path / "timeline")
    diagnostics = json.loads((tmp_path / "timeline" / "diagnostics.json").read_text())
    assert diagnostics["launches_without_kernel_by_operator"] == {"aten::mm": 1}
    assert diagnostics["launches_without_kernel"][0]["correlation_id"] == 11
    assert any("1 launch(es) have no kernel record (possibly dropped as out-of-range" in w
               for w in diagnostics["warnings"])
    assert timeline.diagnostics["counts"]["invalid_timestamp_kernels"] == 2


def test_c05_null_and_dangling_correlation_ids_never_join(tmp_path):
    events = [
        kern("ncclDevKernel_Generic", 20, 500, 400, 0), kern("ncclDevKernel_Generic", 20, 1500, 400, 0),
        kern("multi_tensor_apply_kernel", 7, 2000, 50, 284),
        kern("copy_kernel", 7, 2100, 10, -1),
        cpu_op("aten::add", 1, 2190, 20, 4), launch("cudaLaunchKernel", "cuda_runtime", 1, 2195, 2, 285, 4),
        kern("add_kernel", 7, 2200, 10, 285),
        # launches with ids 0 and -1 exist: a join on them would glue the kernels above to aten::add
        launch("cudaLaunchKernel", "cuda_runtime", 1, 2196, 1, 0, 4),
        launch("cudaLaunchKernel", "cuda_runtime", 1, 2197, 1, -1, 4),
    ]
    _, a = _attribute(tmp_path, events)
    assert len(a) == 5
    assert a.loc[a["name"] == "add_kernel", "operator"].tolist() == ["aten::add"]
    nccl = a[a["name"] == "ncclDevKernel_Generic"]
    assert len(nccl) == 2 and (nccl["reason"] == "null_correlation").all() and nccl["operator"].isna().all()
    assert a.loc[a["name"] == "copy_kernel", "reason"].tolist() == ["null_correlation"]
    dangling = a[a["name"] == "multi_tensor_apply_kernel"].iloc[0]
    assert dangling["reason"] == "no_launch_record"
    assert json.loads(dangling["evidence"])["correlation"]["correlation_id"] == 284
    cov = agg.coverage(a, counters_collected=False)
    assert cov["attributed_count"] == 1 and cov["kernel_time_ns"] == 870_000
    assert cov["attributed_time_ns"] == 10_000
    # two separate entries, not merged: one group per (name, reason) with both kernels counted
    nccl_groups = [u for u in cov["unattributed"] if u["name"] == "ncclDevKernel_Generic"]
    assert nccl_groups == [{"name": "ncclDevKernel_Generic", "time_ns": 800_000, "count": 2,
                            "reason": "null_correlation"}]


def test_c06_every_launch_api_joins(tmp_path):
    events = [
        cpu_op("aten::addmm", 1, 0, 50, 1), launch("cudaLaunchKernelExC", "cuda_runtime", 1, 10, 3, 101, 1),
        kern("sm90_xmma_gemm_bf16", 7, 20, 30, 101, 1),
        cpu_op("triton_poi_fused_relu_0", 1, 60, 20, 2), launch("cuLaunchKernel", "cuda_driver", 1, 65, 3, 102, 2),
        kern("triton_poi_fused_relu_0", 7, 70, 5, 102, 2),
        cpu_op("c10d::allreduce_", 1, 90, 30, 3), launch("cuLaunchKernelEx", "cuda_driver", 1, 95, 3, 103, 3),
        kern("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 20, 100, 200, 103, 3),
        cpu_op("aten::neg", 1, 130, 10, 4), launch("cudaLaunchKernel_v99", "cuda_runtime", 1, 132, 2, 104, 4),
        kern("neg_kernel", 7, 135, 2, 104, 4),
    ]
    timeline, a = _attribute(tmp_path, events)
    assert dict(zip(a["name"], a["operator"])) == {
        "sm90_xmma_gemm_bf16": "aten::addmm", "triton_poi_fused_relu_0": "triton_poi_fused_relu_0",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL": "c10d::allreduce_", "neg_kernel": "aten::neg"}
    assert agg.coverage(a, counters_collected=False)["coverage_time"] == 1.0
    assert timeline.diagnostics["launch_apis"] == {"cudaLaunchKernelExC": 1, "cuLaunchKernel": 1,
                                                   "cuLaunchKernelEx": 1, "cudaLaunchKernel_v99": 1}
    # post-2024 External ids are op ids: checked against the stack, and they agree
    assert timeline.diagnostics["external_id_mode"] == "op_id"
    assert {json.loads(e)["correlation"]["external_id_check"] for e in a["evidence"]} == {"agrees"}


def test_pre_2024_external_id_is_the_correlation_id_and_is_not_joined(tmp_path):
    """pytorch/kineto#843: External id == correlation on GPU events. Here the number 2 collides with
    the id of aten::mul; a join on External id would name aten::mul, enclosure names aten::add."""
    events = [
        cpu_op("aten::add", 1, 0, 20, 1), launch("cudaLaunchKernel", "cuda_runtime", 1, 5, 2, 2, 2),
        kern("add_kernel", 7, 10, 3, 2, ext=2),
        cpu_op("aten::mul", 1, 30, 20, 2),
    ]
    timeline, a = _attribute(tmp_path, events)
    assert timeline.diagnostics["external_id_mode"] == "correlation"
    assert a.iloc[0]["operator"] == "aten::add"
    assert "external_id_check" not in json.loads(a.iloc[0]["evidence"])["correlation"]


def test_fwdbwd_flow_names_the_forward_op(tmp_path):
    """formats.md#kineto-backward-thread: the fwdbwd flow links the backward op to the forward op that made its node, even when
    the sequence numbers would point elsewhere (here the seq matches no forward op at all)."""
    events = [
        cpu_op("aten::linear", 1, 0, 30, 1), cpu_op("aten::addmm", 1, 5, 20, 2, **{"Sequence number": 7,
                                                                                   "Fwd thread id": 0}),
        cpu_op("autograd::engine::evaluate_function: AddmmBackward0", 2, 100, 40, 3),
        cpu_op("AddmmBackward0", 2, 101, 38, 4, **{"Sequence number": 99, "Fwd thread id": 1}),
        cpu_op("aten::mm", 2, 105, 20, 5),
        launch("cudaLaunchKernel", "cuda_runtime", 2, 110, 2, 50, 5),
        kern("gemm_bwd", 7, 115, 10, 50),
        {"ph": "s", "id": 1, "pid": PID, "tid": 1, "ts": 5, "cat": "fwdbwd", "name": "fwdbwd"},
        {"ph": "f", "id": 1, "pid": PID, "tid": 2, "ts": 101, "cat": "fwdbwd", "name": "fwdbwd", "bp": "e"},
    ]
    _, a = _attribute(tmp_path, events)
    row = a.iloc[0]
    assert row["operator"] == "aten::mm" and row["forward_operator"] == "aten::addmm"


def test_counter_only_trace_says_no_kernel_events(tmp_path):
    events = [cpu_op("aten::conv2d", 1, 0, 30, 1), launch("cudaLaunchKernel", "cuda_runtime", 1, 5, 2, 9, 1),
              {"ph": "X", "cat": "cuda_profiler_range", "name": "conv_kernel", "pid": 0, "tid": 0, "ts": 40,
               "dur": 100, "args": {"smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": 10}}]
    timeline, a = _attribute(tmp_path, events)
    assert len(timeline.kernels) == 0 and len(a) == 0  # not mistaken for a CPU-only trace
    assert any(w.startswith("no kernel events") and "1 cuda_profiler_range events" in w
               for w in timeline.diagnostics["warnings"])


def test_trace_without_any_event_is_a_clear_error(tmp_path, capsys):
    from operator_profiler.cli import main

    trace = tmp_path / "empty.json"
    trace.write_text(json.dumps({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {}}]}))
    out = tmp_path / "timeline"
    assert main(["timeline", "--kineto", str(trace), "--out", str(out)]) == 1
    assert not out.exists()  # no partial output
    err = capsys.readouterr().err
    assert "no kernel events and no operator events" in err and "Traceback" not in err


def test_cpu_trace_where_a_gpu_run_was_expected(tmp_path, capsys):
    from operator_profiler.cli import main

    trace = tmp_path / "cpu.json"
    trace.write_text(json.dumps({"deviceProperties": [], "traceEvents": [cpu_op("aten::mm", 1, 0, 10, 1)]}))
    assert main(["timeline", "--kineto", str(trace), "--out", str(tmp_path / "ok")]) == 0  # a CPU trace
    assert main(["timeline", "--kineto", str(trace), "--out", str(tmp_path / "gpu"), "--expect-gpu"]) == 1
    err = capsys.readouterr().err
    assert "no GPU events" in err and "ProfilerActivity.CUDA" in err and "Traceback" not in err
    assert not (tmp_path / "gpu" / "kernels.parquet").exists()


def test_merged_processes_with_the_same_correlation_id_are_not_joined(tmp_path):
    """QA finding: two processes' traces merged into one file, both using correlation 5. Neither kernel
    may be joined to either launch, and the warning says why (not 'launched before the profiler')."""
    events = [cpu_op("aten::add", 1, 0, 10, 1), launch("cudaLaunchKernel", "cuda_runtime", 1, 2, 1, 5),
              kern("add_kernel", 7, 5, 1, 5)]
    other = [dict(e, pid=200) for e in (cpu_op("aten::mul", 1, 20, 10, 1),
                                         launch("cudaLaunchKernel", "cuda_runtime", 1, 22, 1, 5))]
    timeline, a = _attribute(tmp_path, events + other + [kern("mul_kernel", 7, 25, 1, 5)])
    assert (a["path"] == "unattributed").all() and len(a) == 2
    assert any("2 launch calls share their correlation id" in w for w in timeline.diagnostics["warnings"])


def test_fusion_map_of_another_model_warns(tmp_path, caplog):
    from conftest import real_file

    trace = real_file("inductor-cpu", "traces", "trace_compiled_cpu.json.gz")
    other_model = real_file("inductor-cuda", "PROVENANCE.md").parent
    stages.export_timeline(trace, tmp_path / "tl")
    fusion = stages.load_fusion_map_checked(other_model)
    with caplog.at_level("WARNING"):
        a = stages.attribute_files(tmp_path / "tl", None, fusion, tmp_path / "a.parquet")
    assert (a["reason"] == "fusion_map_mismatch").sum() > 0
    assert any("matched no kernel" in r.message and "another run or model" in r.message for r in caplog.records)


def test_c04_report_says_unknown_not_zero(tmp_path):
    """End to end through the CLI: the report names the op whose launch has no kernel record and the
    ops whose kernel records have invalid timestamps as *unknown* time (docs/field-cases.md C04)."""
    from operator_profiler.cli import main

    (tmp_path / "c04.json").write_text(json.dumps({"deviceProperties": [{"id": 0}], "traceEvents": _c04_events()}))
    (tmp_path / "layers.json").write_text("[]")
    d = str(tmp_path)
    for args in (["timeline", "--kineto", f"{d}/c04.json", "--out", f"{d}/tl"],
                 ["classify", "--timeline", f"{d}/tl", "--layers", f"{d}/layers.json", "--out", f"{d}/lay"],
                 ["attribute", "--timeline", f"{d}/tl", "--kernel-layers", f"{d}/lay/kernel_layers.parquet",
                  "--out", f"{d}/a.parquet"],
                 ["aggregate", "--attribution", f"{d}/a.parquet", "--instances", f"{d}/lay/instances.parquet",
                  "--classes", f"{d}/lay/classes.json", "--device", "cuda", "--out", f"{d}/agg"],
                 ["report", "--results", f"{d}/agg", "--timeline", f"{d}/tl", "--workload", "c04", "--out",
                  f"{d}/report.md"]):
        assert main(args) == 0, args
    report = (tmp_path / "report.md").read_text()
    assert "device time **unknown** (launch without kernel record) for `aten::mm`: 1 launch" in report
    assert "Time **unknown**" in report and "`aten::add` 1 kernel" in report and "`aten::mul` 1 kernel" in report
    assert "2 kernel record(s) carry invalid timestamps" in report


def _optimizer_step_events():
    """The example seen in the real A100 trace hta_negative_queue_length: FusedAdam's
    ``multi_tensor_apply_kernel`` launched directly under the optimizer's ``record_function``
    (``Optimizer.step#FusedAdam.step``), with no cpu_op around the launch. Times in µs."""
    ann = dict(cat="user_annotation")
    return [
        cpu_op("ProfilerStep#3", 1, 0, 1000, **ann), cpu_op("opprof.iteration:0", 1, 1, 998, **ann),
        cpu_op("aten::add", 1, 10, 20, 1), launch("cudaLaunchKernel", "cuda_runtime", 1, 12, 2, 11),
        kern("add_kernel", 7, 15, 5, 11),
        cpu_op("## optimizer ##", 1, 100, 500, **ann),
        cpu_op("Optimizer.step#FusedAdam.step", 1, 110, 200, **ann),
        launch("cudaLaunchKernel", "cuda_runtime", 1, 120, 3, 12), kern("multi_tensor_apply_kernel", 7, 125, 40, 12),
        # a dispatcher op inside the annotation names its own kernel (higher precedence)
        cpu_op("aten::mul", 1, 150, 20, 2), launch("cudaLaunchKernel", "cuda_runtime", 1, 155, 2, 13),
        kern("mul_kernel", 7, 170, 10, 13),
        cpu_op("Optimizer.step#FusedAdam.step", 1, 400, 150, **ann),
        launch("cudaLaunchKernel", "cuda_runtime", 1, 410, 3, 14), kern("multi_tensor_apply_kernel", 7, 415, 60, 14),
        # only the profiler step and our iteration range around the launch: no operator
        launch("cudaLaunchKernel", "cuda_runtime", 1, 700, 3, 15), kern("lone_kernel", 7, 705, 5, 15),
        # a compiled-graph region is the fusion map's: an annotation outside it names nothing
        cpu_op("Optimizer.step#Compiled", 1, 780, 170, **ann),
        cpu_op("## Call CompiledFxGraph abc ##", 1, 800, 100, **ann),
        launch("cuLaunchKernel", "cuda_driver", 1, 820, 3, 16), kern("triton_poi_fused_0", 7, 830, 8, 16),
    ]


def test_user_annotation_names_kernels_that_no_op_encloses(tmp_path):
    timeline, a = _attribute(tmp_path, _optimizer_step_events())
    records = a.astype(object).where(a.notna(), None).to_dict("records")
    rows = {name: [r for r in records if r["name"] == name] for name in set(a["name"])}
    assert [(r["operator"], r["path"]) for r in rows["add_kernel"] + rows["mul_kernel"]] == [
        ("aten::add", "correlation"), ("aten::mul", "correlation")]
    ranges = timeline.ranges
    steps = ranges[ranges["name"] == "Optimizer.step#FusedAdam.step"].sort_values("start_ns")
    assert len(steps) == 2
    mta = rows["multi_tensor_apply_kernel"]
    assert [(r["operator"], r["path"], r["reason"]) for r in mta] == [
        ("Optimizer.step#FusedAdam.step", "user_annotation", None)] * 2
    # each kernel belongs to its own step (one call each), named in its evidence
    assert [int(r["operator_range_id"]) for r in mta] == [int(x) for x in steps["range_id"]]
    for r, step in zip(mta, steps["range_id"]):
        evidence = json.loads(r["evidence"])
        assert evidence["user_annotation"] == {"operator": "Optimizer.step#FusedAdam.step", "range_id": int(step)}
        assert evidence["correlation"]["reason"] == "no_enclosing_operator"
        assert evidence["correlation"]["operator"] is None
    (lone,) = rows["lone_kernel"]
    assert lone["path"] == "unattributed" and lone["reason"] == "no_enclosing_operator"
    (fused,) = rows["triton_poi_fused_0"]
    assert fused["path"] == "unattributed" and fused["reason"] == "no_fusion_map"
    assert "user_annotation" not in json.loads(fused["evidence"])

    ops = agg.operators_table(a, per_iteration=True).set_index("operator")
    step = ops.loc["Optimizer.step#FusedAdam.step"]
    assert (step["calls"], step["kernels"], step["time_ns"], step["paths"]) == (2, 2, 100_000, "user_annotation")
    cov = agg.coverage(a, counters_collected=False)
    total = (5 + 40 + 10 + 60 + 5 + 8) * 1000
    assert cov["kernel_time_ns"] == total and cov["attributed_count"] == 4
    assert cov["by_path"]["user_annotation"] == 100_000 / total
    assert cov["path_coverage"]["user_annotation"] == {"count": 2 / 6, "time": 100_000 / total}
    assert cov["coverage_time"] == (5 + 40 + 10 + 60) * 1000 / total
    assert not any("user_annotation" in pair for pair in cov["path_agreement_counts"])


def test_profiler_phase_markers_never_name_a_kernel(tmp_path):
    """Found by a new user: `## forward ##`-style phase markers (any `## ... ##`) became operators through the
    user_annotation path. They are the profiler's markers, not program regions; a user range still counts."""
    ann = dict(cat="user_annotation")
    events = [cpu_op("## forward ##", 1, 0, 100, **ann),
              launch("cudaLaunchKernel", "cuda_runtime", 1, 10, 2, 21), kern("fwd_kernel", 7, 15, 5, 21),
              cpu_op("train_step", 1, 200, 100, **ann),
              launch("cudaLaunchKernel", "cuda_runtime", 1, 210, 2, 22), kern("step_kernel", 7, 215, 5, 22)]
    _, a = _attribute(tmp_path, events)
    got = {r["name"]: (r["operator"], r["path"]) for r in a.astype(object).where(a.notna(), None).to_dict("records")}
    assert got == {"fwd_kernel": (None, "unattributed"), "step_kernel": ("train_step", "user_annotation")}


def test_user_annotation_path_in_report_html_and_trace(tmp_path):
    """End to end through the CLI: the new path has its row in report.md's and report.html's coverage
    tables with one line saying what it means, and trace.json carries it per kernel."""
    from operator_profiler.cli import main

    (tmp_path / "t.json").write_text(json.dumps({"deviceProperties": [{"id": 0}], "traceEvents": _optimizer_step_events()}))
    (tmp_path / "layers.json").write_text("[]")
    d = str(tmp_path)
    for args in (["timeline", "--kineto", f"{d}/t.json", "--out", f"{d}/tl"],
                 ["classify", "--timeline", f"{d}/tl", "--layers", f"{d}/layers.json", "--out", f"{d}/lay"],
                 ["attribute", "--timeline", f"{d}/tl", "--kernel-layers", f"{d}/lay/kernel_layers.parquet",
                  "--out", f"{d}/a.parquet"],
                 ["aggregate", "--attribution", f"{d}/a.parquet", "--instances", f"{d}/lay/instances.parquet",
                  "--classes", f"{d}/lay/classes.json", "--device", "cuda", "--out", f"{d}/agg"],
                 ["report", "--results", f"{d}/agg", "--timeline", f"{d}/tl", "--workload", "t", "--out",
                  f"{d}/report.md"],
                 ["report-html", "--results", f"{d}/agg", "--workload", "t", "-o",
                  f"{d}/report.html"],
                 ["trace", "--timeline", f"{d}/tl", "--attribution", f"{d}/a.parquet", "--out", f"{d}/trace.json"]):
        assert main(args) == 0, args
    share = f"{100_000 / 128_000 * 100:.2f}%"
    report = (tmp_path / "report.md").read_text()
    assert f"| user_annotation | {share} | 33.33% | {share} |" in report
    line = ("2 kernels (78.12% of kernel time) had no operator around their launch and carry the name of the "
            "`record_function` annotation around it instead (path `user_annotation`")
    assert line in report
    page = (tmp_path / "report.html").read_text()
    assert "<td>user_annotation</td>" in page
    assert line.replace("`record_function`", "<code>record_function</code>").replace(
        "`user_annotation`", "<code>user_annotation</code>") in page
    assert "External id" not in report and "External id" not in page  # nothing disagrees here
    trace = json.loads((tmp_path / "trace.json").read_text())
    paths = Counter((e["name"], e["args"]["path"]) for e in trace["traceEvents"] if e.get("cat") == "kernel")
    assert paths[("multi_tensor_apply_kernel", "user_annotation")] == 2
    assert paths[("lone_kernel", "unattributed")] == 1


def test_user_annotation_never_overrides_nvtx_in_a_paired_run(tmp_path):
    """nsys timeline + torch.profiler run of one program (merge_kineto_run): where NVTX named a kernel,
    the Kineto run's user annotation does not replace it; where NVTX named nothing, it is taken. The
    nsys side here is a hand-written attribution table in attribute_nvtx's columns (a test double: the
    precedence is what is tested), over the Kineto run's own kernel sequence."""
    from operator_profiler.attribution.merge import merge_kineto_run

    timeline, kineto = _attribute(tmp_path, _optimizer_step_events())
    kernels = timeline.kernels.copy()
    n = len(kernels)
    named_by_nvtx = (kernels["name"] == "multi_tensor_apply_kernel").to_numpy() & (kernels["kernel_id"] == kernels.loc[
        kernels["name"] == "multi_tensor_apply_kernel", "kernel_id"].min()).to_numpy()
    primary = pd.DataFrame({
        "kernel_id": kernels["kernel_id"], "operator": np.where(named_by_nvtx, "aten::_fused_adam_", None),
        "forward_operator": None, "module": None, "layer": None, "layer_class": None,
        "path": np.where(named_by_nvtx, "nvtx", "unattributed"), "fused_ops": [[] for _ in range(n)],
        "source_nodes": [[] for _ in range(n)], "listed_not_computed": [[] for _ in range(n)],
        "reason": np.where(named_by_nvtx, None, "no_operator_range"),
        "evidence": ['{"nvtx": {"operator": "aten::_fused_adam_"}}' if x else '{"nvtx": {"operator": null}}'
                     for x in named_by_nvtx],
        "operator_range_id": pd.array([None] * n, dtype="Int64"), "duration_ns": kernels["duration_ns"],
        "iteration": kernels["iteration"], "name": kernels["name"]})
    merged, summary = merge_kineto_run(primary, kernels, kineto, timeline.kernels)
    assert summary["paired"] == n
    mta = merged[merged["name"] == "multi_tensor_apply_kernel"].sort_values("kernel_id")
    assert list(zip(mta["operator"], mta["path"])) == [("aten::_fused_adam_", "nvtx"),
                                                       ("Optimizer.step#FusedAdam.step", "user_annotation")]
    assert merged.loc[merged["name"] == "add_kernel", "path"].tolist() == ["correlation"]
    cov = agg.coverage(merged, counters_collected=False)
    assert cov["path_coverage"]["user_annotation"]["count"] == 2 / n  # both named by it, one chosen
    assert cov["by_path"]["user_annotation"] == 60_000 / 128_000


def _disagreeing_external_id_events():
    """Post-2024 Kineto (External id = the launching op's id, kineto PR #873): mul_kernel's External id
    names aten::relu, neg_kernel's an id no op carries; their launches lie in aten::mul / aten::neg."""
    return [
        cpu_op("aten::add", 1, 0, 20, 1), launch("cudaLaunchKernel", "cuda_runtime", 1, 5, 2, 11, 1),
        kern("add_kernel", 7, 10, 3, 11, ext=1),
        cpu_op("aten::mul", 1, 30, 20, 2), launch("cudaLaunchKernel", "cuda_runtime", 1, 35, 2, 12, 2),
        kern("mul_kernel", 7, 40, 4, 12, ext=3),
        cpu_op("aten::relu", 1, 60, 20, 3), launch("cudaLaunchKernel", "cuda_runtime", 1, 65, 2, 13, 3),
        kern("relu_kernel", 7, 70, 5, 13, ext=3),
        cpu_op("aten::neg", 1, 90, 20, 4), launch("cudaLaunchKernel", "cuda_runtime", 1, 95, 2, 14, 4),
        kern("neg_kernel", 7, 100, 6, 14, ext=99),
    ]


def test_external_id_disagreements_are_counted_and_reported(tmp_path, capsys):
    timeline, a = _attribute(tmp_path, _disagreeing_external_id_events())
    assert timeline.diagnostics["external_id_mode"] == "op_id"
    by = a.set_index("name")
    # the operator is the launch's (CUPTI correlation), never the External id's
    assert by["operator"].to_dict() == {"add_kernel": "aten::add", "mul_kernel": "aten::mul",
                                        "relu_kernel": "aten::relu", "neg_kernel": "aten::neg"}
    said = {name: json.loads(e)["correlation"] for name, e in by["evidence"].items()}
    assert said["mul_kernel"]["external_id_check"] == "disagrees"
    assert (said["mul_kernel"]["external_id"], said["mul_kernel"]["external_id_op"]) == (3, "aten::relu")
    assert (said["neg_kernel"]["external_id"], said["neg_kernel"]["external_id_op"]) == (99, None)
    assert "external_id" not in said["add_kernel"] and said["add_kernel"]["external_id_check"] == "agrees"
    cov = agg.coverage(a, counters_collected=False)
    assert cov["external_id_disagreements"] == {
        "checked": 4, "count": 2, "time_ns": 10_000,
        "examples": [{"kernel_id": int(by.loc["neg_kernel", "kernel_id"]), "name": "neg_kernel",
                      "operator": "aten::neg", "external_id": 99, "external_id_op": None},
                     {"kernel_id": int(by.loc["mul_kernel", "kernel_id"]), "name": "mul_kernel",
                      "operator": "aten::mul", "external_id": 3, "external_id_op": "aten::relu"}]}

    from operator_profiler.cli import main

    (tmp_path / "t.json").write_text(json.dumps({"deviceProperties": [{"id": 0}],
                                                 "traceEvents": _disagreeing_external_id_events()}))
    (tmp_path / "layers.json").write_text("[]")
    d = str(tmp_path)
    for args in (["timeline", "--kineto", f"{d}/t.json", "--out", f"{d}/tl"],
                 ["classify", "--timeline", f"{d}/tl", "--layers", f"{d}/layers.json", "--out", f"{d}/lay"],
                 ["attribute", "--timeline", f"{d}/tl", "--kernel-layers", f"{d}/lay/kernel_layers.parquet",
                  "--out", f"{d}/a.parquet"],
                 ["aggregate", "--attribution", f"{d}/a.parquet", "--instances", f"{d}/lay/instances.parquet",
                  "--classes", f"{d}/lay/classes.json", "--device", "cuda", "--out", f"{d}/agg"],
                 ["report", "--results", f"{d}/agg", "--timeline", f"{d}/tl", "--workload", "t", "--out",
                  f"{d}/report.md"],
                 ["report-html", "--results", f"{d}/agg", "--workload", "t", "-o",
                  f"{d}/report.html"]):
        assert main(args) == 0, args
    assert "2 of 4 checked kernels carry a Kineto External id that names another op" in capsys.readouterr().err
    written = json.loads((tmp_path / "agg" / "coverage.json").read_text())["external_id_disagreements"]
    assert written == cov["external_id_disagreements"]
    line = ("**2 kernels (0.010 ms) carry an `External id` naming another op than the one around their launch** "
            "(of 4 checked): their operator is the launch's (CUPTI correlation); the trace's op ids are not to be "
            "trusted. E.g. `neg_kernel` launched in `aten::neg`: its External id 99 names no op in the trace.")
    assert line in (tmp_path / "report.md").read_text()
    page = (tmp_path / "report.html").read_text()
    assert ("<strong>2 kernels (0.010 ms) carry an <code>External id</code> naming another op than the one around "
            "their launch</strong> (of 4 checked)") in page
