"""Cases of docs/field-cases.md on the nsys path: timeline reader + NVTX enclosure (path b).

Each test builds the case's small export with the real table layout (tests/nsys_export.py), runs the
stages on files (``opprof timeline`` / ``opprof attribute`` equivalents) and checks the case's
expected result. Times are ns.

Reason vocabulary: the public case reports write ``no_enclosing_range_on_launch_thread`` for a kernel
whose launch thread has no range; the pipeline says ``range_on_other_thread`` when an operator range
of another thread of the process is open at launch time (the C01 trap) and ``no_enclosing_range``
when no range is open anywhere; C05's ``launch_record_missing(corr=284)`` is ``no_launch_record``
(the id stays in the kernels table).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
from nsys_export import (
    GraphNode,
    GraphTrace,
    Kernel,
    Nvtx,
    Runtime,
    launch,
    rows,
    write_nsys_export,
)

from operator_profiler import aggregate as agg
from operator_profiler import stages, tables
from operator_profiler.attribution.nvtx import NvtxOptions
from operator_profiler.timeline import kineto


def run(tmp_path, options: NvtxOptions | None = None, **export):
    """Write the export, run timeline + attribute on files; return (timeline, attribution by kernel name)."""
    db = write_nsys_export(tmp_path / "report.sqlite", **export)
    timeline = stages.export_timeline(db, tmp_path / "timeline")
    stages.attribute_files(tmp_path / "timeline", None, None, tmp_path / "attribution.parquet", options)
    attribution = tables.read_table(tmp_path / "attribution.parquet")
    return timeline, attribution


def by_name(attribution: pd.DataFrame) -> dict[str, dict]:
    assert attribution["name"].is_unique
    return {row["name"]: row for row in attribution.to_dict("records")}


def evidence(row: dict) -> dict:
    return json.loads(row["evidence"])["nvtx"]


# C01 --------------------------------------------------------------------------------------------


def test_c01_backward_kernels_use_the_autograd_thread_ranges(tmp_path):
    _, att = run(
        tmp_path,
        nvtx=[Nvtx("user:backward", 59, "10:1", 1000, 9000), Nvtx("MmBackward0", 59, "10:2", 2000, 4000)],
        runtime=[Runtime("cudaLaunchKernel", "10:2", 2500, 2600, 7), Runtime("cudaLaunchKernel", "10:2", 5000, 5100, 8)],
        kernels=[Kernel("gemm_bwd", 10, 7, 2700, 3700, 7), Kernel("reduce_bwd", 10, 7, 5200, 5400, 8)],
    )
    k = by_name(att)
    assert k["gemm_bwd"]["operator"] == "MmBackward0" and k["gemm_bwd"]["path"] == "nvtx"
    # Never attributed through tid 1's range, even though it is open at t=5000.
    assert k["reduce_bwd"]["operator"] is None or pd.isna(k["reduce_bwd"]["operator"])
    assert k["reduce_bwd"]["reason"] == "range_on_other_thread"
    cov = agg.coverage(att, counters_collected=False)
    assert (cov["attributed_count"], cov["kernel_count"]) == (1, 2)
    assert cov["coverage_time"] == pytest.approx(1000 / 1200)


def test_c01_emit_nvtx_backward_gets_forward_op_and_layer_through_seq(tmp_path):
    """torch emit_nvtx: the backward node carries the forward op's sequence number."""
    _, att = run(
        tmp_path,
        domains={(10, 1): "opprof"},
        nvtx=[
            Nvtx("opprof.iteration:0", 59, "10:1", 0, 100_000, domain=1),
            Nvtx("opprof.layer:h.0", 59, "10:1", 100, 900, domain=1),
            Nvtx("aten::mm, seq = 7, op_id = 3", 59, "10:1", 200, 400),
            Nvtx("MmBackward0, seq = 7, op_id = 40", 59, "10:2", 2000, 4000),
            Nvtx("aten::mm, seq = 9, op_id = 41", 59, "10:2", 2100, 3900),
        ],
        **rows(launch("gemm_fwd", "10:1", 250, 1), launch("gemm_bwd", "10:2", 2500, 2)),
    )
    k = by_name(att)
    assert k["gemm_fwd"]["operator"] == "aten::mm" and k["gemm_fwd"]["layer"] == "h.0"
    assert k["gemm_bwd"]["operator"] == "aten::mm"
    assert k["gemm_bwd"]["forward_operator"] == "aten::mm"
    assert k["gemm_bwd"]["layer"] == "h.0"  # through the forward op's layer range
    assert evidence(k["gemm_bwd"])["stack"] == ["MmBackward0", "aten::mm"]
    assert evidence(k["gemm_bwd"])["backward_seq"] == 7


