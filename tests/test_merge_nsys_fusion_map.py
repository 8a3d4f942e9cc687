"""Path (c) on an nsys timeline without a torch.profiler run: the fusion map joined by kernel name
(``merge.merge_fusion_by_name`` over ``inductor.attribute_by_name``), merged with path (b) NVTX.

The nsys export is synthetic (tests/nsys_export.py, the real table layout); the fusion map is written
row by row here as ``load_fusion_map`` would return it for a graph calling
``triton_poi_fused_add_cos_0`` (aten.add, aten.cos), ``extern_kernels.mm`` and ``triton_red_fused_sum_1``.
"""

from __future__ import annotations

import json

import pandas as pd
from nsys_export import Kernel, Nvtx, Runtime, write_nsys_export

from operator_profiler import aggregate as agg
from operator_profiler import stages
from operator_profiler.attribution.inductor import FUSION_MAP_COLUMNS

THREAD = "100:100"


def fusion_map() -> pd.DataFrame:
    rows = [
        ("g__0_inference_0.0", 0, "triton_poi_fused_add_cos_0", "triton", "triton_poi_fused_add_cos_0",
         "triton_poi_fused_add_cos_0", None, ["aten::add", "aten::cos"], ["add", "cos"], [], [], "source_nodes_comment"),
        ("g__0_inference_0.0", 1, "extern_kernels.mm", "extern", "aten::mm", None, None, ["aten::mm"], ["mm"], [], [],
         "extern"),
        ("g__0_inference_0.0", 2, "triton_red_fused_sum_1", "triton", "triton_red_fused_sum_1", "triton_", None,
         ["aten::sum"], ["sum_1"], [], [], "source_nodes_comment"),
    ]
    # the 12 columns of a map written before listed_not_computed/compile_id/cache_key: still accepted
    return pd.DataFrame(rows, columns=FUSION_MAP_COLUMNS[:12])


def test_fused_kernels_take_the_fusion_map_ops_and_nvtx_keeps_the_rest(tmp_path):
    # One compiled-graph execution under an NVTX range of the default domain (emit_nvtx would name it
    # after the record function); the GEMM is launched inside an aten::mm range.
    nvtx = [Nvtx("CompiledFunction", 59, THREAD, 1_000, 90_000), Nvtx("aten::mm", 59, THREAD, 20_000, 30_000)]
    runtime = [Runtime("cuLaunchKernel", THREAD, 10_000, 10_500, 1, event_class=1),
               Runtime("cudaLaunchKernel_v7000", THREAD, 21_000, 21_500, 2),
               Runtime("cuLaunchKernel", THREAD, 40_000, 40_500, 3, event_class=1)]
    kernels = [Kernel("triton_poi_fused_add_cos_0_0d1d2de", 100, 7, 11_000, 12_000, 1),  # Triton 2.x suffix (C20 a)
               Kernel("ampere_sgemm_32x32_sliced1x4_tn", 100, 7, 22_000, 25_000, 2),
               Kernel("triton_", 100, 7, 41_000, 41_500, 3)]  # generic device name, no CPU-side event (C20 b')
    export = write_nsys_export(tmp_path / "run.sqlite", nvtx=nvtx, runtime=runtime, kernels=kernels)
    stages.export_timeline(export, tmp_path / "timeline")
    a = stages.attribute_files(tmp_path / "timeline", None, fusion_map(), tmp_path / "attribution.parquet")
    by = a.set_index("name")

    fused = by.loc["triton_poi_fused_add_cos_0_0d1d2de"]
    assert fused["operator"] == "aten::add+aten::cos" and fused["path"] == "inductor"
    assert list(fused["fused_ops"]) == ["aten::add", "aten::cos"] and list(fused["source_nodes"]) == ["add", "cos"]
    evidence = json.loads(fused["evidence"])
    assert evidence["nvtx"]["operator"] == "CompiledFunction"  # what NVTX alone would have said
    assert evidence["inductor"]["call_index"] == 0 and evidence["inductor"]["joined_by"] == "kernel_name:unique_call_site"

    gemm = by.loc["ampere_sgemm_32x32_sliced1x4_tn"]
    assert gemm["operator"] == "aten::mm" and gemm["path"] == "nvtx"
    assert "inductor" not in json.loads(gemm["evidence"])  # a library kernel is not looked up by name

    generic = by.loc["triton_"]
    assert generic["path"] == "nvtx" and generic["operator"] == "CompiledFunction"
    assert json.loads(generic["evidence"])["inductor"] == {"reason": "ambiguous_generic_kernel_name"}
    assert list(generic["fused_ops"]) == []

    cov = agg.coverage(a, counters_collected=False)
    assert cov["path_coverage"]["inductor"]["count"] == 1 / 3
    assert cov["path_coverage"]["nvtx"]["count"] == 1.0
    assert cov["by_path"] == {"inductor": 1_000 / 4_500, "nvtx": 3_500 / 4_500}
