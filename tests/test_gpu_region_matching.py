"""Path (c) on a GPU Kineto timeline: a compiled-graph region whose ``call()`` runs a Triton kernel and
an extern GEMM. The GEMM's GPU kernel is a cuBLAS kernel, not ``aten::mm``, so the region must be
matched to the graph by its *calls* (the extern op enclosing the cuBLAS launch), not by kernel names.
Synthetic trace in the real Kineto layout (docs/formats.md#kineto-events, #inductor-kernels-in-kineto); no GPU needed.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from operator_profiler import aggregate as agg
from operator_profiler.attribution.merge import attribute
from operator_profiler.layers import classify_layers
from operator_profiler.timeline.kineto import read_kineto

GEMM = "sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x32"


def cpu(name, ts, dur, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": 1, "ts": ts, "dur": dur, "args": {}}


def launch(api, ts, corr, cat="cuda_runtime"):
    return {**cpu(api, ts, 2, cat=cat), "args": {"correlation": corr}}


def kernel(name, ts, corr):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": 5,
            "args": {"correlation": corr, "device": 0, "stream": 7, "grid": [1, 1, 1], "block": [128, 1, 1]}}


def fusion_row(index, kernel_name, kind, profiler_name, ops, gpu_symbol=None):
    return {"graph": "model__0_inference_0.0", "call_index": index, "kernel": kernel_name, "kind": kind,
            "profiler_name": profiler_name, "gpu_symbol": gpu_symbol, "debug_handle": None, "fused_ops": ops,
            "source_nodes": [ops[0].split("::")[1]], "post_grad_nodes": [], "origin": "source_nodes_comment"}


FUSION_MAP = pd.DataFrame([
    fusion_row(0, "triton_poi_fused_add_0", "triton", "triton_poi_fused_add_0", ["aten::add"], "triton_"),
    fusion_row(1, "extern_kernels.addmm", "extern", "aten::addmm", ["aten::addmm"]),
    fusion_row(2, "triton_poi_fused_add_0", "triton", "triton_poi_fused_add_0", ["aten::add"], "triton_"),
])


@pytest.fixture
def attribution(tmp_path):
    events = [
        cpu("opprof.iteration:0", 0, 300, cat="user_annotation"),
        cpu("## Call CompiledFxGraph abc ##", 10, 200, cat="user_annotation"),
        # Triton launch with the generic device name of torch <= 2.5: named by its CPU-side event
        cpu("triton_poi_fused_add_0", 12, 5), launch("cuLaunchKernel", 13, 1, cat="cuda_driver"),
        # extern addmm: one op, two library kernels (GEMM + split-K reduction)
        cpu("aten::addmm", 30, 40), launch("cudaLaunchKernel", 35, 2), launch("cudaLaunchKernel", 50, 3),
        cpu("triton_poi_fused_add_0", 80, 5), launch("cuLaunchKernel", 81, 4, cat="cuda_driver"),
        kernel("triton_", 20, 1), kernel(GEMM, 40, 2), kernel("splitKreduce_kernel", 55, 3), kernel("triton_", 90, 4),
    ]
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"traceEvents": events}))
    timeline = read_kineto(path)
    kernel_layers, _, _ = classify_layers(timeline.kernels, timeline.ranges, [])
    return attribute(timeline.kernels, timeline.ranges, kernel_layers, FUSION_MAP)


def test_region_with_an_extern_gemm_matches_its_graph(attribution):
    a = attribution
    by_name = a.groupby("name")
    assert (a["path"] != "unattributed").all(), a[["name", "path", "reason"]]
    triton = by_name.get_group("triton_")
    assert (triton["path"] == "inductor").all() and (triton["operator"] == "aten::add").all()
    assert [json.loads(e)["inductor"]["call_index"] for e in triton["evidence"]] == [0, 2]
    for name in (GEMM, "splitKreduce_kernel"):
        row = by_name.get_group(name).iloc[0]
        assert row["operator"] == "aten::addmm" and row["path"] == "correlation"
        assert json.loads(row["evidence"])["inductor"]["call_index"] == 1
        assert list(row["source_nodes"]) == ["addmm"]


def test_paths_agree_on_the_extern_call(attribution):
    coverage = agg.coverage(attribution, counters_collected=True)
    # one extern call: its first kernel is the call site and agrees; the reduction kernel is the
    # same call's second kernel and is not counted twice
    assert coverage["path_agreement"] == {"correlation/inductor": 1.0}
    assert coverage["coverage_time"] == 1.0