# C03 --------------------------------------------------------------------------------------------

CAPTURE_NVTX = [Nvtx("aten::mm", 59, "10:1", 100, 200), Nvtx("aten::add", 59, "10:1", 200, 300),
                Nvtx("aten::relu", 59, "10:1", 300, 400), Nvtx("model_step", 59, "10:1", 1000, 1100)]
REPLAY = {
    "runtime": [Runtime("cudaGraphLaunch_v10000", "10:1", 1010, 1020, 50)],
    "kernels": [Kernel("k_a", 10, 7, 1030, 1040, 50, graph_node_id=11),
                Kernel("k_b", 10, 7, 1041, 1060, 50, graph_node_id=12),
                Kernel("k_c", 10, 7, 1061, 1070, 50, graph_node_id=13)],
}


def test_c03_graph_replay_attributed_through_capture_time_nodes(tmp_path):
    nodes = [GraphNode("10:1", 150, 160, 1), GraphNode("10:1", 250, 260, 2), GraphNode("10:1", 350, 360, 3),
             # cudaGraphInstantiate clones the captured nodes; replayed kernels carry the clones' ids.
             GraphNode("10:1", 500, 501, 11, 1), GraphNode("10:1", 500, 501, 12, 2), GraphNode("10:1", 500, 501, 13, 3)]
    timeline, att = run(tmp_path, nvtx=CAPTURE_NVTX, graph_nodes=nodes, **REPLAY)
    k = by_name(att)
    assert {n: k[n]["operator"] for n in ("k_a", "k_b", "k_c")} == {"k_a": "aten::mm", "k_b": "aten::add",
                                                                      "k_c": "aten::relu"}
    kernels = timeline.kernels.set_index("name")
    assert set(kernels["launch_api"]) == {"cudaGraphLaunch_v10000"}
    assert kernels["correlation_id"].tolist() == [50, 50, 50]  # no duplicate-id error
    assert (timeline.launches["correlation_id"] == 50).sum() == 1  # one launch for three kernels


def test_c03_graph_replay_without_node_events_is_unattributed(tmp_path):
    timeline, att = run(tmp_path, nvtx=CAPTURE_NVTX, **REPLAY)
    assert set(att["reason"]) == {"cuda_graph_replay"} and set(att["path"]) == {"unattributed"}
    assert evidence(by_name(att)["k_a"])["stack"] == ["model_step"]  # the launch context stays visible
    assert any("no graph node events" in w for w in timeline.diagnostics["warnings"])
    assert agg.coverage(att, counters_collected=False)["unattributed"][0]["reason"] == "cuda_graph_replay"


def test_c03_graph_level_trace_is_one_row_per_graph_launch(tmp_path):
    timeline, att = run(tmp_path, nvtx=CAPTURE_NVTX, runtime=REPLAY["runtime"],
                        graph_trace=[GraphTrace(10, 7, 1030, 1070, 50, graph_id=3)])
    assert timeline.kernels["name"].tolist() == ["<cuda_graph 3>"]
    assert timeline.kernels["activity"].tolist() == ["graph"]
    assert int(timeline.kernels["duration_ns"].iloc[0]) == 40
    assert att["reason"].tolist() == ["cuda_graph_replay"]
    warning = next(w for w in timeline.diagnostics["warnings"] if "graph granularity" in w)
    assert "graph 3" in warning and "--cuda-graph-trace=node" in warning


# C05 --------------------------------------------------------------------------------------------


def test_c05_null_and_dangling_correlation_ids_are_never_join_keys(tmp_path):
    _, att = run(
        tmp_path,
        nvtx=[Nvtx("aten::add", 59, "10:1", 2190, 2210)],
        runtime=[Runtime("cudaLaunchKernel_v7000", "10:1", 2195, 2197, 285),
                 # A launch row with id 0 must not catch the id-0 NCCL kernels.
                 Runtime("cudaLaunchKernel_v7000", "10:1", 2195, 2197, 0)],
        kernels=[Kernel("nccl_a", 10, 20, 500, 900, 0), Kernel("nccl_b", 10, 20, 1500, 1900, 0),
                 Kernel("multi_tensor_apply_kernel", 10, 7, 2000, 2050, 284),
                 Kernel("copy_kernel", 10, 7, 2100, 2110, -1), Kernel("add_kernel", 10, 7, 2200, 2210, 285)],
    )
    k = by_name(att)
    assert k["add_kernel"]["operator"] == "aten::add"
    assert [k[n]["reason"] for n in ("nccl_a", "nccl_b", "copy_kernel")] == ["null_correlation"] * 3
    assert k["multi_tensor_apply_kernel"]["reason"] == "no_launch_record"
    cov = agg.coverage(att, counters_collected=False)
    assert (cov["attributed_count"], cov["kernel_count"], cov["kernel_time_ns"]) == (1, 5, 870)
    assert cov["attributed_time_ns"] == 10


# C06 --------------------------------------------------------------------------------------------


def test_c06_every_launch_api_joins_by_correlation(tmp_path):
    launches = [launch("sm90_xmma_gemm_bf16", "10:1", 10, 101, api="cudaLaunchKernelExC_v11060"),
                launch("triton_poi_fused_relu_0", "10:1", 65, 102, api="cuLaunchKernel", event_class=1),
                launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "10:1", 95, 103, api="cuLaunchKernelEx",
                       event_class=1, stream=20),
                launch("neg_kernel", "10:1", 132, 104, api="cudaLaunchKernel_v99")]
    backtrace = Runtime("cudaLaunchKernel", "10:1", 10, 15, 101, event_class=67)  # CUDA backtrace duplicate
    timeline, att = run(
        tmp_path,
        nvtx=[Nvtx("aten::addmm", 59, "10:1", 0, 50), Nvtx("triton_poi_fused_relu_0", 59, "10:1", 60, 80),
              Nvtx("c10d::allreduce_", 59, "10:1", 90, 120), Nvtx("aten::neg", 59, "10:1", 130, 140)],
        runtime=[r for r, _ in launches] + [backtrace], kernels=[k for _, k in launches],
    )
    k = by_name(att)
    assert [k[kern.name]["operator"] for _, kern in launches] == [
        "aten::addmm", "triton_poi_fused_relu_0", "c10d::allreduce_", "aten::neg"]
    assert timeline.diagnostics["launch_apis"] == {"cudaLaunchKernelExC_v11060": 1, "cuLaunchKernel": 1,
                                                   "cuLaunchKernelEx": 1, "cudaLaunchKernel_v99": 1}
    assert len(timeline.launches) == 4  # the backtrace row is not a launch


# C08 --------------------------------------------------------------------------------------------

GEMM = {"runtime": [Runtime("cudaLaunchKernel_v7000", "10:1", 150, 155, 1)], "kernels": [Kernel("gemm", 10, 7, 170, 190, 1)]}


def test_c08_version_suffixed_nvtx_table_with_registered_strings(tmp_path):
    timeline, att = run(tmp_path, nvtx=[Nvtx("aten::mm", 59, "10:1", 100, 200, registered=True)],
                        nvtx_table="NVTX_EVENTS_V2", **GEMM)
    assert att["operator"].tolist() == ["aten::mm"]
    assert timeline.diagnostics["nvtx_table"] == "NVTX_EVENTS_V2"
    assert timeline.diagnostics["schema_version"] == "3.17.1"


def test_c08_export_without_nvtx_table_still_gives_every_other_output(tmp_path):
    db = write_nsys_export(tmp_path / "report.sqlite", nvtx_table=None, **GEMM)
    out = tmp_path / "timeline"
    result = subprocess.run([sys.executable, "-m", "operator_profiler.cli", "timeline", "--nsys", str(db), "--out",
                             str(out)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "export has no NVTX table; NVTX attribution skipped" in result.stderr
    result = subprocess.run([sys.executable, "-m", "operator_profiler.cli", "attribute", "--timeline", str(out),
                             "--out", str(tmp_path / "a.parquet")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    att = tables.read_table(tmp_path / "a.parquet")
    assert att["name"].tolist() == ["gemm"] and att["reason"].tolist() == ["no_nvtx_ranges"]
    assert int(tables.read_table(out / "kernels.parquet")["duration_ns"].sum()) == 20


def test_c08_text_column_only(tmp_path):
    _, att = run(tmp_path, nvtx=[Nvtx("aten::mm", 59, "10:1", 100, 200)], nvtx_text_columns=("text",), **GEMM)
    assert att["operator"].tolist() == ["aten::mm"]


# C09 --------------------------------------------------------------------------------------------

C09_NVTX = [Nvtx("fwd", 59, "10:1", 100, 500), Nvtx("step", 60, "10:1", 50, 900, end_thread="10:2"),
            Nvtx("phaseB", 60, "10:1", 400, 800)]
C09_LAUNCHES = {"runtime": [Runtime("cudaLaunchKernel_v7000", "10:1", 450, 455, 1),
                            Runtime("cudaLaunchKernel_v7000", "10:3", 600, 605, 2)],
                "kernels": [Kernel("k1", 10, 7, 460, 470, 1), Kernel("k2", 10, 7, 610, 620, 2)]}


def test_c09_start_end_ranges_are_process_regions_not_thread_stacks(tmp_path):
    timeline, att = run(tmp_path, nvtx=C09_NVTX, **C09_LAUNCHES)
    k = by_name(att)
    assert k["k1"]["operator"] == "fwd" and list(k["k1"]["regions"]) == ["step", "phaseB"]
    assert k["k2"]["path"] == "unattributed" and k["k2"]["reason"] == "no_enclosing_range"
    assert list(k["k2"]["regions"]) == ["step", "phaseB"]
    ranges = timeline.ranges.set_index("name")
    assert ranges.loc["step", "kind"] == "nvtx_start_end" and int(ranges.loc["step", "end_tid"]) == 2
    # The GPU projection counts a region's kernels from every thread of the process.
    projection = tables.read_table(tmp_path / "timeline" / "nvtx_gpu_projection.parquet").set_index("name")
    assert int(projection.loc["step", "kernel_count"]) == 2 and int(projection.loc["fwd", "kernel_count"]) == 1
    assert (int(projection.loc["step", "gpu_start_ns"]), int(projection.loc["step", "gpu_end_ns"])) == (460, 620)
    assert pd.isna(ranges.loc["step", "parent_id"]) and pd.isna(ranges.loc["fwd", "parent_id"])


def test_c09_only_start_end_ranges_says_so(tmp_path):
    timeline, att = run(tmp_path, nvtx=C09_NVTX[1:], **C09_LAUNCHES)
    assert "only start/end ranges present: used as process-level regions; operator-level NVTX attribution " \
           "unavailable" in timeline.diagnostics["warnings"]
    assert set(att["reason"]) == {"no_nvtx_ranges"}
    assert list(by_name(att)["k2"]["regions"]) == ["step", "phaseB"]


# C10 --------------------------------------------------------------------------------------------


def test_c10_unclosed_and_inverted_ranges(tmp_path):
    end_of_capture = Runtime("cudaDeviceSynchronize_v3020", "10:1", 9990, 10_000, None)
    launches = [launch("K1", "10:1", 250, 1), launch("K2", "10:1", 700, 2), launch("K3", "10:1", 5200, 3)]
    timeline, att = run(
        tmp_path,
        nvtx=[Nvtx("outer", 59, "10:1", 100, None), Nvtx("inner", 59, "10:1", 200, 300),
              Nvtx("late", 59, "10:1", 5000, 5500), Nvtx("bad", 59, "10:1", 7000, 6900)],
        runtime=[r for r, _ in launches] + [end_of_capture], kernels=[k for _, k in launches],
    )
    ranges = timeline.ranges.set_index("name")
    assert "bad" not in ranges.index
    assert bool(ranges.loc["outer", "unclosed"]) and pd.isna(ranges.loc["outer", "end_ns"])
    assert int(ranges.loc["outer", "effective_end_ns"]) == 10_000
    warnings = timeline.diagnostics["warnings"]
    assert any(w.startswith("1 NVTX range(s) left open at end of capture: 'outer'") for w in warnings)
    assert any("end before they start and were dropped: 'bad'" in w for w in warnings)
    k = by_name(att)
    assert (k["K1"]["operator"], evidence(k["K1"])["stack"]) == ("inner", ["outer", "inner"])
    assert (k["K2"]["operator"], k["K2"]["reason"]) == ("outer", "unclosed_range")  # low confidence
    assert (k["K3"]["operator"], evidence(k["K3"])["stack"]) == ("late", ["outer", "late"])
    assert (att["duration_ns"] > 0).all()


# C11 --------------------------------------------------------------------------------------------


def test_c11_other_domains_are_tags_not_operators(tmp_path):
    export = {"domains": {(10, 7): "deepspeed"},
              "nvtx": [Nvtx("aten::linear", 59, "10:1", 100, 400), Nvtx("allreduce_hook", 59, "10:1", 150, 350, domain=7)],
              "runtime": [Runtime("cudaLaunchKernel_v7000", "10:1", 200, 205, 1)],
              "kernels": [Kernel("gemm", 10, 7, 210, 260, 1)]}
    timeline, att = run(tmp_path, **export)
    gemm = by_name(att)["gemm"]
    assert gemm["operator"] == "aten::linear"  # a domain-blind tree would pick allreduce_hook
    assert evidence(gemm)["tags"] == {"deepspeed": "allreduce_hook"}
    assert timeline.ranges.set_index("name").loc["allreduce_hook", "domain"] == "deepspeed"
    # The operator domain is configurable.
    (tmp_path / "b").mkdir()
    _, att = run(tmp_path / "b", NvtxOptions(operator_domains=("deepspeed",)), **export)
    assert att["operator"].tolist() == ["allreduce_hook"]



def test_c11_tags_of_several_domains_per_kernel_some_none(tmp_path):
    # The tags are joined in Arrow; pyarrow's null-skipping join drops the rows whose pieces
    # are all null, so each kernel's tags are checked here: both domains, one, none.
    export = {"domains": {(10, 7): "deepspeed", (10, 8): "nccl"},
              "nvtx": [Nvtx("aten::linear", 59, "10:1", 100, 900), Nvtx("hook", 59, "10:1", 150, 350, domain=7),
                       Nvtx("ring", 59, "10:1", 180, 650, domain=8)],
              "runtime": [Runtime("cudaLaunchKernel_v7000", "10:1", t, t + 5, c) for c, t in
                          ((1, 200), (2, 500), (3, 800))],
              "kernels": [Kernel(name, 10, 7, t + 10, t + 50, c) for c, t, name in
                          ((1, 200, "both"), (2, 500, "nccl_only"), (3, 800, "untagged"))]}
    _, att = run(tmp_path, **export)
    k = by_name(att)
    assert len(att) == 3
    assert evidence(k["both"])["tags"] == {"deepspeed": "hook", "nccl": "ring"}
    assert evidence(k["nccl_only"])["tags"] == {"nccl": "ring"}
    assert "tags" not in evidence(k["untagged"])
    assert [k[n]["operator"] for n in ("both", "nccl_only", "untagged")] == ["aten::linear"] * 3

# C12 --------------------------------------------------------------------------------------------


def c12(backward_text: str):
    return {
        "nvtx": [Nvtx("aten::addmm, seq = 12", 59, "10:1", 100, 200), Nvtx(backward_text, 59, "10:2", 1000, 1200),
                 Nvtx("aten::mm, seq = 0, sizes = [[64, 128], [128, 256]]", 59, "10:2", 1010, 1090)],
        **rows(launch("k_fwd", "10:1", 150, 1), launch("k_bwd", "10:2", 1050, 2)),
    }


def test_c12_emit_nvtx_decorations_are_parsed(tmp_path):
    timeline, att = run(tmp_path, **c12("AddmmBackward0, seq = 40"))
    ranges = timeline.ranges.set_index("name")
    assert int(ranges.loc["aten::addmm", "seq"]) == 12 and int(ranges.loc["AddmmBackward0", "seq"]) == 40
    assert ranges.loc["aten::mm", "sizes"] == "[[64, 128], [128, 256]]"
    assert int(ranges.loc["aten::mm", "seq"]) == 0 and "text" not in ranges  # (the raw text: parsed, not kept)
    k = by_name(att)
    assert k["k_fwd"]["operator"] == "aten::addmm"
    assert k["k_bwd"]["operator"] == "aten::mm" and evidence(k["k_bwd"])["stack"] == ["AddmmBackward0", "aten::mm"]
    assert pd.isna(k["k_bwd"]["forward_operator"])
    assert "no stashed-seq marker" in evidence(k["k_bwd"])["forward_link"]


def test_c12_stashed_seq_links_backward_to_forward(tmp_path):
    _, att = run(tmp_path, **c12("AddmmBackward0, stashed seq = 12"))
    assert by_name(att)["k_bwd"]["forward_operator"] == "aten::addmm"


def test_c12_one_operator_row_for_a_thousand_decorated_invocations(tmp_path):
    launches = [launch(f"k{i}", "10:1", 1000 * i + 10, i + 1) for i in range(1000)]
    nvtx = [Nvtx(f"aten::addmm, seq = {i}, op_id = {i + 5}", 59, "10:1", 1000 * i, 1000 * i + 500) for i in range(1000)]
    _, att = run(tmp_path, nvtx=nvtx, **rows(*launches))
    ops = agg.operators_table(att, per_iteration=False)
    assert ops["operator"].tolist() == ["aten::addmm"]
    assert (int(ops["calls"].iloc[0]), int(ops["kernels"].iloc[0])) == (1000, 1000)


# C13 --------------------------------------------------------------------------------------------


def test_c13_kernels_outside_every_range_stay_visible(tmp_path):
    launches = [launch("gemm", "10:1", 150, 1, dur=40), launch("DeviceCompactInitKernel", "10:1", 300, 2, dur=3),
                launch("DeviceSelectSweepKernel", "10:1", 310, 3, dur=7)]
    _, att = run(tmp_path, nvtx=[Nvtx("forward", 59, "10:1", 100, 200)], **rows(*launches))
    k = by_name(att)
    assert k["gemm"]["operator"] == "forward"
    assert [k[n]["reason"] for n in ("DeviceCompactInitKernel", "DeviceSelectSweepKernel")] == ["no_enclosing_range"] * 2
    cov = agg.coverage(att, counters_collected=False)
    assert (cov["attributed_count"], cov["kernel_count"]) == (1, 3)
    assert (cov["attributed_time_ns"], cov["kernel_time_ns"]) == (40, 50)
    assert {u["name"] for u in cov["unattributed"]} == {"DeviceCompactInitKernel", "DeviceSelectSweepKernel"}


# C17 --------------------------------------------------------------------------------------------


def test_c17_kernel_starting_before_its_launch_is_attributed_and_reported(tmp_path):
    timeline, att = run(
        tmp_path,
        nvtx=[Nvtx("c10d::alltoall_base", 59, "10:1", 1_000_000, 1_050_000),
              Nvtx("record_param_comms", 59, "10:1", 1_000_300, 1_049_300)],
        runtime=[Runtime("cuLaunchKernelEx", "10:1", 1_040_000, 1_046_000, 300, event_class=1)],
        kernels=[Kernel("ncclDevKernel_SendRecv", 10, 20, 1_038_000, 1_068_000, 300)],
    )
    row = by_name(att)["ncclDevKernel_SendRecv"]
    assert row["operator"] == "record_param_comms"
    assert evidence(row)["stack"] == ["c10d::alltoall_base", "record_param_comms"]
    assert any(i.startswith("1 kernel(s) start before their launch call begins (by up to 2.0 µs; clock skew)")
               for i in timeline.diagnostics["info"])


def test_c17_kineto_child_op_starting_before_its_parent(tmp_path):
    """The case's Kineto fixture: record_param_comms starts 0.3 µs before its parent op.

    The skew must not break the nesting: record_param_comms stays the child of c10d::alltoall_base
    and the kernel's stack is both. Path (a) names the innermost *dispatcher* op (``ns::name``,
    DESIGN.md §3), so the operator is c10d::alltoall_base; record_param_comms (a record_function
    marker without a namespace) is the innermost range of the stack, as the case expects.
    """
    trace = {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "c10d::alltoall_base", "pid": 1, "tid": 1, "ts": 1000.0, "dur": 50.0,
         "args": {"External id": 9}},
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 999.7, "dur": 49.3,
         "args": {"External id": 10}},
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernelEx", "pid": 1, "tid": 1, "ts": 1040.0, "dur": 6.0,
         "args": {"correlation": 300, "External id": 10}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv", "pid": 0, "tid": 20, "ts": 1044.0, "dur": 30.0,
         "args": {"correlation": 300, "device": 0, "stream": 20}},
    ]}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    stages.export_timeline(path, tmp_path / "timeline")
    att = stages.attribute_files(tmp_path / "timeline", None, None, tmp_path / "a.parquet")
    row = att.iloc[0]
    assert row["operator"] == "c10d::alltoall_base"
    assert json.loads(row["evidence"])["correlation"]["stack"] == ["c10d::alltoall_base", "record_param_comms"]
    ranges = kineto.read_kineto(path).ranges.set_index("name")
    assert int(ranges.loc["record_param_comms", "parent_id"]) == int(ranges.loc["c10d::alltoall_base", "range_id"])


# C22 --------------------------------------------------------------------------------------------


def test_c22_processes_keep_their_own_correlation_ids_and_ranges(tmp_path):
    export = {"nvtx": [], "runtime": [], "kernels": []}
    for pid, device in ((111, 0), (222, 1)):
        export["nvtx"].append(Nvtx("aten::mm", 59, f"{pid}:1", 100, 300))
        export["runtime"].append(Runtime("cudaLaunchKernel", f"{pid}:1", 200, 205, 5))
        export["kernels"].append(Kernel("gemm", pid, 7, 250, 350 + pid, 5, device=device))
    export["nvtx"].append(Nvtx("worker_fetch", 59, "333:1", 0, 1000))
    timeline, att = run(tmp_path, **export)
    kernels = timeline.kernels.set_index("pid")
    assert kernels.loc[111, "launch_tid"] == 1 and kernels.loc[222, "launch_tid"] == 1
    assert att["operator"].tolist() == ["aten::mm", "aten::mm"]
    ranges = timeline.ranges
    for kid, pid in zip(timeline.kernels["kernel_id"], timeline.kernels["pid"]):
        op_range = int(att.set_index("kernel_id").loc[kid, "operator_range_id"])
        assert int(ranges.set_index("range_id").loc[op_range, "pid"]) == pid  # its own process's aten::mm
    assert timeline.kernels["occurrence"].tolist() == [0, 0]  # ncu matching is per (process, name) order
    assert timeline.diagnostics["per_process"]["333"]["kernels"] == 0
    assert "no GPU activity captured for pid 333" in timeline.diagnostics["info"]


# Devices (docs/formats.md#nsys-identifiers): KERNEL.deviceId is the CUDA ordinal, not the nsys GPU id ----------------


def test_cuda_ordinal_maps_to_the_nsys_gpu_id_per_process(tmp_path):
    """A 4-GPU node where ordinal 0 is nsys GPU 3 (TARGET_INFO_GPU.cuDevice) and, for pid 10,
    TARGET_INFO_CUDA_DEVICE says ordinal 0 is GPU 2 (CUDA_VISIBLE_DEVICES differs per process)."""
    timeline, _ = run(
        tmp_path,
        devices=[{"id": 3, "cuDevice": 0, "name": "A100-a"}, {"id": 0, "cuDevice": 3, "name": "A100-b"},
                 {"id": 2, "cuDevice": 2, "name": "A100-c"}, {"cuda_device_map": [(2, 0, 10)]}],
        runtime=[Runtime("cudaLaunchKernel_v7000", "10:1", 100, 105, 1), Runtime("cudaLaunchKernel_v7000", "11:1", 100, 105, 1),
                 Runtime("cudaLaunchKernel_v7000", "11:1", 200, 205, 2)],
        kernels=[Kernel("k10", 10, 7, 120, 130, 1, device=0), Kernel("k11", 11, 7, 120, 130, 1, device=0),
                 Kernel("k11b", 11, 7, 220, 230, 2, device=3)],
    )
    k = timeline.kernels.set_index("name")
    assert k["device"].to_dict() == {"k10": 0, "k11": 0, "k11b": 3}  # the CUDA ordinal, as the contract says
    assert k["gpu_id"].to_dict() == {"k10": 2, "k11": 3, "k11b": 0}
    assert {d["name"] for d in timeline.diagnostics["devices"]} == {"A100-a", "A100-b", "A100-c"}


# Bugs found in review, each reproduced first ----------------------------------------------------


def test_graph_node_ids_are_per_process(tmp_path):
    _, att = run(
        tmp_path,
        nvtx=[Nvtx("aten::mm", 59, "111:1", 100, 200), Nvtx("aten::relu", 59, "222:1", 100, 200)],
        graph_nodes=[GraphNode("111:1", 150, 160, 1), GraphNode("222:1", 150, 160, 1)],
        runtime=[Runtime("cudaGraphLaunch", "111:1", 1000, 1010, 50), Runtime("cudaGraphLaunch", "222:1", 1000, 1010, 50)],
        kernels=[Kernel("k_111", 111, 7, 1030, 1040, 50, graph_node_id=1),
                 Kernel("k_222", 222, 7, 1030, 1040, 50, graph_node_id=1)],
    )
    assert {k: row["operator"] for k, row in by_name(att).items()} == {"k_111": "aten::mm", "k_222": "aten::relu"}


def test_graph_clone_without_its_original_is_a_replay(tmp_path):
    timeline, att = run(tmp_path, nvtx=[Nvtx("cudagraph_instantiate", 59, "10:1", 400, 600)],
                        graph_nodes=[GraphNode("10:1", 500, 501, 11, original_graph_node_id=1)],
                        runtime=[Runtime("cudaGraphLaunch", "10:1", 1000, 1010, 50)],
                        kernels=[Kernel("k_a", 10, 7, 1030, 1040, 50, graph_node_id=11)])
    assert att["reason"].tolist() == ["cuda_graph_replay"]
    assert any("no capture-time node event" in w for w in timeline.diagnostics["warnings"])


def test_graph_kernels_regions_and_iteration_are_the_replays(tmp_path):
    """Operator from the capture; regions, iteration and GPU projection from the cudaGraphLaunch."""
    _, att = run(
        tmp_path,
        domains={(10, 1): "opprof"},
        nvtx=[Nvtx("warmup", 60, "10:1", 0, 500), Nvtx("aten::mm", 59, "10:1", 100, 200),
              Nvtx("opprof.iteration:3", 59, "10:1", 900, 9000, domain=1), Nvtx("step 3", 60, "10:1", 900, 9000)],
        graph_nodes=[GraphNode("10:1", 150, 160, 1), GraphNode("10:1", 300, 301, 11, original_graph_node_id=1)],
        runtime=[Runtime("cudaGraphLaunch", "10:1", 1000, 1010, 50)],
        kernels=[Kernel("k_a", 10, 7, 1030, 1040, 50, graph_node_id=11)],
    )
    row = by_name(att)["k_a"]
    assert (row["operator"], int(row["iteration"]), list(row["regions"])) == ("aten::mm", 3, ["step 3"])
    projection = tables.read_table(tmp_path / "timeline" / "nvtx_gpu_projection.parquet").set_index("name")
    assert "step 3" in projection.index and "warmup" not in projection.index


def test_backward_ops_own_sequence_numbers_do_not_link_to_themselves(tmp_path):
    """Sequence numbers are per thread: an op run by the autograd thread may carry the same number as
    the forward op that created the backward node; the link goes to the forward op."""
    _, att = run(
        tmp_path,
        domains={(10, 1): "opprof"},
        nvtx=[Nvtx("opprof.layer:h.0", 59, "10:1", 50, 300, domain=1), Nvtx("aten::addmm, seq = 0", 59, "10:1", 100, 200),
              Nvtx("AddmmBackward0, seq = 0", 59, "10:2", 1000, 1200), Nvtx("aten::mm, seq = 0", 59, "10:2", 1010, 1090)],
        **rows(launch("k_fwd", "10:1", 150, 1), launch("k_bwd", "10:2", 1050, 2)),
    )
    k = by_name(att)["k_bwd"]
    assert (k["operator"], k["forward_operator"], k["layer"]) == ("aten::mm", "aten::addmm", "h.0")


def test_iterations_of_overlapping_ranks_and_an_open_last_iteration(tmp_path):
    _, att = run(
        tmp_path,
        domains={(111, 1): "opprof", (222, 1): "opprof"},
        nvtx=[Nvtx("opprof.iteration:0", 59, "111:1", 0, 1000, domain=1),
              Nvtx("opprof.iteration:0", 59, "222:1", 10, 1000, domain=1),
              Nvtx("opprof.iteration:1", 59, "111:1", 2000, None, domain=1)],
        **rows(launch("k111", "111:1", 100, 1), launch("k222", "222:1", 100, 1), launch("k111_late", "111:1", 2500, 2)),
    )
    assert {k: int(r["iteration"]) for k, r in by_name(att).items()} == {"k111": 0, "k222": 0, "k111_late": 1}


def test_large_pids_and_any_row_order_of_the_ranges_table(tmp_path):
    from operator_profiler.attribution.nvtx import attribute_nvtx

    big = 2**24 - 5  # pids are 24-bit in globalTid
    timeline, att = run(tmp_path, nvtx=[Nvtx("outer", 59, f"{big}:1", 100, 300), Nvtx("aten::mm", 59, f"{big}:1", 100, 200)],
                        **rows(launch("k", f"{big}:1", 150, 1)))
    assert att["operator"].tolist() == ["aten::mm"]
    kl = pd.DataFrame({"kernel_id": timeline.kernels["kernel_id"], "layer": None, "module": None, "layer_class": "rest"})
    reversed_table = timeline.ranges.iloc[::-1].reset_index(drop=True)
    assert attribute_nvtx(timeline.kernels, reversed_table, kl)["operator"].tolist() == ["aten::mm"]


def test_c12_backward_links_by_exact_sequence_numbers_above_2_53(tmp_path):
    """Sequence numbers beyond 2**53 are compared as integers: 2**53 and 2**53 + 1 are two forward ops (as
    floats both are 2**53, and the backward range was linked to the wrong one)."""
    big = 2**53
    export = {
        "nvtx": [Nvtx(f"aten::addmm, seq = {big + 1}", 59, "10:1", 100, 200),
                 Nvtx(f"aten::mul, seq = {big}", 59, "10:1", 300, 400),
                 Nvtx(f"AddmmBackward0, seq = {big + 1}", 59, "10:2", 1000, 1200),
                 Nvtx("aten::mm", 59, "10:2", 1010, 1090)],
        **rows(launch("k_fwd", "10:1", 150, 1), launch("k_mul", "10:1", 350, 2), launch("k_bwd", "10:2", 1050, 3)),
    }
    _, att = run(tmp_path, **export)
    row = by_name(att)["k_bwd"]
    assert row["forward_operator"] == "aten::addmm"
    assert evidence(row)["backward_seq"] == big + 1
